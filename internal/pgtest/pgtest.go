// Package pgtest gives tests a real PostgreSQL: the shared server the
// environment provides (DATABASE_URL, or the local one on 5432), or a
// throwaway cluster of their own. A throwaway cluster is made with initdb
// and run with postgres on a free loopback port, in a fresh temporary
// directory, and stopped by its PID when the test (or, for one started with
// Launch, the program) is done. Clusters are copies of one template that
// initdb makes on the machine's first use and that stays in the temporary
// directory for later runs (idemkey-pgtest-template-*), about 40 MB. It flushes nothing to disk (fsync is off):
// it survives being killed, not the machine going down.
//
// PostgreSQL refuses to run as root. A process running as root starts the
// cluster as the "postgres" user (the one the distribution's packages
// create); any other user runs it as itself.
//
// The binaries are looked up on PATH, then in the distribution's
// directories (/usr/lib/postgresql/<version>/bin, newest first). Without
// them, or without a reachable shared server, the functions that take a
// testing.TB skip the test with a message that says so. When the
// environment variable CI is set non-empty they fail it instead, so a
// continuous-integration run cannot pass by skipping.
//
// The package is part of the root module and uses only the standard
// library (it signs in and runs SELECT 1 over the wire protocol itself), so
// that the modules whose tests use it (store/postgres, idemctl, the
// examples) add nothing to their users' module graphs. Its own tests drive
// the servers with pgx, in the module internal/pgtest/test, which nothing
// imports.
//
// Typical use:
//
//	url := pgtest.Shared(t)             // the shared server, for tests that need no faults
//	srv := pgtest.Start(t)              // a cluster of the test's own
//	pool, err := pgxpool.New(ctx, srv.URL)
//	srv.Freeze()                        // SIGSTOP: every process of the cluster
package pgtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/proctest"
)

// ErrNotInstalled reports that the PostgreSQL server binaries were not
// found.
var ErrNotInstalled = errors.New("pgtest: initdb and postgres not found on PATH or in /usr/lib/postgresql/*/bin (install them, e.g. apt-get install postgresql)")

// ErrNoServer reports that the shared server does not answer.
var ErrNoServer = errors.New("pgtest: the shared PostgreSQL does not answer")

// DefaultURL is the shared server when DATABASE_URL is not set.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// startTimeout bounds how long a cluster may take to accept connections.
const startTimeout = 30 * time.Second

// Shared returns the URL of the shared server: DATABASE_URL, or DefaultURL.
// It checks that the server answers within a few seconds; when it does not,
// the test is skipped, or failed when CI is set. Tests on a shared server
// keep to tables of their own (random names) and never drop anything else.
func Shared(t testing.TB) string {
	t.Helper()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = DefaultURL
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ping(ctx, url); err != nil {
		Unavailable(t, fmt.Errorf("%w at %s: %v", ErrNoServer, redact(url), err))
	}
	return url
}

// Require returns the directory holding initdb and postgres. Without them
// it skips the test, or fails it when the environment variable CI is
// non-empty.
func Require(t testing.TB) string {
	t.Helper()
	dir, err := BinDir()
	if err != nil {
		Unavailable(t, err)
	}
	return dir
}

// Unavailable ends a test that cannot get the PostgreSQL it needs because
// of err: a skip when err is ErrNotInstalled or ErrNoServer and CI is
// empty, a failure otherwise.
func Unavailable(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, ErrNotInstalled) || errors.Is(err, ErrNoServer) {
		proctest.Unavailable(t, "%v", err)
	}
	t.Fatal(err)
}

// BinDir returns the directory that holds initdb and postgres.
func BinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest first: "9.6" sorts after "15" as text, so compare numbers.
	slices.SortFunc(dirs, func(a, b string) int { return version(b) - version(a) })
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	return "", ErrNotInstalled
}

// version returns the major version in /usr/lib/postgresql/<v>/bin.
func version(dir string) int {
	v := filepath.Base(filepath.Dir(dir))
	major, _, _ := bytes.Cut([]byte(v), []byte("."))
	n, _ := strconv.Atoi(string(major))
	return n
}

// Server is one throwaway cluster: a postmaster and the backends it forks.
type Server struct {
	// URL connects to the database "postgres" as the user "postgres", over
	// TCP on loopback, without TLS.
	URL string
	// Addr is "127.0.0.1:<port>"; Port is the port.
	Addr string
	Port int
	// Dir holds the data directory (Dir/data) and the log
	// (Dir/postgres.log).
	Dir string

	bin      string
	settings []string
	cred     *syscall.Credential
	proc
}

// Start starts a cluster of the test's own on a free loopback port and
// returns it; it is killed and its directory removed when the test ends.
// settings are server parameters as "name=value" (for example
// "max_connections=20"), applied after the defaults. Without the binaries
// the test is skipped, or failed when CI is set.
func Start(t testing.TB, settings ...string) *Server {
	t.Helper()
	Require(t)
	s, err := Launch(settings...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Launch starts a cluster on a free loopback port, as Start does, for a
// program; the caller stops it with Close.
func Launch(settings ...string) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	cred, err := runAs()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: dir, bin: bin, settings: settings, cred: cred}
	if err := s.initdb(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for attempt := 0; attempt < 5; attempt++ {
		var port int
		if port, err = FreePort(); err != nil {
			break
		}
		if err = s.run(port); err == nil {
			return s, nil
		}
	}
	os.RemoveAll(dir)
	return nil, err
}

// runAs returns the credentials the cluster runs under: the postgres user's
// when this process is root, nil (this process's own) otherwise.
func runAs() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root, and PostgreSQL refuses root: no postgres user to run it as: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("pgtest: postgres user with ids %q:%q", u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// template is a data directory made by initdb, which each cluster copies:
// copying takes a fraction of initdb's second. It is made once per machine
// (per binary directory and user) under the temporary directory and kept
// there for the next test binary, so that no run leaves one behind.
var template struct {
	once sync.Once
	dir  string
	err  error
}

// templateDir returns the data directory of the template for s's binaries,
// making it when it does not exist yet. Processes that make it at the same
// time each run initdb in a directory of their own and rename it into
// place; the first rename wins and the others use its result.
func (s *Server) templateDir() (string, error) {
	sum := sha256.Sum256([]byte(s.bin))
	final := filepath.Join(os.TempDir(), fmt.Sprintf("idemkey-pgtest-template-%x-%d", sum[:6], os.Getuid()))
	data := filepath.Join(final, "data")
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err == nil {
		return data, nil
	}
	dir, err := os.MkdirTemp("", "idemkey-pgtest-initdb-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir) // gone once renamed, or if it failed
	if err := s.own(dir); err != nil {
		return "", err
	}
	cmd := exec.Command(filepath.Join(s.bin, "initdb"), "-D", filepath.Join(dir, "data"),
		"-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync")
	s.credentials(cmd)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("pgtest: initdb: %v\n%s", err, out)
	}
	if err := os.Rename(dir, final); err != nil {
		if _, serr := os.Stat(filepath.Join(data, "PG_VERSION")); serr != nil {
			return "", fmt.Errorf("pgtest: keeping the template cluster: %w", err)
		}
	}
	return data, nil
}

// initdb makes s.Dir/data: a copy of the template.
func (s *Server) initdb() error {
	if err := s.own(s.Dir); err != nil {
		return err
	}
	template.once.Do(func() { template.dir, template.err = s.templateDir() })
	if template.err != nil {
		return template.err
	}
	// cp -a keeps the owner and the 0700 mode postgres insists on.
	if out, err := exec.Command("cp", "-a", template.dir, filepath.Join(s.Dir, "data")).CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: copying the template cluster: %v\n%s", err, out)
	}
	return nil
}

// own gives dir to the user the cluster runs as.
func (s *Server) own(dir string) error {
	if s.cred == nil {
		return nil
	}
	return os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid))
}

func (s *Server) credentials(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
}

// run starts the postmaster on port and waits until it accepts
// connections.
func (s *Server) run(port int) error {
	s.Port = port
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	s.URL = "postgres://postgres@" + s.Addr + "/postgres?sslmode=disable"
	args := []string{
		"-D", filepath.Join(s.Dir, "data"),
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + s.Dir,
		// Nothing is flushed to disk, but every commit is written to the
		// WAL before it is acknowledged (synchronous_commit stays on), so
		// a killed cluster, on a machine that stays up, recovers every
		// commit it acknowledged.
		"-c", "fsync=off",
		"-c", "full_page_writes=off",
		"-c", "shared_buffers=32MB",
		"-c", "max_connections=200",
		"-c", "log_min_messages=warning",
	}
	for _, kv := range s.settings {
		args = append(args, "-c", kv)
	}
	logf, err := os.OpenFile(filepath.Join(s.Dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), args...)
	cmd.Dir = s.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	s.credentials(cmd)
	pr, err := s.launch(cmd)
	if err != nil {
		return err
	}
	err = proctest.WaitReady(pr, startTimeout, 0, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return ping(ctx, s.URL)
	})
	switch {
	case errors.Is(err, proctest.ErrExited):
		return fmt.Errorf("pgtest: postgres on port %d exited at start:\n%s", port, s.LogTail())
	case err != nil:
		s.Kill()
		return fmt.Errorf("pgtest: postgres on port %d did not accept connections: %v\n%s", port, err, s.LogTail())
	}
	return nil
}

// Kill ends the postmaster and every backend with SIGKILL, as a crash of
// the machine would, and waits for the postmaster to exit. Killing a
// cluster that is not running does nothing.
func (s *Server) Kill() {
	cmd, done := s.current()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	pid := cmd.Process.Pid
	// Stop the postmaster first, so that it forks no backend while its
	// children are found, then kill the children (each backend is a
	// process group of its own: a signal to the postmaster's group does
	// not reach them), then the postmaster.
	syscall.Kill(pid, syscall.SIGSTOP)
	kids := children(pid)
	for _, c := range kids {
		syscall.Kill(c, syscall.SIGKILL)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	syscall.Kill(pid, syscall.SIGCONT)
	<-done
	// A killed process lets go of the shared memory as it exits, a moment
	// after the signal: a restart before that finds the old segment in
	// use and refuses to start.
	waitExited(kids, 10*time.Second)
}

// Freeze stops the postmaster and every backend with SIGSTOP: connections
// stay open and nothing answers until Thaw.
func (s *Server) Freeze() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.exited() {
		return
	}
	pid := s.cmd.Process.Pid
	syscall.Kill(pid, syscall.SIGSTOP) // first: it forks nothing more
	for _, c := range children(pid) {
		syscall.Kill(c, syscall.SIGSTOP)
	}
}

// Thaw resumes a cluster stopped by Freeze with SIGCONT.
func (s *Server) Thaw() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.exited() {
		return
	}
	pid := s.cmd.Process.Pid
	for _, c := range children(pid) {
		syscall.Kill(c, syscall.SIGCONT)
	}
	syscall.Kill(pid, syscall.SIGCONT)
}

// Backends returns the process ids of the postmaster's children: the
// backends serving connections and the server's own workers.
func (s *Server) Backends() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.exited() {
		return nil
	}
	return children(s.cmd.Process.Pid)
}

// Restart starts the cluster again on the same port and data directory,
// after Kill. A killed cluster recovers from its WAL as after a crash. It
// is an error to restart a cluster that is still running.
func (s *Server) Restart() error {
	s.mu.Lock()
	running := s.cmd != nil && !s.exited()
	s.mu.Unlock()
	if running {
		return fmt.Errorf("pgtest: restart of %s while it runs", s.Addr)
	}
	return s.run(s.Port)
}

// Close kills the cluster by its PIDs and removes its directory.
// It is safe to call more than once.
func (s *Server) Close() {
	s.Kill()
	os.RemoveAll(s.Dir)
}

// LogTail returns the last lines of the server's log, for failure messages.
func (s *Server) LogTail() string {
	b, err := os.ReadFile(filepath.Join(s.Dir, "postgres.log"))
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

// redact returns url without its password, for messages.
func redact(url string) string {
	cfg, err := parseURL(url)
	if err != nil {
		return "(an unparsable URL)"
	}
	return fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
}
