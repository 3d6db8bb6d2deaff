package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

func rowCount(t testing.TB, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// fillers is how many keys fill makes at once.
const fillers = 8

// fill makes n keys: claims with life, completed with retention when
// retention is not 0. The keys are made fillers at a time, each claim
// (and complete) a transaction of its own, whose commits the server then
// flushes together.
func fill(t testing.TB, st *postgres.Store, n int, life, retention time.Duration) []string {
	t.Helper()
	ctx := context.Background()
	keys := make([]string, n)
	errs := make([]error, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range fillers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				keys[i] = newKey()
				c := newClaim(1)
				c.TTL = life
				res, err := st.Claim(ctx, keys[i], c)
				if err == nil && res.State != store.Claimed {
					err = fmt.Errorf("state %v, want %v", res.State, store.Claimed)
				}
				if err == nil && retention > 0 {
					err = st.Complete(ctx, keys[i], c.Token, record("r", 1), retention)
				}
				errs[i] = err
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("filling: %v", err)
	}
	return keys
}

func TestSweepDeletesExpiredOnly(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool, postgres.WithSweepBatch(7))
	fill(t, st, 30, 10*time.Millisecond, 0)           // claims that lapse
	fill(t, st, 25, time.Minute, 10*time.Millisecond) // records that expire
	live := fill(t, st, 5, time.Minute, 0)            // claims in flight
	kept := fill(t, st, 5, time.Minute, time.Hour)    // records kept
	time.Sleep(50 * time.Millisecond)
	n, err := st.Sweep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n != 55 {
		t.Errorf("swept %d rows, want 55", n)
	}
	if left := rowCount(t, pool, table); left != 10 {
		t.Errorf("%d rows left, want the 10 alive", left)
	}
	for _, k := range live {
		if res, err := st.Claim(context.Background(), k, newClaim(2)); err != nil || res.State != store.InFlight {
			t.Errorf("a live claim after the sweep: %v %v", res.State, err)
		}
	}
	for _, k := range kept {
		if res, err := st.Claim(context.Background(), k, newClaim(2)); err != nil || res.State != store.Completed {
			t.Errorf("a kept record after the sweep: %v %v", res.State, err)
		}
	}
	if n, err := st.Sweep(context.Background()); err != nil || n != 0 {
		t.Errorf("a second sweep: %d, %v", n, err)
	}
}

// TestSweepKeepsTableBounded: a run of unique keys whose records expire
// leaves a table no larger than the records still alive.
func TestSweepKeepsTableBounded(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	const perRound = 200
	var most int
	for round := range 5 {
		fill(t, st, perRound, time.Minute, 20*time.Millisecond)
		most = max(most, rowCount(t, pool, table))
		time.Sleep(40 * time.Millisecond)
		if _, err := st.Sweep(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := rowCount(t, pool, table); n != 0 {
			t.Fatalf("round %d: %d rows after the sweep, want 0", round, n)
		}
	}
	if most > perRound {
		t.Errorf("the table held %d rows, more than one round's %d", most, perRound)
	}
	t.Logf("%d unique keys in 5 rounds; the table never held more than %d rows", 5*perRound, most)
}

// TestSweeperInBackground: New starts a sweeper that deletes expired rows
// every interval; Close stops it.
//
// A sweep whose budget (the interval, 20 ms here) runs out gives up its
// connection, and the server may still run its DELETE after Close has
// returned, having not yet read it: harmless to the store (it deletes
// only expired rows), but such a DELETE is not a sweep after Close. So
// the store has a pool of its own, whose backends the test records, and
// before it checks that nothing is swept after Close it waits for every
// backend whose connection the pool gave up to end.
func TestSweeperInBackground(t *testing.T) {
	shared := sharedPool(t)
	cfg, err := pgxpool.ParseConfig(sharedURL(t))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var backends []uint32
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		mu.Lock()
		defer mu.Unlock()
		backends = append(backends, c.PgConn().PID())
		return nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st, table := newStore(t, pool, postgres.WithSweepInterval(20*time.Millisecond))
	fill(t, st, 50, time.Millisecond, 0)
	deadline := time.Now().Add(10 * time.Second)
	for rowCount(t, shared, table) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still there after 10 s of sweeping every 20 ms", rowCount(t, shared, table))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	kept := map[uint32]bool{}
	for _, c := range pool.AcquireAllIdle(context.Background()) {
		kept[c.Conn().PgConn().PID()] = true
		c.Release()
	}
	mu.Lock()
	opened := slices.Clone(backends)
	mu.Unlock()
	for _, pid := range opened {
		if !kept[pid] {
			waitBackendGone(t, shared, pid, 10*time.Second)
		}
	}
	fill(t, st, 10, time.Millisecond, 0)
	time.Sleep(100 * time.Millisecond)
	if n := rowCount(t, shared, table); n != 10 {
		t.Errorf("%d rows 100 ms after Close, want the 10 expired ones left: the sweeper did not stop", n)
	}
}
