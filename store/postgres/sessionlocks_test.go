package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestSessionLocksSeesOnlySessionLocks: the check the tests run after a
// request (sessionLocks, and the pooler's when a test ends) counts an
// advisory lock a session holds outside any transaction, and not the
// transaction-scoped locks other clients of the server take meanwhile,
// as other packages' tests do while this one runs (CI runs every
// module's tests at once, on one server): reading pg_locks and
// pg_stat_activity as one snapshot, which they are not, showed such a
// client's locks beside a NULL xact_start when its transaction began or
// ended between the two reads.
func TestSessionLocksSeesOnlySessionLocks(t *testing.T) {
	pool := sharedPool(t)
	others := newPool(t, sharedURL(t), 4)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				tx, err := others.Begin(ctx)
				if err != nil {
					continue
				}
				tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1::bigint), pg_advisory_xact_lock($2::bigint)", 0x5e55+2*i, 0x5e55+2*i+1)
				tx.Commit(ctx)
			}
		})
	}
	deadline := time.Now().Add(3 * time.Second)
	checks, seen := 0, 0
	for ; checks < 300 && time.Now().Before(deadline); checks++ {
		if n := sessionLocks(t, pool); n != 0 {
			seen++
		}
	}
	cancel()
	wg.Wait()
	if seen != 0 {
		t.Errorf("%d of %d checks counted other clients' transaction locks as session locks", seen, checks)
	}

	// A lock held at session level, on an idle connection, is counted.
	conn, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(context.Background(), "SELECT pg_advisory_lock($1::bigint)", 0x5e55); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1::bigint)", 0x5e55)
	if n := sessionLocks(t, pool); n < 1 {
		t.Errorf("a session lock held: the check counted %d, want it counted", n)
	}
	t.Logf("%d checks while other clients took transaction locks", checks)
}
