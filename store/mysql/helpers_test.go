package mysql_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"io"
	"log"
	"os"
	"testing"
	"time"

	drv "github.com/go-sql-driver/mysql"

	"github.com/idemkey/idemkey/internal/proctest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/mysql"
)

// defaultURL is the shared server the tests use when MYSQL_URL is not set.
const defaultURL = "mysql://root@127.0.0.1:3306/test"

// sharedURL returns the shared server's URL (MYSQL_URL, or the local one).
func sharedURL() string {
	if u := os.Getenv("MYSQL_URL"); u != "" {
		return u
	}
	return defaultURL
}

// openDB opens a pool on url with room for maxConns connections, closed
// when the test ends. When the server does not answer, the test is skipped,
// or fails under CI.
func openDB(t testing.TB, url string, maxConns int) *sql.DB {
	t.Helper()
	dsn, err := mysql.DSN(url)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		proctest.Unavailable(t, "no MySQL server at %s (set MYSQL_URL): %v", url, err)
	}
	return db
}

// sharedDB returns a pool on the shared server. Its 40 connections leave
// room under the server's default max_connections (151) for the other
// packages' tests that run at the same time.
func sharedDB(t testing.TB) *sql.DB {
	t.Helper()
	return openDB(t, sharedURL(), 40)
}

// newTable creates a table of the test's own, with a random name, and
// drops it when the test ends: tests on a shared server never touch
// anything else.
func newTable(t testing.TB, db *sql.DB) string {
	t.Helper()
	name := "idemkey_test_" + randomHex(6)
	if err := mysql.Migrate(context.Background(), db, mysql.WithTable(name)); err != nil {
		t.Fatal(err)
	}
	dropOnCleanup(t, db, name)
	return name
}

// dropOnCleanup drops the table name when the test ends.
func dropOnCleanup(t testing.TB, db *sql.DB, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+name+"`"); err != nil {
			// (A server the test killed takes its tables with it.)
			t.Logf("dropping the test's table %s: %v", name, err)
		}
	})
}

// newStore returns a Store on a fresh table of db's database, without the
// background sweeper unless opts ask for one, and with a wide call budget:
// these tests check what the store does on a machine that may be busy (and
// under the race detector); the fault tests check the budget.
func newStore(t testing.TB, db *sql.DB, opts ...mysql.Option) (*mysql.Store, string) {
	t.Helper()
	table := newTable(t, db)
	opts = append([]mysql.Option{mysql.WithTable(table), mysql.WithSweepInterval(0),
		mysql.WithCallTimeout(10 * time.Second)}, opts...)
	st, err := mysql.New(context.Background(), db, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, table
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func newKey() string { return store.KeyName("mytest", rand.Text()) }

func newClaim(fp byte) store.Claim {
	return store.Claim{Token: rand.Text(), Fingerprint: [32]byte{fp}, TTL: time.Minute}
}

// heldLocks counts the claim's named locks (of key, for fingerprint fp)
// that any session holds.
func heldLocks(t testing.TB, db *sql.DB, st *mysql.Store, key string, fp [32]byte) int {
	t.Helper()
	kl, fl := st.Locks(key, fp)
	var n int
	err := db.QueryRow("SELECT (IS_USED_LOCK(?) IS NOT NULL) + (IS_USED_LOCK(?) IS NOT NULL)", kl, fl).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// noLocks waits (up to 5 s) until no session holds the claim's named
// locks, and fails t when one still does: when a request has ended,
// nothing of its claim may stay held on the server. (Its connection lets
// go of them in the background after a commit.)
func noLocks(t testing.TB, db *sql.DB, st *mysql.Store, key string, fp [32]byte) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for heldLocks(t, db, st, key, fp) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the claim's named locks are still held after the request ended")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// payments is a table of the test's own that handlers write to through
// the request's transaction: one row per run of a handler.
type payments struct {
	db   *sql.DB
	name string
}

func newPayments(t testing.TB, db *sql.DB) payments {
	t.Helper()
	name := "idemkey_pay_" + randomHex(6)
	if _, err := db.Exec("CREATE TABLE `" + name + "` (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARBINARY(255) NOT NULL, made_by VARCHAR(64) NOT NULL DEFAULT '', KEY (k)) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	dropOnCleanup(t, db, name)
	return payments{db: db, name: name}
}

// insert writes a payment for key through tx.
func (p payments) insert(ctx context.Context, tx *sql.Tx, key, by string) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO `"+p.name+"` (k, made_by) VALUES (?, ?)", key, by)
	return err
}

// count returns how many payments key has, committed.
func (p payments) count(t testing.TB, key string) int {
	t.Helper()
	var n int
	if err := p.db.QueryRow("SELECT COUNT(*) FROM `"+p.name+"` WHERE k = ?", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// connID returns the server session id of the request's transaction.
func connID(t testing.TB, ctx context.Context) int64 {
	t.Helper()
	var id int64
	if err := mysql.Tx(ctx).QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// claimTx claims key in a transaction and fails t unless it is Claimed.
func claimTx(t testing.TB, st *mysql.Store, key string, c store.Claim) (context.Context, store.Tx) {
	t.Helper()
	res, tx, err := st.ClaimTx(context.Background(), key, c)
	if err != nil {
		t.Fatal(err)
	}
	if res.State != store.Claimed || tx == nil {
		t.Fatalf("ClaimTx of a free key: %v (tx %v), want claimed", res.State, tx != nil)
	}
	return tx.NewContext(context.Background()), tx
}

// untilClaimed claims key in a transaction until it is Claimed, within
// limit, and returns the transaction and how long it took.
func untilClaimed(t testing.TB, st *mysql.Store, key string, c store.Claim, limit time.Duration) (store.Tx, time.Duration) {
	t.Helper()
	start := time.Now()
	for {
		res, tx, err := st.ClaimTx(context.Background(), key, c)
		if err != nil {
			t.Fatal(err)
		}
		if res.State == store.Claimed {
			return tx, time.Since(start)
		}
		if res.State != store.InFlight {
			t.Fatalf("ClaimTx of a key held: %v, want in flight", res.State)
		}
		if time.Since(start) > limit {
			t.Fatalf("the key was not free within %v", limit)
		}
		time.Sleep(time.Millisecond)
	}
}

// record is a kept response for fingerprint fp.
func record(fp [32]byte, status int) *store.Record {
	now := time.Now()
	return &store.Record{Status: status, Body: []byte("kept"), Fingerprint: fp, CreatedAt: now, CompletedAt: now}
}

func init() {
	// The driver logs a connection the server closed (the tests kill
	// sessions on purpose); the store reports what matters itself.
	drv.SetLogger(log.New(io.Discard, "", 0))
}
