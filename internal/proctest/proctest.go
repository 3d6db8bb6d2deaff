// Package proctest starts the servers tests need as child processes and
// stops them by their process id: the one process harness that
// internal/pgtest (PostgreSQL, PgBouncer), internal/redistest, store/mysql's
// MariaDB and bench's MariaDB launcher share.
//
// Start starts a command with a parent-death signal (on Linux the kernel
// sends SIGKILL to the child when the test binary dies without running its
// cleanups: a panic, a test timeout, a SIGKILL), and reaps it when it
// exits; until then its PID is its own, so a signal sent to it reaches it
// and no other process. WaitReady polls until the server answers, or says
// why not; Stop and Kill end it and wait until it has been reaped.
//
// Unavailable is the rule for a test whose server or binary is missing:
// skipped with the reason, or failed when the environment variable CI is
// set non-empty, so that a continuous-integration run cannot pass by
// skipping.
//
// It uses only the standard library.
package proctest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// CI reports whether the environment variable CI is set non-empty: tests
// that cannot run then fail instead of skipping.
func CI() bool { return os.Getenv("CI") != "" }

// Unavailable ends a test that cannot run (its server, or the binary that
// would start one, is missing): it is skipped with the reason, or failed
// with it when CI is set.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if CI() {
		t.Fatalf("%s (CI is set, so this fails rather than skips)", msg)
	}
	t.Skip(msg)
}

// Proc is a child process Start started.
type Proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped
	mu   sync.Mutex
	err  error // what Wait returned
}

// Start starts cmd with the parent-death signal set (cmd.SysProcAttr is
// kept, or made) and reaps it in the background when it exits.
func Start(cmd *exec.Cmd) (*Proc, error) {
	SetParentDeath(cmd)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Cmd returns the command the process runs.
func (p *Proc) Cmd() *exec.Cmd { return p.cmd }

// Done returns a channel closed once the process has exited and been
// reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited (and been reaped).
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err returns what the process's exit was (nil for status 0), once it
// has exited; nil before.
func (p *Proc) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// PID returns the process's id, or 0 once it has exited.
func (p *Proc) PID() int {
	if p.Exited() {
		return 0
	}
	return p.cmd.Process.Pid
}

// Signal sends sig to the process, if it has not exited: until it is
// reaped its PID cannot name another process.
func (p *Proc) Signal(sig syscall.Signal) error {
	if p.Exited() {
		return nil
	}
	return syscall.Kill(p.cmd.Process.Pid, sig)
}

// Kill sends SIGKILL, as a crash would, and waits until the process has
// been reaped. Killing one that has exited does nothing.
func (p *Proc) Kill() {
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM and waits up to grace for the exit, then sends
// SIGKILL; it returns once the process has been reaped.
func (p *Proc) Stop(grace time.Duration) {
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	p.Kill()
}

// ErrExited reports that the process exited while WaitReady waited for it.
var ErrExited = errors.New("proctest: the process exited before it was ready")

// WaitReady calls ready every interval (20 ms when 0) until it returns
// nil, the process exits (ErrExited, wrapped with ready's last error), or
// timeout passes (ready's last error, wrapped). Each call gets a context
// that ends at the timeout.
func WaitReady(p *Proc, timeout, interval time.Duration, ready func(context.Context) error) error {
	if interval <= 0 {
		interval = 20 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%w (%v): %v", ErrExited, p.Err(), err)
		case <-ctx.Done():
			return fmt.Errorf("proctest: not ready within %v: %w", timeout, err)
		case <-time.After(interval):
		}
	}
}
