package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/pgtest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// newPool returns a pool on url with room for maxConns connections, closed
// when the test ends.
func newPool(t testing.TB, url string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// sharedPool returns a pool on the shared server (DATABASE_URL, or the
// local one), skipping the test without one (failing it under CI). Its 40
// connections leave room under the server's default max_connections (100)
// for the other packages' tests that run at the same time.
func sharedPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return newPool(t, sharedURL(t), 40)
}

// sharedURL returns the shared server's URL (DATABASE_URL, or the local
// one), skipping the test without one (failing it under CI); through a
// pooler for a test that runs through one (TestThroughPgBouncer).
func sharedURL(t testing.TB) string {
	t.Helper()
	return route(t, pgtest.Shared(t))
}

// pooledTest prefixes the names of the tests run through a
// transaction-mode pooler.
const pooledTest = "TestThroughPgBouncer/"

var (
	routesMu sync.Mutex
	routes   = map[string]string{} // test name and server URL: the pooler's URL
)

// route returns url, or, for a test run through the pooler, the URL of a
// transaction-mode PgBouncer of the test's own in front of it (one per test
// and server), with pgx's exec mode set to one that works there. When the
// test ends, it checks on the server itself that no session advisory lock
// is left.
func route(t testing.TB, url string) string {
	t.Helper()
	if !strings.HasPrefix(t.Name(), pooledTest) {
		return url
	}
	routesMu.Lock()
	defer routesMu.Unlock()
	id := t.Name() + " " + url
	if u, ok := routes[id]; ok {
		return u
	}
	for _, u := range routes {
		if u == url {
			return url // routed already
		}
	}
	// A client queued for a server connection waits query_wait_timeout
	// (120 s by default) while the server is down, and pgx's close of a
	// connection whose call timed out waits for the pooler to answer:
	// 2 s keeps the fault tests' pools from holding such connections for
	// long.
	b := pgtest.StartPgBouncer(t, url, pgtest.PoolSize(20), pgtest.PgBouncerSetting("query_wait_timeout", "2"))
	u := b.URL + "&default_query_exec_mode=exec"
	routes[id] = u
	t.Cleanup(func() {
		routesMu.Lock()
		delete(routes, id)
		routesMu.Unlock()
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			return
		}
		cfg.MaxConns = 1
		direct, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			return
		}
		defer direct.Close()
		if n, err := sessionLocksOn(direct); err == nil && n != 0 {
			t.Errorf("%d session advisory locks held on the server behind the pooler after the test", n)
		} else if err == nil {
			t.Logf("behind the pooler: no session advisory lock held after the test")
		}
	})
	return u
}

// backendPID returns the process id of the server backend that runs the
// request's transaction in ctx (through a pooler, the client's own PID is
// the pooler's).
func backendPID(t testing.TB, ctx context.Context) uint32 {
	t.Helper()
	var pid uint32
	if err := postgres.Tx(ctx).QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// newTable creates a table of the test's own, with a random name, and
// drops it when the test ends: tests on a shared server never touch
// anything else.
func newTable(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	var b [6]byte
	rand.Read(b[:])
	name := "idemkey_test_" + hex.EncodeToString(b[:])
	if err := postgres.Migrate(context.Background(), pool, postgres.WithTable(name)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{name}.Sanitize()+"; DROP FUNCTION IF EXISTS "+pgx.Identifier{name + "_claim"}.Sanitize())
		if _, ok := errors.AsType[*pgconn.PgError](err); ok {
			// (A server the test killed takes its tables with it.)
			t.Logf("dropping the test's table %s: %v", name, err)
		}
	})
	return name
}

// newStore returns a Store on a fresh table of pool's database, without
// the background sweeper unless opts ask for one, and with a wide call
// budget: these tests check what the store does on a machine that may be
// busy (and under the race detector); the fault tests check the budget.
func newStore(t testing.TB, pool *pgxpool.Pool, opts ...postgres.Option) (*postgres.Store, string) {
	t.Helper()
	table := newTable(t, pool)
	opts = append([]postgres.Option{postgres.WithTable(table), postgres.WithSweepInterval(0),
		postgres.WithCallTimeout(10 * time.Second)}, opts...)
	st, err := postgres.New(context.Background(), pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, table
}

func newKey() string { return store.KeyName("pgtest", rand.Text()) }

func newClaim(fp byte) store.Claim {
	return store.Claim{Token: rand.Text(), Fingerprint: [32]byte{fp}, TTL: time.Minute}
}

// assertNoLocks fails t when the server still holds an advisory lock of a
// claim of key with fingerprint fp, in any session: when a request has
// ended, nothing of its claim may stay held on the server.
func assertNoLocks(t testing.TB, pool *pgxpool.Pool, st *postgres.Store, key string, fp [32]byte) {
	t.Helper()
	l1, l2 := st.Locks(key, fp)
	n := advisoryLocks(t, pool, l1, l2)
	if n != 0 {
		t.Errorf("%d advisory locks of the claim are still held on the server", n)
	}
}

// advisoryLocks counts the advisory locks on ids held in any session of
// the pool's database.
func advisoryLocks(t testing.TB, pool *pgxpool.Pool, ids ...int64) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND ((classid::bigint << 32) | objid::bigint) = ANY ($1)`, ids).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// sessionLocks counts the advisory locks held on the pool's database by
// sessions that have no transaction open: session locks, which follow a
// pooled server connection to its next client. After a request, none may
// be held.
func sessionLocks(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	n, err := sessionLocksOn(pool)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// sessionLocksOn counts the advisory locks on one bigint (the store's
// kind) that backends of pool's database hold outside any transaction.
// pg_locks and pg_stat_activity are two reads, not one snapshot: a
// backend that begins a transaction after the activity is read, or ends
// one before, shows that transaction's locks beside no transaction (and
// the other packages' tests, on the same server at the same time, take
// transaction locks all along). So the backends idle outside a
// transaction are read before and after the locks, and a lock counts only
// when its backend was idle both times with the same state_change: it
// ran no statement in between, so it held the lock outside any
// transaction.
func sessionLocksOn(pool *pgxpool.Pool) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	idle := func() (map[int32]time.Time, error) {
		rows, _ := pool.Query(ctx, `SELECT pid, state_change FROM pg_stat_activity
WHERE datname = current_database() AND state = 'idle' AND xact_start IS NULL`)
		since := map[int32]time.Time{}
		var pid int32
		var at time.Time
		_, err := pgx.ForEachRow(rows, []any{&pid, &at}, func() error {
			since[pid] = at
			return nil
		})
		return since, err
	}
	before, err := idle()
	if err != nil {
		return 0, err
	}
	rows, _ := pool.Query(ctx, `SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	holders, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return 0, err
	}
	after, err := idle()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, pid := range holders {
		b, wasIdle := before[pid]
		a, isIdle := after[pid]
		if wasIdle && isIdle && a.Equal(b) {
			n++
		}
	}
	return n, nil
}

// waitBackendGone waits until the server backend pid has ended, failing
// t when it still runs after within.
func waitBackendGone(t testing.TB, pool *pgxpool.Pool, pid uint32, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for {
		var runs bool
		err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)", int32(pid)).Scan(&runs)
		switch {
		case err != nil:
			t.Fatalf("backend %d still running after %v: %v", pid, within, err)
		case !runs:
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// idle waits (up to 5 s) for every connection of pool to be back in it:
// the store hands back the connection of a transaction that claimed
// nothing in the background, after its ROLLBACK. It returns the pool's
// statistics then.
func idle(pool *pgxpool.Pool) *pgxpool.Stat {
	for deadline := time.Now().Add(5 * time.Second); pool.Stat().AcquiredConns() != 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	return pool.Stat()
}
