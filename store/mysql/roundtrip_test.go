package mysql_test

import (
	"bytes"
	"context"
	"database/sql"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	drv "github.com/go-sql-driver/mysql"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/mysql"
)

// trips counts round trips to the server on the connections dialled
// through the "idemkey_counted" network: each time a connection reads
// after it wrote.
var trips atomic.Int64

var registerCounted sync.Once

// countedConn counts a round trip at the first read after a write.
type countedConn struct {
	net.Conn
	wrote bool
}

func (c *countedConn) Write(b []byte) (int, error) {
	c.wrote = true
	if bytes.Contains(bytes.ToUpper(b), []byte("SAVEPOINT")) {
		savepoints.Add(1)
	}
	return c.Conn.Write(b)
}

// savepoints counts the writes to the server, on the connections dialled
// through "idemkey_counted", that name a SAVEPOINT: a statement that sets,
// rolls back to or releases one.
var savepoints atomic.Int64

func (c *countedConn) Read(b []byte) (int, error) {
	if c.wrote {
		c.wrote = false
		trips.Add(1)
	}
	return c.Conn.Read(b)
}

// countedDB opens a pool on the shared server whose round trips are
// counted.
func countedDB(t *testing.T) *sql.DB {
	t.Helper()
	sharedDB(t) // skips without a server
	registerCounted.Do(func() {
		drv.RegisterDialContext("idemkey_counted", func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			return &countedConn{Conn: c}, nil
		})
	})
	dsn, err := mysql.DSN(sharedURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := drv.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Net = "idemkey_counted"
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(10)
	db.SetMaxIdleConns(10)
	t.Cleanup(func() { db.Close() })
	return db
}

// TestRoundTrips counts the round trips of each path, as the package
// documentation gives them. A path's work done in the background (letting
// go of the locks after a commit) is counted apart.
func TestRoundTrips(t *testing.T) {
	db := countedDB(t)
	st, _ := newStore(t, db)
	pay := newPayments(t, db)
	// Warm the pool: connections are dialled (and their handshakes made)
	// before anything is counted.
	var conns []*sql.Conn
	for range 4 {
		c, err := db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Close()
	}
	settle := func() {
		for last := trips.Load(); ; {
			time.Sleep(20 * time.Millisecond)
			if n := trips.Load(); n == last {
				return
			}
			last = trips.Load()
		}
	}
	// count returns the round trips f waits for, and those that follow it
	// in the background.
	count := func(f func()) (int64, int64) {
		settle()
		before := trips.Load()
		f()
		during := trips.Load() - before
		settle()
		return during, trips.Load() - before - during
	}
	ctx := context.Background()
	type row struct {
		path           string
		waited, bg     int64
		want, wantBack int64
	}
	var rows []row
	// check counts f's round trips: want waited for, and bg in the
	// background (which may be done before f returns: then they are
	// counted with the waited ones).
	check := func(path string, want, bg int64, f func()) {
		w, b := count(f)
		rows = append(rows, row{path, w, b, want, bg})
	}

	key, c := newKey(), newClaim(1)
	var tx store.Tx
	check("ClaimTx: first run", 4, 0, func() {
		var res store.Result
		var err error
		res, tx, err = st.ClaimTx(ctx, key, c)
		if err != nil || res.State != store.Claimed {
			t.Fatal(res.State, err)
		}
	})
	txctx := tx.NewContext(ctx)
	check("handler's INSERT with an argument", 2, 0, func() {
		if err := pay.insert(txctx, mysql.Tx(txctx), key, "x"); err != nil {
			t.Fatal(err)
		}
	})
	check("ClaimTx: in flight", 1, 0, func() {
		if res, _, err := st.ClaimTx(ctx, key, newClaim(1)); err != nil || res.State != store.InFlight {
			t.Fatal(res.State, err)
		}
	})
	check("ClaimTx: in flight, reused", 1, 0, func() {
		if res, _, err := st.ClaimTx(ctx, key, newClaim(2)); err != nil || res.State != store.InFlight {
			t.Fatal(res.State, err)
		}
	})
	check("Tx.Commit", 2, 2, func() {
		if err := tx.Commit(ctx, record(c.Fingerprint, 201), time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	check("ClaimTx: replay", 1, 0, func() {
		if res, _, err := st.ClaimTx(ctx, key, newClaim(1)); err != nil || res.State != store.Completed {
			t.Fatal(res.State, err)
		}
	})
	key2, c2 := newKey(), newClaim(1)
	check("ClaimTx: first run (2)", 4, 0, func() {
		var res store.Result
		var err error
		res, tx, err = st.ClaimTx(ctx, key2, c2)
		if err != nil || res.State != store.Claimed {
			t.Fatal(res.State, err)
		}
	})
	check("Tx.Commit of a kept 4xx", 3, 2, func() {
		if err := tx.Commit(ctx, record(c2.Fingerprint, 404), time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	key3, c3 := newKey(), newClaim(1)
	if _, tx, _ = st.ClaimTx(ctx, key3, c3); tx == nil {
		t.Fatal("no claim")
	}
	check("Tx.Rollback", 3, 2, func() {
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	})
	var keyless store.Tx
	check("Begin (no key)", 1, 0, func() {
		var err error
		if keyless, err = st.Begin(ctx); err != nil {
			t.Fatal(err)
		}
	})
	check("Tx.Commit (no key) of a 4xx", 1, 2, func() {
		if err := keyless.Commit(ctx, record([32]byte{1}, 404), time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	key4, c4 := newKey(), newClaim(1)
	check("Claim (plain): first run", 2, 1, func() {
		if res, err := st.Claim(ctx, key4, c4); err != nil || res.State != store.Claimed {
			t.Fatal(res.State, err)
		}
	})
	check("Claim (plain): in flight", 1, 0, func() {
		if res, err := st.Claim(ctx, key4, newClaim(2)); err != nil || res.State != store.InFlight {
			t.Fatal(res.State, err)
		}
	})
	check("Extend", 1, 0, func() {
		if err := st.Extend(ctx, key4, c4.Token, time.Minute); err != nil {
			t.Fatal(err)
		}
	})
	check("Complete", 1, 0, func() {
		if err := st.Complete(ctx, key4, c4.Token, record(c4.Fingerprint, 201), time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	check("Complete, resent", 2, 0, func() {
		if err := st.Complete(ctx, key4, c4.Token, record(c4.Fingerprint, 201), time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	check("Claim (plain): replay", 1, 0, func() {
		if res, err := st.Claim(ctx, key4, newClaim(2)); err != nil || res.State != store.Completed {
			t.Fatal(res.State, err)
		}
	})
	key5, c5 := newKey(), newClaim(1)
	st.Claim(ctx, key5, c5)
	check("Release", 1, 0, func() {
		if err := st.Release(ctx, key5, c5.Token); err != nil {
			t.Fatal(err)
		}
	})
	var b strings.Builder
	for _, r := range rows {
		b.WriteString("\n  " + r.path + ": " + itoa(r.waited) + " waited, " + itoa(r.bg) + " in the background")
		if r.waited+r.bg != r.want+r.wantBack || r.waited < r.want {
			t.Errorf("%s: %d round trips waited for and %d in the background, want %d and %d", r.path, r.waited, r.bg, r.want, r.wantBack)
		}
	}
	t.Log("round trips:" + b.String())
	if n := savepoints.Load(); n != 0 {
		t.Errorf("%d statements named a SAVEPOINT, want none on any path", n)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
