package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idemkey/idemkey/internal/proctest"
	"github.com/idemkey/idemkey/store/mysql"
)

// The MySQL scenarios: PostgreSQL's four, on a MariaDB the driver starts
// for the run (or the MySQL or MariaDB at -mysql-url, in a database the
// driver makes for the run and drops after).
const (
	// scMyBare: the handler in a transaction of its own, no idempotency.
	scMyBare = "my-bare"
	// scMyTypical: the hand-written pattern (SELECT the key's row, INSERT
	// it, the handler's INSERT, UPDATE it with the response, COMMIT).
	scMyTypical = "my-typical"
	// scMy: store/mysql as a plain store: claim, the handler's INSERT on
	// its own, complete.
	scMy = "idemkey-my"
	// scMyTx: store/mysql in the transactional flow: the handler's INSERT
	// in the request's transaction, committed with the record.
	scMyTx = "idemkey-my-tx"
)

var myScenarios = []string{scMyBare, scMyTypical, scMy, scMyTx}

func usesMySQL(sc string) bool {
	switch sc {
	case scMyBare, scMyTypical, scMy, scMyTx:
		return true
	}
	return false
}

// myTables are the tables the MySQL scenarios use besides the store's.
var myTables = []string{`CREATE TABLE bench_payments (
    id    BIGINT AUTO_INCREMENT PRIMARY KEY,
    k     VARCHAR(64) NOT NULL,
    run   BIGINT NOT NULL,
    bytes INT NOT NULL
) ENGINE=InnoDB`, `CREATE TABLE bench_typical_keys (
    k            VARCHAR(64) NOT NULL PRIMARY KEY,
    request_hash CHAR(64) NOT NULL,
    status       INT NULL,
    content_type VARCHAR(255) NULL,
    body         BLOB NULL,
    created_at   DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB`}

// mysqlRun is the database of a run on a MySQL or MariaDB server.
type mysqlRun struct {
	url     string // mysql:// URL of the run's database
	server  string // the server's, as given
	name    string
	pid     int // the server's process, for its CPU time; 0 when unknown
	version string
	own     *proctest.Proc // the server the driver started, when it did
	dir     string         // its data directory
}

// launchMariaDB starts a MariaDB server of the run's own on a free
// loopback port (every scenario's pool is dialled in full, more
// connections than a default server allows), with its data in a
// temporary directory, and makes the run's database on it.
func launchMariaDB() (*mysqlRun, error) {
	bin, install := findBin("mariadbd"), findBin("mariadb-install-db")
	if bin == "" || install == "" {
		return nil, errors.New("mariadbd and mariadb-install-db are not installed (or give -mysql-url)")
	}
	dir, err := os.MkdirTemp("", "idemkey-bench-mariadb-")
	if err != nil {
		return nil, err
	}
	args := []string{"--no-defaults", "--datadir=" + filepath.Join(dir, "data"), "--auth-root-authentication-method=normal", "--skip-test-db"}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	if out, err := exec.Command(install, args...).CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("mariadb-install-db: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	// As a production server would be: durable commits (the default
	// innodb_flush_log_at_trx_commit=1), a buffer pool that holds the
	// run's tables.
	args = []string{"--no-defaults", "--datadir=" + filepath.Join(dir, "data"),
		"--socket=" + filepath.Join(dir, "sock"), "--pid-file=" + filepath.Join(dir, "pid"),
		"--log-error=" + filepath.Join(dir, "error.log"), "--port=" + strconv.Itoa(port), "--bind-address=127.0.0.1",
		"--skip-log-bin", "--innodb-buffer-pool-size=256M", "--max-connections=1000"}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	// With the parent-death signal: a driver that dies does not leave
	// mariadbd running.
	proc, err := proctest.Start(exec.Command(bin, args...))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	stop := func() { proc.Kill(); os.RemoveAll(dir) }
	server := fmt.Sprintf("mysql://root@127.0.0.1:%d/", port)
	db, err := openMySQL(server, 1)
	if err != nil {
		stop()
		return nil, err
	}
	defer db.Close()
	if err := proctest.WaitReady(proc, 30*time.Second, 0, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return db.PingContext(ctx)
	}); err != nil {
		stop()
		return nil, fmt.Errorf("the run's MariaDB did not start: %w", err)
	}
	m, err := launchMySQL(server)
	if err != nil {
		stop()
		return nil, err
	}
	m.own, m.dir, m.pid = proc, dir, proc.PID()
	return m, nil
}

// findBin returns the path of a server program, looked up in PATH and in
// the directories Debian installs them in.
func findBin(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/usr/bin", "/usr/local/bin"} {
		if p := filepath.Join(dir, name); func() bool { _, err := os.Stat(p); return err == nil }() {
			return p
		}
	}
	return ""
}

// launchMySQL makes the run's database on the server at server (a
// mysql:// URL), with the scenarios' tables and the store's.
func launchMySQL(server string) (*mysqlRun, error) {
	var b [6]byte
	rand.Read(b[:])
	m := &mysqlRun{server: server, name: "idemkey_bench_" + hex.EncodeToString(b[:])}
	u, err := url.Parse(server)
	if err != nil {
		return nil, err
	}
	u.Path = "/" + m.name
	m.url = u.String()
	admin, err := openMySQL(server, 1)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+m.name); err != nil {
		return nil, fmt.Errorf("MySQL at %s: %w", server, err)
	}
	var pidFile string
	admin.QueryRowContext(ctx, "SELECT @@pid_file, @@version").Scan(&pidFile, &m.version)
	if b, err := os.ReadFile(pidFile); err == nil {
		m.pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	db, err := openMySQL(m.url, 1)
	if err == nil {
		defer db.Close()
		for _, t := range myTables {
			if _, err = db.ExecContext(ctx, t); err != nil {
				break
			}
		}
	}
	if err == nil {
		err = mysql.Migrate(ctx, db)
	}
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("creating the tables: %w", err)
	}
	return m, nil
}

// Close drops the run's database, or stops the server the driver
// started.
func (m *mysqlRun) Close() {
	if m.own != nil {
		m.own.Kill()
		os.RemoveAll(m.dir)
		return
	}
	if admin, err := openMySQL(m.server, 1); err == nil {
		admin.Exec("DROP DATABASE IF EXISTS " + m.name)
		admin.Close()
	}
}

// CPU returns the server process's CPU time so far.
func (m *mysqlRun) CPU() (time.Duration, error) {
	if m.pid == 0 {
		return 0, nil
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(m.pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// trips returns the statements the server has been sent so far
// (Questions, which counts each COM_QUERY and COM_STMT_EXECUTE, plus
// Com_stmt_prepare): its round trips, the server's whole, so a run's
// scenarios are measured one at a time. The query itself counts one.
func (m *mysqlRun) trips() (int64, error) {
	db, err := openMySQL(m.server, 1)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	rows, err := db.Query("SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Com_stmt_prepare')")
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		var name string
		var v int64
		if err := rows.Scan(&name, &v); err != nil {
			return 0, err
		}
		n += v
	}
	return n, rows.Err()
}

// openMySQL opens the database at a mysql:// URL. Every scenario's
// statements with arguments are interpolated by the driver
// (interpolateParams), as services that care for round trips set it: one
// round trip each, not a prepare and an execute.
func openMySQL(rawURL string, size int) (*sql.DB, error) {
	dsn, err := mysql.DSN(rawURL)
	if err != nil {
		return nil, err
	}
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	cfg.InterpolateParams = true
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(size)
	db.SetMaxIdleConns(size)
	db.SetConnMaxIdleTime(0)
	return db, nil
}

const myInsertPayment = "INSERT INTO bench_payments (k, run, bytes) VALUES (?, ?, ?)"

// myTypicalKey is the context key of my-typical's transaction.
type myTypicalKey struct{}

// myInsert is how a MySQL scenario makes its insert: the way mode says,
// on db.
func myInsert(db *sql.DB, mode insertMode) func(ctx context.Context, key string, run, n int64) error {
	return func(ctx context.Context, key string, run, n int64) error {
		switch mode {
		case ownTx:
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, myInsertPayment, key, run, n); err != nil {
				tx.Rollback()
				return err
			}
			return tx.Commit()
		case autocommit:
			_, err := db.ExecContext(ctx, myInsertPayment, key, run, n)
			return err
		case requestTx:
			tx := mysql.Tx(ctx)
			if tx == nil {
				return errNoRequestTx
			}
			_, err := tx.ExecContext(ctx, myInsertPayment, key, run, n)
			return err
		}
		_, err := ctx.Value(myTypicalKey{}).(*sql.Tx).ExecContext(ctx, myInsertPayment, key, run, n)
		return err
	}
}

// myTypical is pg-typical on MySQL: six round trips on a first run, three
// on a replay. A duplicate that arrives while the first runs waits on the
// row's lock, then fails on the key and answers 409.
type myTypical struct {
	db   *sql.DB
	next http.Handler
}

func (t *myTypical) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, body, ok := readKeyed(w, r)
	if !ok {
		return
	}
	fp := requestHash(r, body)
	hash := hex.EncodeToString(fp[:])
	ctx := r.Context()
	tx, err := t.db.BeginTx(ctx, nil)
	if err != nil {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	defer tx.Rollback()
	var (
		h      string
		status sql.NullInt64
		ct     sql.NullString
		resp   []byte
	)
	err = tx.QueryRowContext(ctx, "SELECT request_hash, status, content_type, body FROM bench_typical_keys WHERE k = ?", key).
		Scan(&h, &status, &ct, &resp)
	switch {
	case err == nil && h != hash:
		http.Error(w, "key reused", http.StatusUnprocessableEntity)
		return
	case err == nil && !status.Valid:
		http.Error(w, "in flight", http.StatusConflict)
		return
	case err == nil:
		wh := w.Header()
		wh.Set("Content-Type", ct.String)
		wh.Set("Idempotent-Replayed", "true")
		wh.Set("Content-Length", strconv.Itoa(len(resp)))
		w.WriteHeader(int(status.Int64))
		w.Write(resp)
		return
	case !errors.Is(err, sql.ErrNoRows):
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO bench_typical_keys (k, request_hash) VALUES (?, ?)", key, hash); err != nil {
		if myErr, ok := errors.AsType[*gomysql.MySQLError](err); ok && myErr.Number == 1062 {
			http.Error(w, "in flight", http.StatusConflict)
			return
		}
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	bw := &bufWriter{h: w.Header()}
	r = r.WithContext(context.WithValue(ctx, myTypicalKey{}, tx))
	r.Body = io.NopCloser(bytes.NewReader(body))
	t.next.ServeHTTP(bw, r)
	if bw.status == 0 {
		bw.status = http.StatusOK
	}
	if bw.status >= 500 {
		bw.send(w)
		return
	}
	if _, err := tx.ExecContext(ctx, "UPDATE bench_typical_keys SET status = ?, content_type = ?, body = ? WHERE k = ?",
		bw.status, w.Header().Get("Content-Type"), bw.body, key); err != nil {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	if err := tx.Commit(); err != nil {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	bw.send(w)
}

// myHandler builds the handler of MySQL scenario sc around a.
func myHandler(sc string, a *app, rawURL string, poolSize int) (http.Handler, func(), error) {
	db, err := openMySQL(rawURL, poolSize)
	if err != nil {
		return nil, nil, err
	}
	if err := dialAll(db, poolSize); err != nil {
		db.Close()
		return nil, nil, err
	}
	closeFn := func() { db.Close() }
	switch sc {
	case scMyBare:
		return &sqlApp{a: a, insert: myInsert(db, ownTx)}, closeFn, nil
	case scMyTypical:
		return &myTypical{db: db, next: &sqlApp{a: a, insert: myInsert(db, typicalTx)}}, closeFn, nil
	}
	// The claim budget is 1 s here, as for PostgreSQL (see pgHandler).
	st, err := mysql.New(context.Background(), db, mysql.WithSweepInterval(0), mysql.WithCallTimeout(time.Second))
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return idemkeySQL(st, sc == scMy, func() { st.Close(); db.Close() }, func(mode insertMode) http.Handler {
		return &sqlApp{a: a, insert: myInsert(db, mode)}
	})
}

// reportMySQL prints the MySQL scenarios' table and targets, reports
// whether a check failed, and returns the targets measured.
func reportMySQL(w io.Writer, version string, scs []string, connsList []int, phases []phase, results map[cellKey]*cellAgg) (bool, []ratioBar) {
	fmt.Fprintf(w, "MySQL (%s): the handler inserts one row; DB round trips are the server's statements (Questions + Com_stmt_prepare), DB CPU the server process's\n", version)
	return reportSQL(w, scMyBare, scMyTypical, scMyTx, scs, connsList, phases, results, []target{
		{"idemkey-my-tx / my-typical", scMyTx, scMyTypical, fresh, 1.2},
		{"idemkey-my-tx / my-typical", scMyTx, scMyTypical, replay, 1.0},
	})
}
