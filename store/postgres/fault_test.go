package postgres_test

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/faultproxy"
	"github.com/idemkey/idemkey/internal/pgtest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// The fault tests run against a cluster of their own (or a proxy in front
// of the shared server) and report what each fault did with t.Logf.
// Elapsed times are checked against the call budget with a wide margin:
// they show that a call is bounded, not how fast it is.

const faultBudget = 300 * time.Millisecond

// bound is how long a call may take under a fault: its budget and a wide
// margin for a loaded machine.
const bound = faultBudget + 2*time.Second

func timed(f func()) time.Duration {
	start := time.Now()
	f()
	return time.Since(start)
}

// faultStore returns a store with the default budgets on a fresh table of
// url's database, warmed: its pool holds open connections whose
// statements are prepared, so that a fault hits the path a running
// service takes.
func faultStore(t *testing.T, url string, maxConns int32) (*postgres.Store, *pgxpool.Pool, payments) {
	t.Helper()
	url = route(t, url)
	pool := newPool(t, url, maxConns)
	table := newTable(t, pool)
	st, err := postgres.New(context.Background(), pool, postgres.WithTable(table), postgres.WithSweepInterval(0),
		postgres.WithCallTimeout(faultBudget), postgres.WithCommitTimeout(faultBudget))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	t.Cleanup(func() {
		// When every request has ended, nothing of any claim is held on
		// the server: no session lock, no open transaction of the store.
		if idle(pool).AcquiredConns() != 0 {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Errorf("%d connections still acquired after the test:\n%s", pool.Stat().AcquiredConns(), buf)
		}
		if n, err := sessionLocksOn(pool); err == nil && n != 0 {
			t.Errorf("%d session advisory locks held after the test", n)
		}
	})
	pay := newPayments(t, pool, table)
	// Every connection of the pool at once, so that each is dialled and
	// has prepared the statements, with a budget wide enough for a busy
	// machine: the faults are what the test measures, not the warm-up.
	warm, err := postgres.New(context.Background(), pool, postgres.WithTable(table), postgres.WithSweepInterval(0),
		postgres.WithCallTimeout(10*time.Second), postgres.WithCommitTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Close()
	txs := make([]store.Tx, maxConns)
	keys := make([]string, maxConns)
	for i := range txs {
		keys[i] = newKey()
		txs[i] = claimTx(t, warm, keys[i], newClaim(1), store.Claimed)
		if err := pay.insert(txs[i].NewContext(context.Background()), keys[i], "warm"); err != nil {
			t.Fatal(err)
		}
	}
	for i, tx := range txs {
		if err := tx.Commit(context.Background(), record("warm", 1), time.Minute); err != nil {
			t.Fatal(err)
		}
		claimTx(t, warm, keys[i], newClaim(1), store.Completed)
		st.Claim(context.Background(), keys[i], newClaim(1))
	}
	return st, pool, pay
}

func checkUnavailable(t *testing.T, op string, err error) {
	t.Helper()
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("%s: %v, want an error wrapping store.ErrUnavailable", op, err)
	}
}

// TestFaultDatabaseDown: with the server killed, a claim fails within its
// budget, and the store works again once the server is back.
func TestFaultDatabaseDown(t *testing.T) {
	srv := pgtest.Start(t)
	st, _, _ := faultStore(t, srv.URL, 8)
	srv.Kill()
	for _, tc := range []struct {
		name  string
		claim func() error
	}{
		{"Claim", func() error { _, err := st.Claim(context.Background(), newKey(), newClaim(1)); return err }},
		{"ClaimTx", func() error { _, _, err := st.ClaimTx(context.Background(), newKey(), newClaim(1)); return err }},
	} {
		var err error
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
	// The pool's connections died with the server: each call drops the
	// dead ones it meets and tries another, so the store answers again at
	// once. (A pooler in between refuses logins for its
	// server_login_retry after the failed ones: wait that out first.)
	if strings.HasPrefix(t.Name(), pooledTest) {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if _, err := st.Claim(context.Background(), newKey(), newClaim(1)); err == nil {
				break
			}
		}
	}
	for i := range 3 {
		if _, err := st.Claim(context.Background(), newKey(), newClaim(1)); err != nil {
			t.Fatalf("claim %d after the restart: %v", i, err)
		}
	}
	claimTx(t, st, newKey(), newClaim(1), store.Claimed).Rollback(context.Background())
}

// TestFaultDatabaseFrozen: with every process of the server stopped
// (SIGSTOP), claims and a commit fail within their budget, and the handler
// of a claim that failed never runs.
func TestFaultDatabaseFrozen(t *testing.T) {
	srv := pgtest.Start(t)
	st, _, pay := faultStore(t, srv.URL, 8)
	ctx := context.Background()

	// A request that claimed before the freeze and commits during it.
	key := newKey()
	tx := claimTx(t, st, key, newClaim(1), store.Claimed)
	if err := pay.insert(tx.NewContext(ctx), key, "before the freeze"); err != nil {
		t.Fatal(err)
	}
	srv.Freeze()
	var err error
	d := timed(func() { err = tx.Commit(ctx, record("a", 1), time.Minute) })
	t.Logf("server frozen: commit failed after %v: %v", d.Round(time.Millisecond), err)
	checkUnavailable(t, "commit", err)
	if errors.Is(err, store.ErrNotOwner) || d > bound {
		t.Errorf("commit took %v (budget %v): %v", d, faultBudget, err)
	}
	var res store.Result
	var got store.Tx
	d = timed(func() { res, got, err = st.ClaimTx(ctx, newKey(), newClaim(1)) })
	t.Logf("server frozen: ClaimTx failed after %v: %v", d.Round(time.Millisecond), err)
	checkUnavailable(t, "ClaimTx", err)
	if got != nil || res.State != 0 || d > bound {
		t.Errorf("ClaimTx against a frozen server: %v %v after %v", res.State, got, d)
	}
	srv.Thaw()

	// The commit's pipeline sat in the frozen backend's socket when the
	// store gave up and closed the connection. Thawed, the backend may
	// still read and run it before it sees the connection gone: the
	// outcome was unknown, as the error said. Either it committed, and
	// the retry replays it, or the transaction died with the connection,
	// its lock with it, and the retry takes the key over as soon as the
	// server has seen that. Either way, one payment.
	retryPaysOnce(t, st, pay, key, pay.insert)
}

// TestFaultPoolExhausted: with every connection held by a running request,
// a claim waits for one no longer than its budget, then fails.
func TestFaultPoolExhausted(t *testing.T) {
	st, _, _ := faultStore(t, sharedURL(t), 2)
	ctx := context.Background()
	a := claimTx(t, st, newKey(), newClaim(1), store.Claimed)
	claimTx(t, st, newKey(), newClaim(1), store.Claimed)
	var err error
	d := timed(func() { _, _, err = st.ClaimTx(ctx, newKey(), newClaim(1)) })
	t.Logf("pool exhausted: ClaimTx failed after %v: %v", d.Round(time.Millisecond), err)
	checkUnavailable(t, "ClaimTx", err)
	if d > bound {
		t.Errorf("ClaimTx waited %v for a connection, budget %v", d, faultBudget)
	}
	// Plain claims need a connection too.
	_, err = st.Claim(ctx, newKey(), newClaim(1))
	checkUnavailable(t, "Claim", err)
	// A connection handed back serves the next request.
	if err := a.Commit(ctx, record("a", 1), time.Minute); err != nil {
		t.Fatal(err)
	}
	claimTx(t, st, newKey(), newClaim(1), store.Claimed)
}

// TestFaultLostCommitReply: the commit's pipeline reaches the server and
// every reply is lost on the way back. Commit reports a failure that is
// not ErrNotOwner (its outcome is unknown: the middleware answers 503),
// and the retry finds what the server did, with exactly one payment:
//
//   - warm: the connection had prepared the commit's statements, so the
//     pipeline ran and committed; the retry gets the record;
//   - cold: the commit's statements were new on the connection, so pgx
//     prepared them first, and that reply was lost: nothing committed, the
//     connection was closed (its transaction rolled back, its lock
//     released), and the retry takes the key over at once and runs.
func TestFaultLostCommitReply(t *testing.T) {
	for _, warm := range []bool{true, false} {
		name := map[bool]string{true: "warm", false: "cold"}[warm]
		t.Run(name, func(t *testing.T) {
			url := sharedURL(t)
			cfg, err := pgxpool.ParseConfig(url)
			if err != nil {
				t.Fatal(err)
			}
			proxy := faultproxy.Start(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
			host, port, _ := net.SplitHostPort(proxy.Addr)
			n, _ := strconv.Atoi(port)
			cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(n)
			cfg.MaxConns = 1 // the warm-up and the request share it
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			table := newTable(t, pool)
			st, err := postgres.New(context.Background(), pool, postgres.WithTable(table), postgres.WithSweepInterval(0),
				postgres.WithCallTimeout(5*time.Second), postgres.WithCommitTimeout(faultBudget))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			pay := newPayments(t, pool, table)
			ctx := context.Background()
			if warm {
				k := newKey()
				tx := claimTx(t, st, k, newClaim(1), store.Claimed)
				if err := pay.insert(tx.NewContext(ctx), k, "warm"); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(ctx, record("warm", 1), time.Minute); err != nil {
					t.Fatal(err)
				}
			}

			key := newKey()
			tx := claimTx(t, st, key, newClaim(1), store.Claimed)
			if err := pay.insert(tx.NewContext(ctx), key, "first"); err != nil {
				t.Fatal(err)
			}
			proxy.DropReplies(true)
			d := timed(func() { err = tx.Commit(ctx, record("paid", 1), time.Minute) })
			proxy.DropReplies(false)
			t.Logf("every reply lost (%d bytes): commit failed after %v: %v", proxy.Dropped(), d.Round(time.Millisecond), err)
			checkUnavailable(t, "commit", err)
			if errors.Is(err, store.ErrNotOwner) {
				t.Fatalf("commit with its reply lost: %v, want an unknown outcome, not ErrNotOwner", err)
			}
			if d > bound {
				t.Errorf("commit took %v, budget %v", d, faultBudget)
			}
			res, retry := claimWhenFree(t, st, key, newClaim(1))
			if warm {
				if res.State != store.Completed || retry != nil || string(res.Record.Body) != "paid" {
					t.Fatalf("the retry: %v, want the record replayed", res.State)
				}
				t.Logf("the retry replayed the record")
			} else {
				if res.State != store.Claimed {
					t.Fatalf("the retry: %v, want the key taken over", res.State)
				}
				if err := pay.insert(retry.NewContext(ctx), key, "retry"); err != nil {
					t.Fatal(err)
				}
				if err := retry.Commit(ctx, record("paid again", 1), time.Minute); err != nil {
					t.Fatal(err)
				}
				t.Logf("the retry took the key over and ran")
			}
			if got := pay.madeBy(t, key); len(got) != 1 {
				t.Fatalf("payments %v, want one", got)
			}
		})
	}
}
