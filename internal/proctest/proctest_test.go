package proctest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// gone reports whether pid names no live process (none, or a zombie
// waiting for a parent that does not reap).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && (f[0] == "Z" || f[0] == "X")
}

func sleeper(t *testing.T) *Proc {
	t.Helper()
	if _, err := exec.LookPath("sleep"); err != nil {
		Unavailable(t, "no sleep binary: %v", err)
	}
	p, err := Start(exec.Command("sleep", "60"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

// Stop ends the process and returns once it is reaped; its PID is then
// 0, and signals to it do nothing.
func TestStop(t *testing.T) {
	p := sleeper(t)
	pid := p.PID()
	if pid == 0 || gone(pid) {
		t.Fatalf("PID %d of a running process", pid)
	}
	p.Stop(5 * time.Second)
	if !p.Exited() || p.PID() != 0 {
		t.Errorf("after Stop: exited %v, PID %d", p.Exited(), p.PID())
	}
	if !gone(pid) {
		t.Errorf("process %d still runs after Stop", pid)
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Errorf("Signal after the exit: %v", err)
	}
	p.Kill() // does nothing, returns
}

// A process that ignores SIGTERM is killed once the grace has passed.
func TestStopKillsAfterGrace(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		Unavailable(t, "no sh: %v", err)
	}
	p, err := Start(exec.Command("sh", "-c", `trap "" TERM; echo up; sleep 60 & wait`))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	time.Sleep(100 * time.Millisecond) // the trap is set
	start := time.Now()
	p.Stop(200 * time.Millisecond)
	if !p.Exited() {
		t.Fatal("not exited after Stop")
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("stopped after %v, before the grace: SIGTERM was not ignored?", d)
	}
}

// WaitReady returns once ready passes, ErrExited when the process exits
// first, and ready's error at the timeout.
func TestWaitReady(t *testing.T) {
	p := sleeper(t)
	n := 0
	if err := WaitReady(p, 5*time.Second, time.Millisecond, func(context.Context) error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || n != 3 {
		t.Errorf("WaitReady: %v after %d calls, want nil after 3", err, n)
	}
	notYet := errors.New("not yet")
	if err := WaitReady(p, 50*time.Millisecond, 0, func(context.Context) error { return notYet }); !errors.Is(err, notYet) {
		t.Errorf("at the timeout: %v, want ready's error", err)
	}
	q, err := Start(exec.Command("true"))
	if err != nil {
		t.Fatal(err)
	}
	if err := WaitReady(q, 5*time.Second, 0, func(context.Context) error { return notYet }); !errors.Is(err, ErrExited) {
		t.Errorf("after the exit: %v, want ErrExited", err)
	}
}

// The child of a test binary that is killed (SIGKILL: no cleanup runs)
// is killed with it.
func TestParentDeath(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the parent-death signal is Linux's")
	}
	if os.Getenv("PROCTEST_CHILD") == "1" {
		p, err := Start(exec.Command("sleep", "60"))
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(2)
		}
		fmt.Println(p.PID())
		select {}
	}
	if _, err := exec.LookPath("sleep"); err != nil {
		Unavailable(t, "no sleep binary: %v", err)
	}
	parent := exec.Command(os.Args[0], "-test.run=^TestParentDeath$")
	parent.Env = append(os.Environ(), "PROCTEST_CHILD=1")
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	defer parent.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	pid, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil {
		t.Fatalf("the parent said %q: %v %v", line, err, perr)
	}
	if gone(pid) {
		t.Fatalf("the child %d is not running", pid)
	}
	parent.Process.Kill()
	parent.Wait()
	for deadline := time.Now().Add(5 * time.Second); !gone(pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("the child %d outlived its killed parent by 5 s", pid)
		}
	}
}
