package test

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemkey/idemkey/internal/pgtest"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// connectMode connects to url with pgx in the given default_query_exec_mode.
func connectMode(t testing.TB, url, mode string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url+"&default_query_exec_mode="+mode)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func backendPID(t testing.TB, c *pgx.Conn) int {
	t.Helper()
	var pid int
	if err := c.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// lockKey returns a first key for the two-key advisory locks of a test:
// the shared server is shared with other tests, which must not see this
// one's locks.
func lockKey() int32 { return rand.Int32N(1<<30) + 1 }

// advisoryHeld counts the granted advisory locks (k1, k2) on the server,
// held by pid, or by anyone when pid is 0.
func advisoryHeld(ctx context.Context, c *pgx.Conn, k1, k2 int32, pid int) (int, error) {
	var n int
	err := c.QueryRow(ctx, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1::int::oid AND objid = $2::int::oid AND objsubid = 2
		AND granted AND ($3::int = 0 OR pid = $3::int)`, k1, k2, pid).Scan(&n)
	return n, err
}

func TestPgBouncer(t *testing.T) {
	shared := pgtest.Shared(t)
	b := pgtest.StartPgBouncer(t, shared)
	if v, err := pgtest.PgBouncerVersion(); err != nil || v != b.Version {
		t.Fatalf("version %q, %v; the PgBouncer says %q", v, err, b.Version)
	}
	t.Logf("PgBouncer %s at %s, pid %d", b.Version, b.URL, b.PID())
	pid := b.PID()
	if pid == 0 {
		t.Fatal("no PID for a running PgBouncer")
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
		t.Fatalf("pid %d: %v", pid, err)
	}
	c := connectMode(t, b.URL, "exec")
	var sum int
	if err := c.QueryRow(context.Background(), "SELECT $1::int + $2::int", 2, 3).Scan(&sum); err != nil || sum != 5 {
		t.Fatalf("query through PgBouncer: %d, %v", sum, err)
	}
	// The same database as the shared server's.
	var db, direct string
	if err := c.QueryRow(context.Background(), "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	dc := connectMode(t, shared, "exec")
	if err := dc.QueryRow(context.Background(), "SELECT current_database()").Scan(&direct); err != nil || db != direct {
		t.Fatalf("database %q through PgBouncer, %q directly (%v)", db, direct, err)
	}
	if log := b.Log(); log == "(empty log)" {
		t.Error("PgBouncer's log is empty after a connection")
	}

	b.Kill()
	if b.PID() != 0 {
		t.Error("PID after Kill")
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Errorf("pid %d still exists after Kill", pid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.QueryRow(ctx, "SELECT 1").Scan(new(int)); err == nil {
		t.Error("a connection through a killed PgBouncer still answers")
	}
	b.Kill() // a second time does nothing
}

// Close stops PgBouncer with SIGTERM, waits until the process is gone and
// removes its directory.
func TestPgBouncerClose(t *testing.T) {
	shared := pgtest.Shared(t)
	if _, err := pgtest.PgBouncerBin(); err != nil {
		pgtest.Unavailable(t, err)
	}
	b, err := pgtest.LaunchPgBouncer(shared, pgtest.PoolMode("session"), pgtest.PoolSize(2), pgtest.MaxClientConn(5),
		pgtest.PgBouncerSetting("application_name_add_host", "1"))
	if err != nil {
		t.Fatal(err)
	}
	pid := b.PID()
	c := connectMode(t, b.URL, "exec")
	if err := c.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	b.Close()
	t.Logf("stopped in %v", time.Since(start).Round(time.Millisecond))
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Errorf("pid %d still exists after Close", pid)
	}
	if _, err := os.Stat(b.Dir); err == nil {
		t.Errorf("%s still exists after Close", b.Dir)
	}
	b.Close()

	if _, err := pgtest.LaunchPgBouncer(shared, pgtest.PoolMode("sometimes")); err == nil {
		t.Error("started with pool mode \"sometimes\"")
	}
	_, err = pgtest.LaunchPgBouncer(shared, pgtest.PreparedStatements(10))
	if !b.AtLeast(1, 21) {
		if !errors.Is(err, pgtest.ErrNoPreparedStatements) {
			t.Errorf("PgBouncer %s with max_prepared_statements: %v, want ErrNoPreparedStatements", b.Version, err)
		}
	} else if err != nil {
		t.Errorf("PgBouncer %s with max_prepared_statements: %v", b.Version, err)
	}
}

// In transaction mode two clients take turns on one server connection: the
// same backend answers both.
func TestPgBouncerMultiplexes(t *testing.T) {
	b := pgtest.StartPgBouncer(t, pgtest.Shared(t), pgtest.PoolSize(1))
	a := connectMode(t, b.URL, "exec")
	c := connectMode(t, b.URL, "exec")
	pa, pc := backendPID(t, a), backendPID(t, c)
	if pa != pc {
		t.Fatalf("backend %d for one client, %d for the other: not multiplexed", pa, pc)
	}
	if pa2 := backendPID(t, a); pa2 != pa {
		t.Fatalf("backend %d, then %d, with one server connection", pa, pa2)
	}
	t.Logf("both clients on backend %d", pa)
}

// A session-level advisory lock taken outside a transaction outlives the
// statement on the server connection: the next client to get that
// connection holds it without having asked. This is why the store takes
// transaction-level locks only.
func TestPgBouncerLeaksSessionLock(t *testing.T) {
	shared := pgtest.Shared(t)
	b := pgtest.StartPgBouncer(t, shared, pgtest.PoolSize(1))
	ctx := context.Background()
	k1 := lockKey()
	a := connectMode(t, b.URL, "exec")
	if _, err := a.Exec(ctx, "SELECT pg_advisory_lock($1::int, 42)", k1); err != nil {
		t.Fatal(err)
	}
	c := connectMode(t, b.URL, "exec")
	pid := backendPID(t, c)
	n, err := advisoryHeld(ctx, c, k1, 42, pid)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("client B's server connection (backend %d) holds %d of client A's session locks, want 1", pid, n)
	}
	// Seen from outside the pooler too.
	d := connectMode(t, shared, "exec")
	if n, err := advisoryHeld(ctx, d, k1, 42, pid); err != nil || n != 1 {
		t.Fatalf("directly: %d locks held by backend %d (%v), want 1", n, pid, err)
	}
	t.Logf("client A's session lock (%d, 42) is held by backend %d, client B's server connection", k1, pid)
	// B can let go of A's lock: it is the same session.
	var released bool
	if err := c.QueryRow(ctx, "SELECT pg_advisory_unlock($1::int, 42)", k1).Scan(&released); err != nil || !released {
		t.Fatalf("client B releasing client A's lock: %v, %v", released, err)
	}
}

// A client that goes away in a transaction takes its server connection
// with it: the transaction ends on the server and its locks are free a
// moment later, which the store relies on for a quick takeover through
// the pooler.
func TestPgBouncerDisconnectFreesXactLock(t *testing.T) {
	shared := pgtest.Shared(t)
	for _, how := range []string{"close", "abrupt"} {
		t.Run(how, func(t *testing.T) {
			b := pgtest.StartPgBouncer(t, shared, pgtest.PoolSize(1))
			ctx := context.Background()
			k1 := lockKey()
			d := connectMode(t, shared, "exec")
			a := connectMode(t, b.URL, "exec")
			if _, err := a.Exec(ctx, "BEGIN"); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Exec(ctx, "SELECT pg_advisory_xact_lock($1::int, 43)", k1); err != nil {
				t.Fatal(err)
			}
			if n, err := advisoryHeld(ctx, d, k1, 43, 0); err != nil || n != 1 {
				t.Fatalf("%d locks held in the transaction (%v), want 1", n, err)
			}
			start := time.Now()
			switch how {
			case "close": // Terminate, then close the socket
				a.Close(ctx)
			case "abrupt": // the socket only, as a crashed client
				a.PgConn().Conn().Close()
			}
			for {
				n, err := advisoryHeld(ctx, d, k1, 43, 0)
				if err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					break
				}
				if time.Since(start) > 5*time.Second {
					t.Fatalf("the lock is still held %v after the client went away", time.Since(start).Round(time.Millisecond))
				}
				time.Sleep(2 * time.Millisecond)
			}
			t.Logf("lock free %v after the client went away (%s)", time.Since(start).Round(100*time.Microsecond), how)
			// And the pooler still serves.
			c := connectMode(t, b.URL, "exec")
			backendPID(t, c)
		})
	}
}

// execModeResult is what one default_query_exec_mode did through a
// transaction-mode PgBouncer with one server connection.
type execModeResult struct {
	queries, failed int
	first           error
	// The same for the first phase alone, the clients in turns.
	turnQueries, turnFailed int
	codes                   map[string]int // failures by SQLSTATE ("" for others)
}

// runExecMode runs interleaved parameterised queries from two client pools
// through b in mode: first in turns, then concurrently.
func runExecMode(t *testing.T, b *pgtest.PgBouncer, mode string) execModeResult {
	ctx := context.Background()
	var pools [2]*pgxpool.Pool
	for i := range pools {
		cfg, err := pgxpool.ParseConfig(b.URL + "&default_query_exec_mode=" + mode + "&pool_max_conns=2")
		if err != nil {
			t.Fatal(err)
		}
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		pools[i] = p
	}
	var mu sync.Mutex
	r := execModeResult{codes: map[string]int{}}
	record := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		r.queries++
		if err != nil {
			r.failed++
			if r.first == nil {
				r.first = err
			}
			var pe *pgconn.PgError
			if errors.As(err, &pe) {
				r.codes[pe.Code]++
			} else {
				r.codes[""]++
			}
		}
	}
	// Each pool's queries differ in text, parameter count and types, so
	// that a statement of the other pool's is noticed, and the same
	// texts recur, so that cached statements are used again.
	query := func(p int, i int) error {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		pool := pools[p]
		switch i % 3 {
		case 0:
			var got int
			if err := pool.QueryRow(qctx, "SELECT $1::int * 2", i).Scan(&got); err != nil {
				return err
			}
			if got != i*2 {
				return fmt.Errorf("SELECT %d * 2 = %d", i, got)
			}
		case 1:
			var got string
			if err := pool.QueryRow(qctx, "SELECT $1::text || $2::text", "p", strconv.Itoa(p)).Scan(&got); err != nil {
				return err
			}
			if got != "p"+strconv.Itoa(p) {
				return fmt.Errorf("SELECT 'p' || '%d' = %q", p, got)
			}
		case 2:
			var a, c int64
			if err := pool.QueryRow(qctx, "SELECT $1::bigint, $2::bigint + $3::bigint", int64(p), int64(i), int64(1)).Scan(&a, &c); err != nil {
				return err
			}
			if a != int64(p) || c != int64(i+1) {
				return fmt.Errorf("SELECT %d, %d + 1 = %d, %d", p, i, a, c)
			}
		}
		return nil
	}
	for i := range 6 {
		for p := range pools {
			record(query(p, i))
		}
	}
	r.turnQueries, r.turnFailed = r.queries, r.failed
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 30 {
				record(query(g%2, i+g))
			}
		})
	}
	wg.Wait()
	return r
}

// Which of pgx's query exec modes work through a transaction-mode PgBouncer
// without max_prepared_statements, with two clients sharing one server
// connection. The modes that work are asserted to keep working; the others
// are logged.
func TestPgBouncerExecModes(t *testing.T) {
	shared := pgtest.Shared(t)
	working := map[string]bool{"cache_describe": true, "exec": true, "simple_protocol": true}
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			// A PgBouncer of its own: no mode finds another's statements.
			b := pgtest.StartPgBouncer(t, shared, pgtest.PoolSize(1))
			r := runExecMode(t, b, mode)
			if r.failed == 0 {
				t.Logf("%-16s works: %d queries", mode, r.queries)
			} else {
				t.Logf("%-16s fails: %d of %d queries (%d of %d in turns), by SQLSTATE %v, first: %v",
					mode, r.failed, r.queries, r.turnFailed, r.turnQueries, r.codes, r.first)
			}
			if working[mode] && r.failed > 0 {
				t.Errorf("%s no longer works through PgBouncer %s: %d of %d queries failed, first: %v", mode, b.Version, r.failed, r.queries, r.first)
			}
		})
	}
}

// A PgBouncer that exits at start is reported with its log, once (a bad
// setting is not worth another port), and leaves nothing behind.
func TestPgBouncerStartFailure(t *testing.T) {
	shared := pgtest.Shared(t)
	if _, err := pgtest.PgBouncerBin(); err != nil {
		pgtest.Unavailable(t, err)
	}
	b, err := pgtest.LaunchPgBouncer(shared, pgtest.PgBouncerSetting("max_client_conn", "many"))
	if err == nil {
		b.Close()
		t.Fatal("started with max_client_conn = many")
	}
	if n := strings.Count(err.Error(), "FATAL"); !strings.Contains(err.Error(), `invalid value "many"`) || n != 1 {
		t.Errorf("the error does not hold the log of one attempt: %v", err)
	}
	// The log names the configuration file, in the directory that must be
	// gone.
	m := regexp.MustCompile(`\((/[^:)]*)/pgbouncer\.ini:`).FindStringSubmatch(err.Error())
	if m == nil {
		t.Fatalf("no configuration file named in %v", err)
	}
	if _, serr := os.Stat(m[1]); serr == nil {
		t.Errorf("%s left behind", m[1])
	}
}

// In front of a cluster of the test's own, which dies and comes back:
// PgBouncer holds its clients' queries while it cannot reach the server
// (up to query_wait_timeout), and serves again once the server is back.
func TestPgBouncerServerRestart(t *testing.T) {
	srv := pgtest.Start(t)
	b := pgtest.StartPgBouncer(t, srv.URL)
	c := connectMode(t, b.URL, "exec")
	backendPID(t, c)
	srv.Kill()
	qctx, qcancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	err := c.QueryRow(qctx, "SELECT 1").Scan(new(int))
	qcancel()
	if err == nil {
		t.Fatal("a query through PgBouncer succeeded with the server killed")
	}
	t.Logf("with the server killed: %v", err)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		c2, err := pgx.Connect(ctx, b.URL+"&default_query_exec_mode=exec")
		if err == nil {
			err = c2.QueryRow(ctx, "SELECT 1").Scan(new(int))
			c2.Close(context.Background())
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("PgBouncer does not serve again after the server's restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("serving again %v after the server's restart", time.Since(start).Round(time.Millisecond))
}
