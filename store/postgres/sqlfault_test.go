package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkey/idemkey/internal/faultproxy"
	"github.com/idemkey/idemkey/internal/pgtest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// The fault tests of the database/sql face: the same faults as the pgx
// face's, through pgx's database/sql driver.

// insertSQL makes a payment for key through the request's *sql.Tx in ctx.
func (p payments) insertSQL(ctx context.Context, key, by string) error {
	tx := postgres.SQLTx(ctx)
	if tx == nil {
		return errors.New("no request transaction in the context")
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO "+p.name+" (key, made_by) VALUES ($1, $2)", key, by)
	return err
}

// sqlFaultStore returns a NewDB store with the fault tests' budgets on a
// fresh table of the database at url, reached through a database/sql DB
// of maxConns connections (through addr instead, a proxy, when not
// empty).
func sqlFaultStore(t *testing.T, url, addr string, maxConns int, callTimeout time.Duration) (*postgres.Store, *sql.DB, payments) {
	t.Helper()
	if addr == "" {
		url = route(t, url)
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	if addr != "" {
		host, port, _ := net.SplitHostPort(addr)
		n, _ := strconv.Atoi(port)
		cfg.Host, cfg.Port = host, uint16(n)
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(maxConns)
	t.Cleanup(func() { db.Close() })
	pool := newPool(t, url, 2)
	table := newTable(t, pool)
	st, err := postgres.NewDB(context.Background(), db, postgres.WithTable(table), postgres.WithSweepInterval(0),
		postgres.WithCallTimeout(callTimeout), postgres.WithCommitTimeout(faultBudget))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	t.Cleanup(func() {
		for deadline := time.Now().Add(5 * time.Second); db.Stats().InUse != 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		if n := db.Stats().InUse; n != 0 {
			t.Errorf("%d connections still in use after the test", n)
		}
	})
	return st, db, newPayments(t, pool, table)
}

// TestSQLFaultDatabaseDown: with the server killed, and then frozen,
// claims and a commit fail within their budget; a commit sent to a frozen
// server has an unknown outcome, and after the thaw the key holds one
// payment whatever it was.
func TestSQLFaultDatabaseDown(t *testing.T) {
	srv := pgtest.Start(t)
	st, _, pay := sqlFaultStore(t, srv.URL, "", 8, faultBudget)
	ctx := context.Background()
	claimTx(t, st, newKey(), newClaim(1), store.Claimed).Rollback(ctx) // warm

	key := newKey()
	tx := claimTx(t, st, key, newClaim(1), store.Claimed)
	if err := pay.insertSQL(tx.NewContext(ctx), key, "before the freeze"); err != nil {
		t.Fatal(err)
	}
	// And one without a key, whose commit is COMMIT alone.
	keyless, err := st.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pay.insertSQL(keyless.NewContext(ctx), "keyless", "before the freeze"); err != nil {
		t.Fatal(err)
	}
	srv.Freeze()
	d := timed(func() { err = keyless.Commit(ctx, record("a", 1), time.Minute) })
	t.Logf("server frozen: a keyless commit failed after %v: %v", d.Round(time.Millisecond), err)
	if err == nil || d > bound {
		t.Errorf("a keyless commit against a frozen server: %v after %v, want an error within %v", err, d, faultBudget)
	}
	d = timed(func() { err = tx.Commit(ctx, record("a", 1), time.Minute) })
	t.Logf("server frozen: commit failed after %v: %v", d.Round(time.Millisecond), err)
	checkUnavailable(t, "commit", err)
	if errors.Is(err, store.ErrNotOwner) || d > bound {
		t.Errorf("commit took %v (budget %v): %v", d, faultBudget, err)
	}
	var got store.Tx
	d = timed(func() { _, got, err = st.ClaimTx(ctx, newKey(), newClaim(1)) })
	t.Logf("server frozen: ClaimTx failed after %v: %v", d.Round(time.Millisecond), err)
	checkUnavailable(t, "ClaimTx", err)
	if got != nil || d > bound || errors.Is(err, postgres.ErrPoolExhausted) {
		t.Errorf("ClaimTx against a frozen server: %v after %v: %v (the pool was not exhausted)", got, d, err)
	}
	srv.Thaw()
	retryPaysOnce(t, st, pay, key, pay.insertSQL)

	srv.Kill()
	for _, tc := range []struct {
		name  string
		claim func() error
	}{
		{"Claim", func() error { _, err := st.Claim(ctx, newKey(), newClaim(1)); return err }},
		{"ClaimTx", func() error { _, _, err := st.ClaimTx(ctx, newKey(), newClaim(1)); return err }},
	} {
		d := timed(func() { err = tc.claim() })
		t.Logf("server killed: %s failed after %v: %v", tc.name, d.Round(time.Millisecond), err)
		checkUnavailable(t, tc.name, err)
		if d > bound {
			t.Errorf("%s took %v against a dead server, budget %v", tc.name, d, faultBudget)
		}
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(t.Name(), pooledTest) {
		// The pooler refuses logins for its server_login_retry after
		// the failed ones: wait that out first.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if _, err := st.Claim(ctx, newKey(), newClaim(1)); err == nil {
				break
			}
		}
	}
	for i := range 3 {
		if _, err := st.Claim(ctx, newKey(), newClaim(1)); err != nil {
			t.Fatalf("claim %d after the restart: %v", i, err)
		}
	}
	claimTx(t, st, newKey(), newClaim(1), store.Claimed).Rollback(ctx)
}

// TestSQLFaultPoolExhausted: with every connection held by a running
// request, a claim waits for one no longer than its budget, then fails
// with ErrPoolExhausted.
func TestSQLFaultPoolExhausted(t *testing.T) {
	st, _, _ := sqlFaultStore(t, sharedURL(t), "", 2, faultBudget)
	ctx := context.Background()
	a := claimTx(t, st, newKey(), newClaim(1), store.Claimed)
	b := claimTx(t, st, newKey(), newClaim(1), store.Claimed)
	var err error
	d := timed(func() { _, _, err = st.ClaimTx(ctx, newKey(), newClaim(1)) })
	t.Logf("pool exhausted: ClaimTx failed after %v: %v", d.Round(time.Millisecond), err)
	checkUnavailable(t, "ClaimTx", err)
	if !errors.Is(err, postgres.ErrPoolExhausted) || d > bound {
		t.Errorf("ClaimTx with no free connection: %v after %v, want ErrPoolExhausted within %v", err, d, faultBudget)
	}
	if err := a.Commit(ctx, record("a", 1), time.Minute); err != nil {
		t.Fatal(err)
	}
	claimTx(t, st, newKey(), newClaim(1), store.Claimed).Rollback(ctx)
	b.Rollback(ctx)
}

// TestSQLFaultHandlerStatementFailed: a statement of the handler failed
// (the transaction is aborted) and the handler answered as if it had not:
// nothing is kept, nothing is written, and the key is free.
func TestSQLFaultHandlerStatementFailed(t *testing.T) {
	st, _, pay := sqlFaultStore(t, sharedURL(t), "", 4, 10*time.Second)
	ctx := context.Background()
	key := newKey()
	tx := claimTx(t, st, key, newClaim(1), store.Claimed)
	tctx := tx.NewContext(ctx)
	if err := pay.insertSQL(tctx, key, "first"); err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.SQLTx(tctx).ExecContext(tctx, "SELECT 1/0"); err == nil {
		t.Fatal("division by zero succeeded")
	}
	err := tx.Commit(ctx, record("a", 1), time.Minute)
	checkUnavailable(t, "commit after a failed statement", err)
	if n := pay.count(t, key); n != 0 {
		t.Errorf("%d payments after a commit of an aborted transaction, want 0", n)
	}
	claimTx(t, st, key, newClaim(1), store.Claimed).Rollback(ctx)
}

// TestSQLFaultLostCommitReply: every reply to the commit is lost. Commit
// reports an unknown outcome (not ErrNotOwner), and the retry finds what
// the server did, with exactly one payment.
func TestSQLFaultLostCommitReply(t *testing.T) {
	url := sharedURL(t)
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := faultproxy.Start(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	st, _, pay := sqlFaultStore(t, url, proxy.Addr, 1, 5*time.Second)
	ctx := context.Background()
	key := newKey()
	tx := claimTx(t, st, key, newClaim(1), store.Claimed)
	if err := pay.insertSQL(tx.NewContext(ctx), key, "first"); err != nil {
		t.Fatal(err)
	}
	proxy.DropReplies(true)
	d := timed(func() { err = tx.Commit(ctx, record("paid", 1), time.Minute) })
	proxy.DropReplies(false)
	t.Logf("every reply lost (%d bytes): commit failed after %v: %v", proxy.Dropped(), d.Round(time.Millisecond), err)
	checkUnavailable(t, "commit", err)
	if errors.Is(err, store.ErrNotOwner) || d > 2*bound {
		t.Fatalf("commit with its replies lost: %v after %v, want an unknown outcome within the budget", err, d)
	}
	retryPaysOnce(t, st, pay, key, pay.insertSQL)
}
