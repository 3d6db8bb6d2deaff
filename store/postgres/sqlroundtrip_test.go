package postgres_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkey/idemkey/internal/faultproxy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// TestSQLRoundTrips counts the round trips of the transactional paths
// through database/sql (pgx's driver), on one warm connection through a
// proxy that counts them, and prints the table the package documentation
// gives.
func TestSQLRoundTrips(t *testing.T) {
	cfg, err := pgx.ParseConfig(sharedURL(t))
	if err != nil {
		t.Fatal(err)
	}
	p := faultproxy.Start(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	host, port, _ := net.SplitHostPort(p.Addr)
	n, _ := strconv.Atoi(port)
	cfg.Host, cfg.Port = host, uint16(n)
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	st, table := newSQLStore(t, db)
	pay := newPayments(t, sharedPool(t), table)
	ctx := context.Background()

	var rows []string
	// measure counts f's round trips the second time it runs, until the
	// connection is back in the pool.
	measure := func(name string, want int64, f func()) {
		t.Helper()
		var got int64
		for range 2 {
			// database/sql's driver pings a connection idle for over a
			// second before reusing it: keep it warm.
			db.PingContext(ctx)
			before := p.Turns()
			f()
			for deadline := time.Now().Add(5 * time.Second); db.Stats().InUse != 0 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			got = p.Turns() - before
		}
		rows = append(rows, fmt.Sprintf("%-40s %d", name, got))
		if got != want {
			t.Errorf("%s: %d round trips, want %d", name, got, want)
		}
	}
	firstRun := func(status int) string {
		k, c := newKey(), newClaim(1)
		res, tx, err := st.ClaimTx(ctx, k, c)
		if err != nil || res.State != store.Claimed {
			t.Fatalf("ClaimTx: %v %v", res.State, err)
		}
		tctx := tx.NewContext(ctx)
		if _, err := postgres.SQLTx(tctx).ExecContext(tctx, "INSERT INTO "+pay.name+" (key) VALUES ($1)", k); err != nil {
			t.Fatal(err)
		}
		rec := record("kept", 1)
		rec.Status = status
		if err := tx.Commit(ctx, rec, time.Minute); err != nil {
			t.Fatal(err)
		}
		return k
	}
	measure("first run: claim, insert, commit", 2+1+2, func() { firstRun(201) })
	measure("first run, kept 4xx", 2+1+2, func() { firstRun(404) })
	kept := firstRun(201)
	measure("replay", 3, func() {
		res, tx, err := st.ClaimTx(ctx, kept, newClaim(1))
		if err != nil || res.State != store.Completed || tx != nil {
			t.Fatalf("ClaimTx of a kept key: %v %v", res.State, err)
		}
	})
	measure("rollback", 2+1, func() {
		res, tx, err := st.ClaimTx(ctx, newKey(), newClaim(1))
		if err != nil || res.State != store.Claimed {
			t.Fatalf("ClaimTx: %v %v", res.State, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("round trips through database/sql (BEGIN and the claim are one each; the replay's ROLLBACK is sent after the answer):\n%s", strings.Join(rows, "\n"))
}
