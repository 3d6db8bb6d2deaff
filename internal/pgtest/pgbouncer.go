package pgtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/proctest"
)

// ErrPgBouncerNotInstalled reports that the pgbouncer binary was not found.
// It matches ErrNotInstalled too (errors.Is), so Unavailable skips a test
// without it, or fails the test when CI is set.
var ErrPgBouncerNotInstalled error = pgbouncerNotInstalled{}

type pgbouncerNotInstalled struct{}

func (pgbouncerNotInstalled) Error() string {
	return "pgtest: pgbouncer not found on PATH or in /usr/sbin (install it, e.g. apt-get install pgbouncer)"
}

func (pgbouncerNotInstalled) Is(target error) bool { return target == ErrNotInstalled }

// ErrNoPreparedStatements reports that the installed PgBouncer cannot keep
// prepared statements across server connections: max_prepared_statements
// came in PgBouncer 1.21.
var ErrNoPreparedStatements = errors.New("pgtest: the installed PgBouncer has no max_prepared_statements (it came in 1.21)")

// pgbouncerStopTimeout bounds how long Close waits after SIGTERM before it
// sends SIGKILL.
const pgbouncerStopTimeout = 5 * time.Second

// PgBouncer is a pgbouncer process in front of one database, for tests of
// the store through a transaction-mode pooler: each is the test's own, with
// its own configuration in a fresh temporary directory, on a free loopback
// port (never the 6432 of a system service), stopped by its PID when the
// test ends.
//
// What works through it. In transaction mode a client holds a server
// connection only until its transaction ends (outside a transaction: until
// its statement ends), and the next client may get that connection. Through
// PgBouncer 1.18 in transaction mode, without max_prepared_statements
// (which came in 1.21), with two clients sharing one server connection,
// pgx's default_query_exec_mode values behave as follows (TestPgBouncerExecModes):
//
//	cache_statement  fails: each client prepares its named statements
//	                 ("stmtcache_<hash of the SQL>") on whichever server
//	                 connection it has, so the second client's prepare of
//	                 the same SQL finds "prepared statement ... already
//	                 exists" (42P05), and one that was prepared on another
//	                 server connection "does not exist" (26000)
//	cache_describe   works: the description is cached in the client, every
//	                 execution parses the unnamed statement anew
//	describe_exec    works one client at a time, but not under concurrency:
//	                 describe (Parse, Describe, Sync) and execute (Bind,
//	                 Execute, Sync) are two round trips, and another
//	                 client's Parse may replace the unnamed statement
//	                 between them
//	exec             works: Parse to Sync in one round trip, nothing kept
//	simple_protocol  works: no server-side statement at all
//
// A session-level state (pg_advisory_lock, SET, a named prepared statement,
// LISTEN) outlives the client's statement and stays on the server
// connection, for whichever client gets it next; transaction-level state
// (pg_advisory_xact_lock, SET LOCAL) ends with the transaction, and a
// client that goes away in a transaction takes the server connection with
// it, which ends the transaction and frees its locks (within a few
// milliseconds, TestPgBouncerDisconnectFreesXactLock). While PgBouncer
// cannot reach the server, it holds its clients' queries, up to
// query_wait_timeout (120 s unless PgBouncerSetting changes it), rather
// than fail them, and it tries the server again every second.
type PgBouncer struct {
	// URL connects through PgBouncer to the server's database as the
	// server URL's user, over TCP on loopback, without TLS. In
	// transaction mode pgx needs a query exec mode that works through
	// it (see above): add "&default_query_exec_mode=exec", for example.
	URL string
	// Addr is "127.0.0.1:<port>"; Port is the port.
	Addr string
	Port int
	// Dir holds pgbouncer.ini, userlist.txt and the log (pgbouncer.log).
	Dir string
	// Version is the installed PgBouncer's version, as "1.18.0".
	Version string

	bin  string
	cfg  pgbouncerConfig
	cred *syscall.Credential
	proc
}

// PgBouncerOption sets up a PgBouncer started by StartPgBouncer or
// LaunchPgBouncer.
type PgBouncerOption func(*pgbouncerConfig)

type pgbouncerConfig struct {
	poolMode      string
	poolSize      int
	maxClientConn int
	prepared      int         // max_prepared_statements; 0: not set
	settings      [][2]string // further name, value pairs
}

// PoolMode sets pool_mode: "session", "transaction" (the default) or
// "statement".
func PoolMode(mode string) PgBouncerOption {
	return func(c *pgbouncerConfig) { c.poolMode = mode }
}

// PoolSize sets default_pool_size, the server connections per database and
// user; the default is 4.
func PoolSize(n int) PgBouncerOption {
	return func(c *pgbouncerConfig) { c.poolSize = n }
}

// MaxClientConn sets max_client_conn, the client connections PgBouncer
// accepts; the default is 100.
func MaxClientConn(n int) PgBouncerOption {
	return func(c *pgbouncerConfig) { c.maxClientConn = n }
}

// PreparedStatements sets max_prepared_statements to n (n > 0): PgBouncer
// then keeps the clients' protocol-level prepared statements, preparing
// them on whichever server connection a client gets. Versions before 1.21
// do not have it: LaunchPgBouncer returns ErrNoPreparedStatements, and
// StartPgBouncer skips the test (even when CI is set: the installed version
// decides, not the run).
func PreparedStatements(n int) PgBouncerOption {
	return func(c *pgbouncerConfig) { c.prepared = n }
}

// PgBouncerSetting adds "name = value" to the [pgbouncer] section, after
// the settings the harness writes (the later one wins).
func PgBouncerSetting(name, value string) PgBouncerOption {
	return func(c *pgbouncerConfig) { c.settings = append(c.settings, [2]string{name, value}) }
}

// PgBouncerBin returns the path of the pgbouncer binary: on PATH, or in
// /usr/sbin (where Debian puts it, not on every user's PATH).
func PgBouncerBin() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/local/bin/pgbouncer"} {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", ErrPgBouncerNotInstalled
}

var pgbouncerVersion struct {
	once sync.Once
	v    string
	err  error
}

var pgbouncerVersionRE = regexp.MustCompile(`(?i)pgbouncer\s+(\d+\.\d+(?:\.\d+)?)`)

// PgBouncerVersion returns the installed PgBouncer's version, as "1.18.0",
// from pgbouncer --version.
func PgBouncerVersion() (string, error) {
	pgbouncerVersion.once.Do(func() {
		bin, err := PgBouncerBin()
		if err != nil {
			pgbouncerVersion.err = err
			return
		}
		out, err := exec.Command(bin, "--version").CombinedOutput()
		if err != nil {
			pgbouncerVersion.err = fmt.Errorf("pgtest: %s --version: %v\n%s", bin, err, out)
			return
		}
		m := pgbouncerVersionRE.FindSubmatch(out)
		if m == nil {
			pgbouncerVersion.err = fmt.Errorf("pgtest: no version in the output of %s --version:\n%s", bin, out)
			return
		}
		pgbouncerVersion.v = string(m[1])
	})
	return pgbouncerVersion.v, pgbouncerVersion.err
}

// versionAtLeast reports whether v ("1.18.0") is major.minor or later.
func versionAtLeast(v string, major, minor int) bool {
	parts := strings.Split(v, ".")
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// AtLeast reports whether this PgBouncer's version is major.minor or later
// (false when its version could not be read).
func (b *PgBouncer) AtLeast(major, minor int) bool { return versionAtLeast(b.Version, major, minor) }

// StartPgBouncer starts a PgBouncer in front of serverURL's database (a
// postgres:// URL) for the test, on a free loopback port, and returns it
// once it passes a query through to the server; it is stopped (SIGTERM,
// then SIGKILL) and its directory removed when the test ends, and its log
// is written to the test's output if the test failed. Without the pgbouncer
// binary the test is skipped, or failed when CI is set.
func StartPgBouncer(t testing.TB, serverURL string, opts ...PgBouncerOption) *PgBouncer {
	t.Helper()
	b, err := LaunchPgBouncer(serverURL, opts...)
	if errors.Is(err, ErrNoPreparedStatements) {
		t.Skip(err)
	}
	if err != nil {
		Unavailable(t, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgbouncer on %s, its log:\n%s", b.Addr, b.LogTail())
		}
		b.Close()
	})
	return b
}

// LaunchPgBouncer starts a PgBouncer as StartPgBouncer does, for a program;
// the caller stops it with Close.
func LaunchPgBouncer(serverURL string, opts ...PgBouncerOption) (*PgBouncer, error) {
	bin, err := PgBouncerBin()
	if err != nil {
		return nil, err
	}
	version, err := PgBouncerVersion()
	if err != nil {
		return nil, err
	}
	cfg := pgbouncerConfig{poolMode: "transaction", poolSize: 4, maxClientConn: 100}
	for _, o := range opts {
		o(&cfg)
	}
	switch cfg.poolMode {
	case "session", "transaction", "statement":
	default:
		return nil, fmt.Errorf("pgtest: pool mode %q: want session, transaction or statement", cfg.poolMode)
	}
	if cfg.poolSize < 1 || cfg.maxClientConn < 1 {
		return nil, fmt.Errorf("pgtest: pool size %d and max_client_conn %d: want at least 1", cfg.poolSize, cfg.maxClientConn)
	}
	if cfg.prepared > 0 && !versionAtLeast(version, 1, 21) {
		return nil, fmt.Errorf("%w: PgBouncer %s", ErrNoPreparedStatements, version)
	}
	cred, err := runAs()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-pgbouncer-")
	if err != nil {
		return nil, err
	}
	b := &PgBouncer{Dir: dir, Version: version, bin: bin, cfg: cfg, cred: cred}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	for attempt := 0; attempt < 5; attempt++ {
		var port int
		if port, err = FreePort(); err != nil {
			break
		}
		if err = b.run(serverURL, port); err == nil {
			return b, nil
		}
		if !errors.Is(err, errPortTaken) {
			break // another port would not mend it
		}
	}
	os.RemoveAll(dir)
	return nil, err
}

// errPgBouncerConfig marks a server URL the harness cannot write into
// pgbouncer.ini.
var errPgBouncerConfig = errors.New("pgtest: pgbouncer configuration")

// errPortTaken marks a start that failed because something else took the
// port between FreePort and pgbouncer's bind: another port may do.
var errPortTaken = errors.New("pgtest: the port was taken")

// connValue checks that v can stand as a value in a [databases] entry as it
// is.
func connValue(name, v string) error {
	if v == "" || strings.ContainsAny(v, " \t\r\n'\"\\;#=") {
		return fmt.Errorf("%w: %s %q cannot be written as is", errPgBouncerConfig, name, v)
	}
	return nil
}

// writeConfig writes pgbouncer.ini and userlist.txt into b.Dir for a
// PgBouncer on port in front of serverURL's database, and sets b.URL.
func (b *PgBouncer) writeConfig(serverURL string, port int) error {
	sc, err := parseURL(serverURL)
	if err != nil {
		return fmt.Errorf("%w: server URL: %v", errPgBouncerConfig, err)
	}
	db, user := sc.Database, sc.User
	if db == "" {
		db = user
	}
	for _, kv := range [][2]string{{"host", sc.Host}, {"database", db}, {"user", user}} {
		if err := connValue(kv[0], kv[1]); err != nil {
			return err
		}
	}
	entry := fmt.Sprintf("host=%s port=%d dbname=%s user=%s", sc.Host, sc.Port, db, user)
	if sc.Password != "" {
		if err := connValue("password", sc.Password); err != nil {
			return err
		}
		entry += " password=" + sc.Password
	}
	var ini bytes.Buffer
	fmt.Fprintf(&ini, "[databases]\n%s = %s\n\n[pgbouncer]\n", db, entry)
	set := func(name string, value any) { fmt.Fprintf(&ini, "%s = %v\n", name, value) }
	set("listen_addr", "127.0.0.1")
	set("listen_port", port)
	set("unix_socket_dir", "") // no socket in /tmp, which the system service may use
	set("auth_type", "trust")  // the servers trust loopback
	set("auth_file", filepath.Join(b.Dir, "userlist.txt"))
	set("admin_users", user)
	set("stats_users", user)
	set("pool_mode", b.cfg.poolMode)
	set("default_pool_size", b.cfg.poolSize)
	set("max_client_conn", b.cfg.maxClientConn)
	if b.cfg.prepared > 0 {
		set("max_prepared_statements", b.cfg.prepared)
	}
	set("logfile", filepath.Join(b.Dir, "pgbouncer.log"))
	set("server_login_retry", 1) // 15 s by default: a test would wait that long after a failed login
	set("ignore_startup_parameters", "extra_float_digits")
	for _, kv := range b.cfg.settings {
		set(kv[0], kv[1])
	}
	// Trust still wants the user listed in the auth file.
	userlist := fmt.Sprintf("%q %q\n", user, sc.Password)
	if err := b.writeFile("pgbouncer.ini", ini.Bytes()); err != nil {
		return err
	}
	if err := b.writeFile("userlist.txt", []byte(userlist)); err != nil {
		return err
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(user),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	b.URL = u.String()
	return nil
}

// writeFile writes name into b.Dir, owned by the user PgBouncer runs as.
func (b *PgBouncer) writeFile(name string, data []byte) error {
	p := filepath.Join(b.Dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		return err
	}
	if b.cred != nil {
		return os.Chown(p, int(b.cred.Uid), int(b.cred.Gid))
	}
	return nil
}

// run starts pgbouncer on port and waits until a query passes through it.
func (b *PgBouncer) run(serverURL string, port int) error {
	b.Port = port
	b.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err := b.writeConfig(serverURL, port); err != nil {
		return err
	}
	// A failed attempt's log would read as this one's.
	os.Remove(filepath.Join(b.Dir, "pgbouncer.log"))
	os.Remove(filepath.Join(b.Dir, "pgbouncer.stderr"))
	// What pgbouncer writes before it opens its log file (a configuration
	// it rejects) goes to stderr.
	out, err := os.OpenFile(filepath.Join(b.Dir, "pgbouncer.stderr"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	// -q: the log goes to the log file only, not to stderr as well.
	cmd := exec.Command(b.bin, "-q", filepath.Join(b.Dir, "pgbouncer.ini"))
	cmd.Dir = b.Dir
	cmd.Stdout, cmd.Stderr = out, out
	// As the postgres user when this process is root (PgBouncer refuses
	// root), directly rather than through runuser or su: the PID is
	// pgbouncer's own, and it dies with the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred}
	pr, err := b.launch(cmd)
	if err != nil {
		return err
	}
	err = proctest.WaitReady(pr, startTimeout, 0, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return b.ping(ctx)
	})
	switch {
	case errors.Is(err, proctest.ErrExited):
		err := fmt.Errorf("pgtest: pgbouncer on port %d exited at start (%v):\n%s", port, pr.Err(), b.LogTail())
		if strings.Contains(b.Log(), "Address already in use") {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return err
	case err != nil:
		b.Kill()
		return fmt.Errorf("pgtest: pgbouncer on port %d did not pass a query: %v\n%s", port, err, b.LogTail())
	}
	return nil
}

// ping runs SELECT 1 through PgBouncer with the simple protocol, which
// leaves no statement behind on the server connection.
func (b *PgBouncer) ping(ctx context.Context) error { return ping(ctx, b.URL) }

// Kill ends pgbouncer with SIGKILL and waits until it has exited and been
// reaped: every client connection and every server connection it held is
// closed, and the server ends those sessions (and their transactions) as
// it notices. Killing one that is not running does nothing.
func (b *PgBouncer) Kill() {
	b.stop(syscall.SIGKILL, 0)
}

// Close stops pgbouncer (SIGTERM, then SIGKILL if it has not exited after
// a few seconds), waits until it is gone, and removes its directory. It is
// safe to call more than once.
func (b *PgBouncer) Close() {
	b.stop(syscall.SIGTERM, pgbouncerStopTimeout)
	os.RemoveAll(b.Dir)
}

// stop sends sig and waits up to grace for the exit, then sends SIGKILL and
// waits for it.
func (b *PgBouncer) stop(sig syscall.Signal, grace time.Duration) {
	cmd, done := b.current()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	// cmd.Wait has not reaped it (done is open): the PID is still its.
	syscall.Kill(cmd.Process.Pid, sig)
	if sig != syscall.SIGKILL {
		select {
		case <-done:
			return
		case <-time.After(grace):
		}
		syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
	}
	<-done
}

// Log returns PgBouncer's whole log (and whatever it wrote to stderr).
func (b *PgBouncer) Log() string {
	var out []byte
	for _, name := range []string{"pgbouncer.stderr", "pgbouncer.log"} {
		data, err := os.ReadFile(filepath.Join(b.Dir, name))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			out = append(out, fmt.Sprintf("(%s: %v)\n", name, err)...)
		}
		out = append(out, data...)
	}
	if len(bytes.TrimSpace(out)) == 0 {
		return "(empty log)"
	}
	return string(out)
}

// LogTail returns the last lines of PgBouncer's log, for failure messages.
func (b *PgBouncer) LogTail() string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(b.Log()))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}
