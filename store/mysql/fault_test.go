package mysql_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/proctest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/mysql"
)

// mariadb is a MariaDB server of the test's own, on a free loopback port,
// with its data in the test's temporary directory. It is stopped by its
// process id when the test ends.
type mariadb struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	proc *proctest.Proc
	url  string
}

// findBin returns the path of a server program, looked up in PATH and in
// the directories Debian installs them in.
func findBin(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/mysql/bin"} {
		if p := filepath.Join(dir, name); fileExists(p) {
			return p
		}
	}
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// startMariaDB initialises a data directory and starts a server on it,
// skipping the test (failing it under CI) when MariaDB is not installed.
func startMariaDB(t testing.TB) *mariadb {
	t.Helper()
	bin, install := findBin("mariadbd"), findBin("mariadb-install-db")
	if bin == "" || install == "" {
		proctest.Unavailable(t, "mariadbd and mariadb-install-db are not installed")
	}
	dir := t.TempDir()
	args := []string{"--no-defaults", "--datadir=" + filepath.Join(dir, "data"), "--auth-root-authentication-method=normal", "--skip-test-db"}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	if out, err := exec.Command(install, args...).CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	m := &mariadb{t: t, bin: bin, dir: dir, port: port, url: fmt.Sprintf("mysql://root@127.0.0.1:%d/test", port)}
	t.Cleanup(m.stop)
	m.start()
	dsn, _ := mysql.DSN(fmt.Sprintf("mysql://root@127.0.0.1:%d/", port))
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE DATABASE IF NOT EXISTS test"); err != nil {
		t.Fatal(err)
	}
	return m
}

// start starts the server and waits (up to 30 s) until it answers.
func (m *mariadb) start() {
	m.t.Helper()
	args := []string{"--no-defaults", "--datadir=" + filepath.Join(m.dir, "data"),
		"--socket=" + filepath.Join(m.dir, "sock"), "--pid-file=" + filepath.Join(m.dir, "pid"),
		"--log-error=" + filepath.Join(m.dir, "error.log"),
		"--port=" + fmt.Sprint(m.port), "--bind-address=127.0.0.1", "--skip-log-bin",
		"--innodb-buffer-pool-size=16M", "--max-connections=60"}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	// With the parent-death signal: a test binary that dies without its
	// cleanups does not leave mariadbd running.
	proc, err := proctest.Start(exec.Command(m.bin, args...))
	if err != nil {
		m.t.Fatal(err)
	}
	m.proc = proc
	dsn, _ := mysql.DSN(fmt.Sprintf("mysql://root@127.0.0.1:%d/", m.port))
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		m.t.Fatal(err)
	}
	defer db.Close()
	for deadline := time.Now().Add(30 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := db.PingContext(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(m.dir, "error.log"))
			m.t.Fatalf("the test's MariaDB did not start: %v\n%s", err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill9 kills the server (SIGKILL) and waits for it to be gone.
func (m *mariadb) kill9() {
	m.t.Helper()
	if m.proc.Exited() {
		m.t.Fatal("the test's MariaDB is not running")
	}
	m.proc.Kill()
}

// stop stops the server by its process id, if it runs.
func (m *mariadb) stop() {
	if m.proc != nil {
		m.proc.Kill()
	}
}

// TestFaultServerKilled: the server is killed (SIGKILL) while a handler
// runs, after its insert. The owner's client gets 503, requests while the
// server is down get 503 without running the handler, and after the
// restart the key runs once more (the killed run's insert was rolled back
// by the server's recovery) and is replayed after: one payment.
func TestFaultServerKilled(t *testing.T) {
	m := startMariaDB(t)
	db := openDB(t, m.url, 20)
	st, _ := newStore(t, db, mysql.WithCallTimeout(time.Second))
	h := &payHandler{pay: newPayments(t, db), inserted: make(chan int64, 4), block: make(chan struct{})}
	srv := server(t, st, h, 30*time.Second)
	h.unblockAtEnd(t)
	key := rand.Text()
	first := make(chan answer, 1)
	go func() { first <- post(srv.URL, key, payBody, "X-Block", "1") }()
	<-h.inserted
	m.kill9()
	h.unblock()
	if a := <-first; a.status != http.StatusServiceUnavailable {
		t.Fatalf("the owner's client, its server killed: %d %s, want 503", a.status, a.body)
	}
	runs := h.runs.Load()
	for range 3 {
		if a := post(srv.URL, key, payBody); a.status != http.StatusServiceUnavailable {
			t.Fatalf("while the server is down: %d %s, want 503", a.status, a.body)
		}
	}
	if n := h.runs.Load(); n != runs {
		t.Fatalf("the handler ran %d times while the server was down", n-runs)
	}
	m.start()
	if n := h.pay.count(t, key); n != 0 {
		t.Fatalf("%d payments of the killed run after recovery, want 0", n)
	}
	var a answer
	for deadline := time.Now().Add(10 * time.Second); ; {
		// The pool's connections died with the server: a request may
		// meet one first.
		if a = post(srv.URL, key, payBody); a.status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if a.status != 201 || a.replayed {
		t.Fatalf("after the restart: %d replayed=%v %s, want a first 201", a.status, a.replayed, a.body)
	}
	for range 3 {
		if b := post(srv.URL, key, payBody); b.status != 201 || !b.replayed || b.body != a.body {
			t.Fatalf("a repeat after the restart: %d replayed=%v %s, want %s replayed", b.status, b.replayed, b.body, a.body)
		}
	}
	if n := h.pay.count(t, key); n != 1 || h.runs.Load() != runs+1 {
		t.Fatalf("%d payments, %d runs after the restart; want 1 and 1", n, h.runs.Load()-runs)
	}
}

// TestFaultPoolExhausted: with every connection held by a running
// handler, a claim waits its budget for one and is answered 503
// (ErrPoolExhausted); the handler does not run.
func TestFaultPoolExhausted(t *testing.T) {
	db := openDB(t, sharedURL(), 3)
	st, _ := newStore(t, db, mysql.WithCallTimeout(200*time.Millisecond))
	h := &payHandler{pay: newPayments(t, db), inserted: make(chan int64, 3), block: make(chan struct{})}
	srv := server(t, st, h, 30*time.Second)
	h.unblockAtEnd(t)
	done := make(chan answer, 3)
	for range 3 {
		go func() { done <- post(srv.URL, rand.Text(), payBody, "X-Block", "1") }()
		<-h.inserted
	}
	runs := h.runs.Load()
	if a := post(srv.URL, rand.Text(), payBody); a.status != http.StatusServiceUnavailable {
		t.Fatalf("with the pool exhausted: %d %s, want 503", a.status, a.body)
	}
	if h.runs.Load() != runs {
		t.Fatal("the handler ran without a connection")
	}
	h.unblock()
	for range 3 {
		if a := <-done; a.status != 201 {
			t.Fatalf("a blocked request: %d %s", a.status, a.body)
		}
	}
}

// freeze stops the server (SIGSTOP); thaw resumes it.
func (m *mariadb) freeze() { m.proc.Signal(syscall.SIGSTOP) }
func (m *mariadb) thaw()   { m.proc.Signal(syscall.SIGCONT) }

// TestFaultServerFrozen: with the server stopped (SIGSTOP), a commit, a
// commit of a request without a key and a rollback each fail within the
// commit budget (the driver gives COMMIT and ROLLBACK no context of their
// own: the store must bound them), and after the thaw the key holds one
// payment, whether the commit sent into the freeze ran or not.
func TestFaultServerFrozen(t *testing.T) {
	const budget = 300 * time.Millisecond
	m := startMariaDB(t)
	db := openDB(t, m.url, 20)
	st, _ := newStore(t, db, mysql.WithCommitTimeout(budget))
	pay := newPayments(t, db)
	ctx := context.Background()
	key := newKey()
	tctx, tx := claimTx(t, st, key, newClaim(1))
	if err := pay.insert(tctx, mysql.Tx(tctx), key, "first"); err != nil {
		t.Fatal(err)
	}
	keyless, err := st.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kctx := keyless.NewContext(ctx)
	if err := pay.insert(kctx, mysql.Tx(kctx), "keyless", "first"); err != nil {
		t.Fatal(err)
	}
	_, other := claimTx(t, st, newKey(), newClaim(2))
	m.freeze()
	thawed := false
	defer func() {
		if !thawed {
			m.thaw()
		}
	}()
	for _, c := range []struct {
		name string
		end  func() error
	}{
		{"commit", func() error { return tx.Commit(ctx, record([32]byte{1}, 201), time.Hour) }},
		{"keyless commit", func() error { return keyless.Commit(ctx, record([32]byte{1}, 201), time.Hour) }},
		{"rollback", func() error { return other.Rollback(ctx) }},
	} {
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- c.end() }()
		select {
		case err := <-done:
			d := time.Since(start)
			t.Logf("server frozen: %s answered after %v: %v", c.name, d.Round(time.Millisecond), err)
			if c.name != "rollback" && (err == nil || errors.Is(err, store.ErrNotOwner)) {
				t.Errorf("%s against a frozen server: %v, want an unknown outcome", c.name, err)
			}
			if d > budget+2*time.Second {
				t.Errorf("%s took %v, budget %v", c.name, d, budget)
			}
		case <-time.After(budget + 5*time.Second):
			t.Fatalf("%s against a frozen server did not return within %v", c.name, budget+5*time.Second)
		}
	}
	m.thaw()
	thawed = true
	// After the thaw, the commit sent into the freeze ran or not: the
	// retry replays it, or takes the key over once the server has seen
	// the store's connection gone, and pays.
	var state store.State
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		res, retry, err := st.ClaimTx(ctx, key, newClaim(1))
		if err == nil && res.State == store.Claimed {
			rctx := retry.NewContext(ctx)
			if err := pay.insert(rctx, mysql.Tx(rctx), key, "retry"); err != nil {
				t.Fatal(err)
			}
			if err := retry.Commit(ctx, record([32]byte{1}, 201), time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		if err == nil && (res.State == store.Claimed || res.State == store.Completed) {
			state = res.State
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the key after the thaw: %v %v", res.State, err)
		}
	}
	if n := pay.count(t, key); n != 1 {
		t.Fatalf("%d payments for the key after the thaw (the retry found %v), want 1", n, state)
	}
	t.Logf("after the thaw the retry found the key %v: one payment", state)
}
