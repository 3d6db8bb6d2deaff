package postgres_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/faultproxy"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// proxied returns a pool of one connection to the shared server through a
// proxy that counts round trips, and a tracer on the pool that counts them
// as pgx makes them.
func proxied(t *testing.T) (*pgxpool.Pool, *faultproxy.Proxy, *trips) {
	t.Helper()
	url := sharedURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	p := faultproxy.Start(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, _ := net.SplitHostPort(p.Addr)
	n, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(n)
	cfg.MaxConns = 1
	tr := &trips{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, p, tr
}

// TestRoundTrips counts the round trips of every path through a proxy, on
// one warm connection (each path runs once before it is counted, so that
// pgx has prepared its statements), and prints the table.
func TestRoundTrips(t *testing.T) {
	pool, proxy, trips := proxied(t)
	other := sharedPool(t)
	st, table := newStore(t, pool)
	// The same table through a pool that does not go through the proxy,
	// for the other requests of a path (a live owner, a dead one).
	side, err := postgres.New(context.Background(), other, postgres.WithTable(table), postgres.WithSweepInterval(0), postgres.WithCallTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	pay := newPayments(t, pool, table)
	ctx := context.Background()

	var rows [][2]string
	// measure counts f's round trips, the second time it runs; setup
	// and the cleanup f returns (which hands the connection back) are not
	// counted, but what the store sends once f has returned, until the
	// connection is back in the pool, is. The count is pgx's (each query,
	// batch and prepare is one); the proxy's count must not be lower (it
	// sees every exchange on the wire, and may see more: a pipeline whose
	// replies begin before all of it is written).
	measure := func(name string, want int64, setup func() any, f func(any) func()) {
		t.Helper()
		var got, wire int64
		for range 2 {
			v := setup()
			before, wireBefore := trips.Count(), proxy.Turns()
			done := f(v)
			if done == nil {
				for deadline := time.Now().Add(5 * time.Second); pool.Stat().AcquiredConns() != 0 && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
			}
			got, wire = trips.Count()-before, proxy.Turns()-wireBefore
			if done != nil {
				done()
			}
		}
		rows = append(rows, [2]string{name, fmt.Sprint(got)})
		if got != want || wire < want {
			t.Errorf("%s: %d round trips (%d on the wire), want %d", name, got, wire, want)
		}
	}
	none := func() any { return nil }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	claimed := func(fp byte) func() any {
		return func() any {
			k, c := newKey(), newClaim(fp)
			if res, err := st.Claim(ctx, k, c); err != nil || res.State != store.Claimed {
				t.Fatalf("setup claim: %v %v", res.State, err)
			}
			return [2]string{k, c.Token}
		}
	}
	completed := func() any {
		v := claimed(1)().([2]string)
		must(st.Complete(ctx, v[0], v[1], record("kept", 1), time.Minute))
		return v[0]
	}
	state := func(res store.Result, err error, want store.State) {
		t.Helper()
		if err != nil || res.State != want {
			t.Fatalf("state %v (%v), want %v", res.State, err, want)
		}
	}

	measure("Claim: first run", 1, none, func(any) func() {
		res, err := st.Claim(ctx, newKey(), newClaim(1))
		state(res, err, store.Claimed)
		return nil
	})
	measure("Claim: replay", 1, completed, func(k any) func() {
		res, err := st.Claim(ctx, k.(string), newClaim(1))
		state(res, err, store.Completed)
		return nil
	})
	measure("Claim: in flight", 1, claimed(1), func(v any) func() {
		res, err := st.Claim(ctx, v.([2]string)[0], newClaim(1))
		state(res, err, store.InFlight)
		return nil
	})
	measure("Claim: lapsed row taken over", 1, func() any {
		k, c := newKey(), newClaim(1)
		c.TTL = time.Millisecond
		st.Claim(ctx, k, c)
		time.Sleep(5 * time.Millisecond)
		return k
	}, func(k any) func() {
		res, err := st.Claim(ctx, k.(string), newClaim(1))
		state(res, err, store.Claimed)
		return nil
	})
	measure("Complete", 1, claimed(1), func(v any) func() {
		must(st.Complete(ctx, v.([2]string)[0], v.([2]string)[1], record("kept", 1), time.Minute))
		return nil
	})
	measure("Release", 1, claimed(1), func(v any) func() {
		must(st.Release(ctx, v.([2]string)[0], v.([2]string)[1]))
		return nil
	})
	measure("Extend", 1, claimed(1), func(v any) func() {
		must(st.Extend(ctx, v.([2]string)[0], v.([2]string)[1], time.Hour))
		return nil
	})

	// Transactional: claim, the handler's statements, commit.
	type txv struct {
		key string
		tx  store.Tx
		ctx context.Context
	}
	claimedTx := func() any {
		k := newKey()
		res, tx, err := st.ClaimTx(ctx, k, newClaim(1))
		state(res, err, store.Claimed)
		return txv{k, tx, tx.NewContext(ctx)}
	}
	wrote := func() any {
		v := claimedTx().(txv)
		must(pay.insert(v.ctx, v.key, "x"))
		return v
	}
	measure("ClaimTx: first run", 1, func() any {
		return newKey()
	}, func(k any) func() {
		res, tx, err := st.ClaimTx(ctx, k.(string), newClaim(1))
		state(res, err, store.Claimed)
		return func() { tx.Rollback(ctx) }
	})
	measure("Tx: first statement", 1, claimedTx, func(v any) func() {
		must(pay.insert(v.(txv).ctx, v.(txv).key, "x"))
		return func() { v.(txv).tx.Rollback(ctx) }
	})
	measure("Tx: second statement", 1, wrote, func(v any) func() {
		must(pay.insert(v.(txv).ctx, v.(txv).key, "y"))
		return func() { v.(txv).tx.Rollback(ctx) }
	})
	measure("Tx: Commit after writes", 1, wrote, func(v any) func() {
		must(v.(txv).tx.Commit(ctx, record("kept", 1), time.Minute))
		return nil
	})
	measure("Tx: Commit of a kept 4xx, writes undone", 1, wrote, func(v any) func() {
		rec := record("not found", 1)
		rec.Status = http.StatusNotFound
		must(v.(txv).tx.Commit(ctx, rec, time.Minute))
		return nil
	})
	measure("Tx: Commit without writes", 1, claimedTx, func(v any) func() {
		must(v.(txv).tx.Commit(ctx, record("kept", 1), time.Minute))
		return nil
	})
	measure("Tx: Rollback after writes", 1, wrote, func(v any) func() {
		must(v.(txv).tx.Rollback(ctx))
		return nil
	})
	measure("ClaimTx: replay (+ROLLBACK after the answer)", 2, completed, func(k any) func() {
		res, _, err := st.ClaimTx(ctx, k.(string), newClaim(1))
		state(res, err, store.Completed)
		return nil
	})
	measure("ClaimTx: in flight (+ROLLBACK after the answer)", 2, func() any {
		k := newKey()
		res, tx, err := side.ClaimTx(ctx, k, newClaim(1))
		state(res, err, store.Claimed)
		t.Cleanup(func() { tx.Rollback(ctx) })
		return k
	}, func(k any) func() {
		res, _, err := st.ClaimTx(ctx, k.(string), newClaim(1))
		state(res, err, store.InFlight)
		return nil
	})
	measure("ClaimTx: owner gone, taken over", 1, func() any {
		k := newKey()
		res, tx, err := side.ClaimTx(ctx, k, newClaim(1))
		state(res, err, store.Claimed)
		tctx := tx.NewContext(ctx)
		pid := backendPID(t, tctx)
		var ok bool
		must(other.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", int32(pid)).Scan(&ok))
		t.Cleanup(func() { tx.Rollback(ctx) })
		return k
	}, func(k any) func() {
		res, tx, err := st.ClaimTx(ctx, k.(string), newClaim(1))
		state(res, err, store.Claimed)
		return func() { tx.Rollback(ctx) }
	})
	measure("Sweep: one batch", 1, none, func(any) func() {
		if _, err := st.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		return nil
	})

	var b strings.Builder
	fmt.Fprintf(&b, "%-42s %s\n", "path", "round trips")
	for _, r := range rows {
		fmt.Fprintf(&b, "%-42s %s\n", r[0], r[1])
	}
	t.Logf("round trips:\n%s", b.String())
}
