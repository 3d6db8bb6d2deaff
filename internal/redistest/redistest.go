// Package redistest starts real redis-server processes for tests: a
// standalone server, a Redis Cluster of masters, or a master with a replica
// and a Sentinel. Each process listens on a free loopback port, keeps its
// files in a fresh temporary directory, and is stopped by its PID when the
// test (or, for a cluster started in TestMain, the package) is done. Servers
// keep nothing on disk (--save "" --appendonly no) and a master serves a new
// replica at once (--repl-diskless-sync-delay 0), unless the caller passes
// other settings.
//
// Tests import this package; so does the load driver in bench/, through
// Launch, Do and Info, which need no testing.TB.
//
// Without a redis-server binary on PATH, the functions that take a
// testing.TB skip the test with a message that says so. When the
// environment variable CI is set non-empty they fail it instead, so a
// continuous-integration run cannot pass by skipping.
//
// Typical use:
//
//	addr := redistest.Start(t)
//	rdb := goredis.NewClient(&goredis.Options{Addr: addr})
package redistest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/proctest"
)

// ErrNotInstalled reports that no redis-server binary is on PATH.
var ErrNotInstalled = errors.New("redistest: redis-server not found on PATH (install it, e.g. apt-get install redis-server)")

// startTimeout bounds how long a server may take to answer PING after it is
// started.
const startTimeout = 10 * time.Second

// Start starts a standalone redis-server on a free loopback port for the
// test and returns its address, "127.0.0.1:<port>". The server keeps no
// files (no RDB snapshots, no AOF) and is killed when the test ends. Without
// a redis-server binary the test is skipped, or failed when CI is set.
func Start(t testing.TB) string {
	t.Helper()
	return StartServer(t).Addr
}

// StartServer is Start with extra redis-server arguments, appended after the
// defaults so that they override them (for example "--maxmemory", "2mb"). It
// returns the running Server, which the test may kill, freeze or restart.
func StartServer(t testing.TB, args ...string) *Server {
	t.Helper()
	bin := Require(t)
	s, err := start(bin, "", 0, args)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Launch starts bin (a name looked up on PATH, or a path) as a standalone
// server on a free loopback port, with the same defaults as Start and args
// after them, and returns it once it answers PING. The caller stops it with
// Close. It is for programs; tests use Start or StartServer.
func Launch(bin string, args ...string) (*Server, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("redistest: %s not found: %w", bin, ErrNotInstalled)
	}
	return start(path, "", 0, args)
}

// Require returns the path of the redis-server binary. Without one it skips
// the test, or fails it when the environment variable CI is non-empty.
func Require(t testing.TB) string {
	t.Helper()
	bin, err := binary()
	if err != nil {
		Unavailable(t, err)
	}
	return bin
}

// Unavailable ends a test that cannot get the Redis it needs because of err:
// a skip when err is ErrNotInstalled and CI is empty, a failure otherwise.
// Use it for a server started outside any test, in TestMain.
func Unavailable(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, ErrNotInstalled) {
		proctest.Unavailable(t, "%v", err)
	}
	t.Fatal(err)
}

func binary() (string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", ErrNotInstalled
	}
	return bin, nil
}

// Server is one redis-server process.
type Server struct {
	// Addr is "127.0.0.1:<port>".
	Addr string
	// Port is the port in Addr.
	Port int
	// Dir is the server's working directory; its log is Dir/redis.log.
	Dir string

	bin      string
	args     []string // appended to the defaults
	sentinel string   // sentinel settings; "" for a data server
	ownDir   bool     // Dir was made by start and is removed by Close
	mu       sync.Mutex
	cmd      *exec.Cmd
	done     <-chan struct{} // closed when cmd has exited
	stopped  bool            // frozen with SIGSTOP
}

// start runs bin on a free port (or on port, when non-zero) in dir (or in a
// new temporary directory, when ""), with the default arguments followed by
// args.
func start(bin, dir string, port int, args []string) (*Server, error) {
	s := &Server{bin: bin, args: args}
	if dir == "" {
		d, err := os.MkdirTemp("", "redistest-")
		if err != nil {
			return nil, err
		}
		dir, s.ownDir = d, true
	}
	s.Dir = dir
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		p := port
		if p == 0 {
			if p, err = FreePort(); err != nil {
				break
			}
		}
		if err = s.run(p); err == nil {
			return s, nil
		}
		if port != 0 {
			break
		}
	}
	if s.ownDir {
		os.RemoveAll(dir)
	}
	return nil, err
}

// run starts the process on port and waits until it answers PING.
func (s *Server) run(port int) error {
	s.Port = port
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	args := []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--dir", s.Dir,
		"--save", "",
		"--appendonly", "no",
		"--repl-diskless-sync-delay", "0", // a replica syncs at once
		"--daemonize", "no",
		"--logfile", "redis.log",
	}
	args = append(args, s.args...)
	if s.sentinel != "" {
		// A sentinel reads its settings from a file it may rewrite.
		conf := filepath.Join(s.Dir, "sentinel.conf")
		text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile redis.log\n%s", port, s.Dir, s.sentinel)
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			return err
		}
		args = []string{conf, "--sentinel"}
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.Dir
	pr, err := proctest.Start(cmd) // with the parent-death signal
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.cmd, s.done, s.stopped = cmd, pr.Done(), false
	s.mu.Unlock()
	err = proctest.WaitReady(pr, startTimeout, 0, func(context.Context) error { return ping(s.Addr) })
	switch {
	case errors.Is(err, proctest.ErrExited):
		return fmt.Errorf("redistest: redis-server on port %d exited at start:\n%s", port, s.LogTail())
	case err != nil:
		s.Kill()
		return fmt.Errorf("redistest: redis-server on port %d did not answer PING: %v\n%s", port, err, s.LogTail())
	}
	return nil
}

// PID returns the process id of the running server, or 0 after it exited.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.exited() {
		return 0
	}
	return s.cmd.Process.Pid
}

func (s *Server) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Kill ends the server with SIGKILL, as a crash would, and waits for it to
// exit. Killing a server that is not running does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// Freeze stops the server with SIGSTOP: it keeps its connections open and
// answers nothing until Thaw.
func (s *Server) Freeze() { s.signal(syscall.SIGSTOP, true) }

// Thaw resumes a server stopped by Freeze with SIGCONT.
func (s *Server) Thaw() { s.signal(syscall.SIGCONT, false) }

func (s *Server) signal(sig syscall.Signal, stopped bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.exited() {
		return
	}
	syscall.Kill(s.cmd.Process.Pid, sig)
	s.stopped = stopped
}

// Restart starts the server again on the same port, in the same directory
// and with the same arguments, after Kill. Extra arguments apply to this
// start only (for example "--replicaof", host, port). It is an error to
// restart a server that is still running.
func (s *Server) Restart(extra ...string) error {
	s.mu.Lock()
	running := s.cmd != nil && !s.exited()
	s.mu.Unlock()
	if running {
		return fmt.Errorf("redistest: restart of %s while it runs", s.Addr)
	}
	args := s.args
	s.args = append(append([]string(nil), args...), extra...)
	defer func() { s.args = args }()
	return s.run(s.Port)
}

// Close kills the server by its PID and removes its directory when start
// made it. It is safe to call more than once.
func (s *Server) Close() {
	s.Kill()
	if s.ownDir {
		os.RemoveAll(s.Dir)
	}
}

// LogTail returns the last lines of the server's log, for failure messages.
func (s *Server) LogTail() string {
	b, err := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// FreePort returns a TCP port on 127.0.0.1 that nothing listened on a moment
// ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Do sends one command to the server at addr on a new connection and returns
// its reply as text: a status or bulk string as is, an integer in decimal,
// an array as its elements joined by newlines, nil as "". A Redis error
// reply is returned as an error. It needs no client library, so tests can
// use it to set up and inspect a server.
func Do(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write(b.Bytes()); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(c))
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("redistest: empty reply line")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", err
		}
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", err
		}
		parts := make([]string, 0, max(n, 0))
		for i := 0; i < n; i++ {
			p, err := readReply(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("redistest: unexpected reply %q", line)
}

func ping(addr string) error {
	reply, err := Do(addr, "PING")
	if err != nil {
		return err
	}
	if reply != "PONG" {
		return fmt.Errorf("redistest: PING answered %q", reply)
	}
	return nil
}

// Info returns the fields of an INFO reply from the server at addr, for
// the given sections (all default sections when none).
func Info(addr string, sections ...string) (map[string]string, error) {
	reply, err := Do(addr, append([]string{"INFO"}, sections...)...)
	if err != nil {
		return nil, err
	}
	return ParseInfo(reply), nil
}

// ParseInfo splits an INFO reply into its "name:value" fields.
func ParseInfo(reply string) map[string]string {
	m := make(map[string]string)
	for _, line := range strings.Split(reply, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m
}
