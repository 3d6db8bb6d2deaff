package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	drv "github.com/go-sql-driver/mysql"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/mysql"
)

// TestGaleraOn: the answers to SELECT @@wsrep_on that mean a Galera node,
// and those that do not.
func TestGaleraOn(t *testing.T) {
	unknown := &drv.MySQLError{Number: 1193, Message: "Unknown system variable 'wsrep_on'"}
	for _, tc := range []struct {
		v    sql.NullString
		err  error
		want bool
		fail bool
	}{
		{sql.NullString{}, unknown, false, false}, // MySQL: no such variable
		{sql.NullString{String: "0", Valid: true}, nil, false, false},
		{sql.NullString{String: "OFF", Valid: true}, nil, false, false},
		{sql.NullString{}, nil, false, false},
		{sql.NullString{String: "1", Valid: true}, nil, true, false}, // MariaDB Galera
		{sql.NullString{String: "ON", Valid: true}, nil, true, false},
		{sql.NullString{String: "on", Valid: true}, nil, true, false},
		{sql.NullString{}, &drv.MySQLError{Number: 1045}, false, true}, // any other error
	} {
		on, err := mysql.GaleraOn(tc.v, tc.err)
		if on != tc.want || (err != nil) != tc.fail {
			t.Errorf("galeraOn(%v, %v) = %v, %v; want %v, error %v", tc.v, tc.err, on, err, tc.want, tc.fail)
		}
	}
}

// TestNewChecks: New passes on the real server (no Galera, real named
// locks), and says how to make a missing table, and that a table is not
// the store's.
func TestNewChecks(t *testing.T) {
	db := sharedDB(t)
	ctx := context.Background()
	st, _ := newStore(t, db)
	if st == nil {
		t.Fatal("nil store")
	}
	missing := "idemkey_test_" + randomHex(6)
	_, err := mysql.New(ctx, db, mysql.WithTable(missing), mysql.WithSweepInterval(0))
	if err == nil || !strings.Contains(err.Error(), "mysql.Migrate") {
		t.Fatalf("New on a missing table: %v, want an error naming mysql.Migrate", err)
	}
	other := "idemkey_test_" + randomHex(6)
	if _, err := db.Exec("CREATE TABLE `" + other + "` (k INT)"); err != nil {
		t.Fatal(err)
	}
	dropOnCleanup(t, db, other)
	_, err = mysql.New(ctx, db, mysql.WithTable(other), mysql.WithSweepInterval(0))
	if err == nil || !strings.Contains(err.Error(), "not the store's table") {
		t.Fatalf("New on another table: %v, want an error saying so", err)
	}
	if _, err := mysql.New(ctx, db, mysql.WithTable("Bad-Name")); err == nil {
		t.Fatal("New with a bad table name: nil error")
	}
	if _, err := mysql.New(ctx, nil); err == nil {
		t.Fatal("New with a nil db: nil error")
	}
	one := openDB(t, sharedURL(), 1)
	start := time.Now()
	if _, err := mysql.New(ctx, one, mysql.WithSweepInterval(0)); err == nil || !strings.Contains(err.Error(), "one connection") || time.Since(start) > time.Second {
		t.Fatalf("New on a DB of one connection: %v after %v, want an error at once", err, time.Since(start))
	}
	if _, err := mysql.New(ctx, db, mysql.WithTxOptions(&sql.TxOptions{ReadOnly: true})); err == nil {
		t.Fatal("New with read-only transactions: nil error")
	}
	// A table qualified with its database works too, and Schema names it.
	var cur string
	if err := db.QueryRow("SELECT DATABASE()").Scan(&cur); err != nil {
		t.Fatal(err)
	}
	q := "idemkey_test_" + randomHex(6)
	if err := mysql.Migrate(ctx, db, mysql.WithTable(cur+"."+q)); err != nil {
		t.Fatal(err)
	}
	dropOnCleanup(t, db, q)
	st2, err := mysql.New(ctx, db, mysql.WithTable(cur+"."+q), mysql.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	st2.Close()
	s, err := mysql.Schema(cur + "." + q)
	if err != nil || !strings.Contains(s, "`"+cur+"`.`"+q+"` (") || !strings.Contains(s, "`"+q+"_expires_us`") {
		t.Fatalf("Schema: %v\n%s", err, s)
	}
	if mysql.SchemaSQL == "" || !strings.Contains(mysql.SchemaSQL, "CREATE TABLE IF NOT EXISTS idemkey_records (") {
		t.Fatal("SchemaSQL does not create idemkey_records")
	}
}

// TestDSN: the URL form turns into the driver's DSN.
func TestDSN(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"mysql://root@127.0.0.1:3306/test", "root@tcp(127.0.0.1:3306)/test"},
		{"mysql://app:s%3Acret@db.internal/app", "app:s:cret@tcp(db.internal:3306)/app"},
		{"mysql://app@[::1]:3307/app?timeout=2s", "app@tcp([::1]:3307)/app?timeout=2s"},
		// A DSN of the driver's own passes as it is.
		{"app:s:cret@tcp(db.internal:3306)/app?timeout=2s", "app:s:cret@tcp(db.internal:3306)/app?timeout=2s"},
		{"root@unix(/run/mysqld/mysqld.sock)/test", "root@unix(/run/mysqld/mysqld.sock)/test"},
	} {
		got, err := mysql.DSN(tc.url)
		if err != nil || got != tc.want {
			t.Errorf("DSN(%q) = %q, %v; want %q", tc.url, got, err, tc.want)
		}
	}
	for _, bad := range []string{"postgres://x@h/db", "mysql:///db", "mysql://h/a/b", "mysql://h/db?nosuchparam=%zz", "root@tcp(h:3306)"} {
		if got, err := mysql.DSN(bad); err == nil {
			t.Errorf("DSN(%q) = %q, want an error", bad, got)
		}
	}
}

// TestInspectTransactional: a key held by a request's transaction has no
// committed row; Inspect says it is held, and Delete cannot free it.
func TestInspectTransactional(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	key, c := newKey(), newClaim(1)
	_, tx := claimTx(t, st, key, c)
	e, found, err := st.Inspect(context.Background(), key)
	if err != nil || !found || e.State != store.InFlight || !e.Transactional {
		t.Fatalf("Inspect of a key a transaction holds: %+v %v %v", e, found, err)
	}
	if ok, err := st.Delete(context.Background(), key, e); ok || err != nil {
		t.Fatalf("Delete of a transaction's claim: %v %v, want false", ok, err)
	}
	if err := tx.Commit(context.Background(), record(c.Fingerprint, 201), time.Hour); err != nil {
		t.Fatal(err)
	}
	e, found, err = st.Inspect(context.Background(), key)
	if err != nil || !found || e.State != store.Completed || e.Transactional || e.Record == nil {
		t.Fatalf("Inspect of the record: %+v %v %v", e, found, err)
	}
	stats, err := st.Stats(context.Background())
	if err != nil || stats.Records != 1 {
		t.Fatalf("Stats: %+v %v, want one record", stats, err)
	}
	if _, ok := stats.Detail.(*mysql.TableStats); !ok {
		t.Fatalf("Stats.Detail is %T, want *mysql.TableStats", stats.Detail)
	}
}

// TestSweep: lapsed rows are deleted, live ones kept; a row a request's
// transaction holds is skipped, not waited for.
func TestSweep(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db, mysql.WithSweepBatch(2))
	ctx := context.Background()
	for range 5 {
		c := newClaim(1)
		c.TTL = time.Millisecond
		if res, err := st.Claim(ctx, newKey(), c); err != nil || res.State != store.Claimed {
			t.Fatal(res.State, err)
		}
	}
	live := newKey()
	if res, err := st.Claim(ctx, live, newClaim(1)); err != nil || res.State != store.Claimed {
		t.Fatal(res.State, err)
	}
	// A lapsed row a transaction takes over is held by it.
	held, short := newKey(), newClaim(1)
	short.TTL = time.Millisecond
	if res, err := st.Claim(ctx, held, short); err != nil || res.State != store.Claimed {
		t.Fatal(res.State, err)
	}
	time.Sleep(5 * time.Millisecond)
	_, tx := claimTx(t, st, held, newClaim(2))
	defer tx.Rollback(ctx)
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := st.Sweep(sctx)
	if err != nil || n != 5 {
		t.Fatalf("Sweep: %d %v, want 5 deleted", n, err)
	}
	stats, err := st.Stats(ctx)
	if err != nil || stats.InFlight != 1 || stats.Expired != 1 {
		// The taken-over row is not committed: its committed version is
		// the lapsed claim.
		t.Fatalf("Stats after the sweep: %+v %v, want 1 in flight and 1 expired", stats, err)
	}
}

// TestReleaseOutwaitsAHolder: a plain claim's row is held a moment by
// another transaction (as the sweeper's scan of the expires_us index
// holds the live row where its range ends): Release, Complete and Extend,
// which never wait for a lock, ask again within their budget, rather than
// give up after a few tries and leave the key held for the claim's life
// (TestTakeoverRace failed in about half its runs so).
func TestReleaseOutwaitsAHolder(t *testing.T) {
	db := sharedDB(t)
	st, table := newStore(t, db)
	ctx := context.Background()
	for _, op := range []string{"release", "complete", "extend"} {
		key, c := newKey(), newClaim(1)
		if res, err := st.Claim(ctx, key, c); err != nil || res.State != store.Claimed {
			t.Fatal(res.State, err)
		}
		holder, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var k []byte
		if err := holder.QueryRow("SELECT k FROM `"+table+"` WHERE k = ? FOR UPDATE", key).Scan(&k); err != nil {
			t.Fatal(err)
		}
		time.AfterFunc(80*time.Millisecond, func() { holder.Rollback() })
		switch op {
		case "release":
			err = st.Release(ctx, key, c.Token)
		case "complete":
			err = st.Complete(ctx, key, c.Token, record(c.Fingerprint, 201), time.Hour)
		case "extend":
			err = st.Extend(ctx, key, c.Token, time.Minute)
		}
		if err != nil {
			t.Fatalf("%s of a row held 80 ms: %v", op, err)
		}
	}
}

// TestStartUpBounded: New and Migrate against a server that accepts the
// connection and never answers, with a context that has no deadline,
// fail within the default start-up budget, saying so, where Migrate hung
// for minutes.
func TestStartUpBounded(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // accepted, never answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	dsn, err := mysql.DSN("mysql://root@" + l.Addr().String() + "/test")
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	for name, start := range map[string]func() error{
		"Migrate": func() error { return mysql.Migrate(context.Background(), db) },
		"New": func() error {
			_, err := mysql.New(context.Background(), db, mysql.WithSweepInterval(0))
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			began := time.Now()
			done := make(chan error, 1)
			go func() { done <- start() }()
			select {
			case err := <-done:
				took := time.Since(began)
				if err == nil || !strings.Contains(err.Error(), "did not answer within the start-up budget") {
					t.Fatalf("%s against a server that never answers: %v, want an error saying it did not answer", name, err)
				}
				if took < mysql.DefaultStartTimeout-time.Second {
					t.Fatalf("%s gave up after %v, before the budget (%v)", name, took, mysql.DefaultStartTimeout)
				}
			case <-time.After(mysql.DefaultStartTimeout + 10*time.Second):
				t.Fatalf("%s against a server that never answers still waits after %v", name, time.Since(began))
			}
		})
	}
}

// TestNewReadOnly: a session that takes no writes (tx_read_only, or
// transaction_read_only on MySQL: the DSN's, or the server's default) is
// refused at New with ErrReadOnly, naming the server, rather than
// answering 503 to every request.
func TestNewReadOnly(t *testing.T) {
	db := sharedDB(t)
	table := newTable(t, db)
	var variable string
	if err := db.QueryRow("SELECT IF(VERSION() LIKE '%MariaDB%', 'tx_read_only', 'transaction_read_only')").Scan(&variable); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(sharedURL())
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(variable, "1")
	u.RawQuery = q.Encode()
	ro := openDB(t, u.String(), 5)
	_, err = mysql.New(context.Background(), ro, mysql.WithTable(table), mysql.WithSweepInterval(0))
	if !errors.Is(err, mysql.ErrReadOnly) {
		t.Fatalf("New on a read-only session: %v, want ErrReadOnly", err)
	}
	if !strings.Contains(err.Error(), "database ") {
		t.Fatalf("New's error does not name the server and database: %v", err)
	}
	t.Log(err)
}

// TestRawDigest: a record's RawDigest is kept beside its fingerprint and
// replayed (by the plain and the transactional claim, and Inspect); a
// record without one replays the zero digest.
func TestRawDigest(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	ctx := context.Background()
	for _, raw := range [][32]byte{{7, 7, 7}, {}} {
		key, c := newKey(), newClaim(1)
		_, tx := claimTx(t, st, key, c)
		rec := record(c.Fingerprint, 201)
		rec.RawDigest = raw
		if err := tx.Commit(ctx, rec, time.Hour); err != nil {
			t.Fatal(err)
		}
		res, _, err := st.ClaimTx(ctx, key, newClaim(1))
		if err != nil || res.State != store.Completed || res.Record.RawDigest != raw {
			t.Fatalf("ClaimTx replay: %v %v, raw digest %x, want %x", res.State, err, res.Record.RawDigest[:3], raw[:3])
		}
		if res, err = st.Claim(ctx, key, newClaim(1)); err != nil || res.Record == nil || res.Record.RawDigest != raw {
			t.Fatalf("Claim replay: %v %v, want raw digest %x", res.State, err, raw[:3])
		}
		e, ok, err := st.Inspect(ctx, key)
		if err != nil || !ok || e.Record == nil || e.Record.RawDigest != raw {
			t.Fatalf("Inspect: %v %v %+v, want raw digest %x", ok, err, e.Record, raw[:3])
		}
	}
	// A plain claim's Complete keeps it too.
	key, c := newKey(), newClaim(1)
	if res, err := st.Claim(ctx, key, c); err != nil || res.State != store.Claimed {
		t.Fatal(res.State, err)
	}
	rec := record(c.Fingerprint, 200)
	rec.RawDigest = [32]byte{9}
	if err := st.Complete(ctx, key, c.Token, rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	if res, err := st.Claim(ctx, key, newClaim(1)); err != nil || res.Record == nil || res.Record.RawDigest != rec.RawDigest {
		t.Fatalf("Claim replay after Complete: %v %v, want raw digest 09", res.State, err)
	}
}

// TestMigrateInPlace: a table made by the previous version (no
// raw_digest column) is refused by New, naming Migrate, and brought up to
// date in place by Migrate, rows kept.
func TestMigrateInPlace(t *testing.T) {
	db := sharedDB(t)
	ctx := context.Background()
	name := "idemkey_test_" + randomHex(6)
	old, err := mysql.Schema(name)
	if err != nil {
		t.Fatal(err)
	}
	// The previous version's table: the same, without raw_digest.
	column := "    -- A SHA-256 digest of that request's bytes as they were sent, kept\n" +
		"    -- with the response (NULL while in flight, and when there is none).\n" +
		"    raw_digest   BINARY(32)     NULL,\n"
	if !strings.Contains(old, column) {
		t.Fatal("the schema's raw_digest column is not as this test knows it")
	}
	old = strings.Replace(old, column, "", 1)
	if _, err := db.Exec(old); err != nil {
		t.Fatal(err)
	}
	dropOnCleanup(t, db, name)
	if _, err := db.Exec("INSERT INTO `"+name+"` (k, token, fingerprint, created_us, expires_us) VALUES ('kept', 't', ?, 1, 1)", make([]byte, 32)); err != nil {
		t.Fatal(err)
	}
	_, err = mysql.New(ctx, db, mysql.WithTable(name), mysql.WithSweepInterval(0))
	if err == nil || !strings.Contains(err.Error(), "mysql.Migrate") || !strings.Contains(err.Error(), "earlier version") {
		t.Fatalf("New on a table of the previous version: %v, want an error naming mysql.Migrate", err)
	}
	for range 2 { // the second changes nothing
		if err := mysql.Migrate(ctx, db, mysql.WithTable(name)); err != nil {
			t.Fatal(err)
		}
	}
	st, err := mysql.New(ctx, db, mysql.WithTable(name), mysql.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM `" + name + "` WHERE raw_digest IS NULL").Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows after Migrate: %d %v, want the one kept", n, err)
	}
}
