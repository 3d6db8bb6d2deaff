package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// payments is a business table of the test's own: one row per payment a
// handler made, with the idempotency key it ran for.
type payments struct {
	pool *pgxpool.Pool
	name string
}

func newPayments(t testing.TB, pool *pgxpool.Pool, table string) payments {
	t.Helper()
	p := payments{pool: pool, name: pgx.Identifier{table + "_payments"}.Sanitize()}
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+p.name+" (id bigserial PRIMARY KEY, key text NOT NULL, made_by text)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pool.Exec(ctx, "DROP TABLE IF EXISTS "+p.name)
	})
	return p
}

// insert makes a payment for key through the request's transaction in ctx.
func (p payments) insert(ctx context.Context, key, by string) error {
	tx := postgres.Tx(ctx)
	if tx == nil {
		return errors.New("no request transaction in the context")
	}
	_, err := tx.Exec(ctx, "INSERT INTO "+p.name+" (key, made_by) VALUES ($1, $2)", key, by)
	return err
}

// insertPID is insert, and returns the process id of the server backend
// that runs the request's transaction.
func (p payments) insertPID(ctx context.Context, key, by string) (pid uint32, err error) {
	tx := postgres.Tx(ctx)
	if tx == nil {
		return 0, errors.New("no request transaction in the context")
	}
	err = tx.QueryRow(ctx, "INSERT INTO "+p.name+" (key, made_by) VALUES ($1, $2) RETURNING pg_backend_pid()", key, by).Scan(&pid)
	return pid, err
}

// count returns how many payments exist for key, committed.
func (p payments) count(t testing.TB, key string) int {
	t.Helper()
	var n int
	if err := p.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+p.name+" WHERE key = $1", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (p payments) madeBy(t testing.TB, key string) []string {
	t.Helper()
	rows, err := p.pool.Query(context.Background(), "SELECT made_by FROM "+p.name+" WHERE key = $1 ORDER BY id", key)
	if err != nil {
		t.Fatal(err)
	}
	who, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return who
}

func record(body string, fp byte) *store.Record {
	now := time.Now().Truncate(time.Millisecond)
	return &store.Record{Status: 201, Body: []byte(body), Fingerprint: [32]byte{fp}, CreatedAt: now, CompletedAt: now}
}

// claimTx claims key and fails unless the answer is want; it returns the
// transaction (nil unless Claimed or Mine).
func claimTx(t testing.TB, st *postgres.Store, key string, c store.Claim, want store.State) store.Tx {
	t.Helper()
	res, tx, err := st.ClaimTx(context.Background(), key, c)
	if err != nil {
		t.Fatalf("ClaimTx: %v", err)
	}
	if res.State != want {
		t.Fatalf("ClaimTx: state %v, want %v", res.State, want)
	}
	if (tx != nil) != (want == store.Claimed || want == store.Mine) {
		t.Fatalf("ClaimTx %v: tx %v", res.State, tx)
	}
	if tx != nil {
		// A test that fails midway must not leave the transaction open:
		// it would hold the connection (pool.Close waits for it) and
		// locks (the DROP TABLE of the cleanup waits for them). After
		// Commit or Rollback this does nothing.
		t.Cleanup(func() { tx.Rollback(context.Background()) })
	}
	return tx
}

// retryPaysOnce is the retry after a first attempt whose outcome was
// unknown: it claims key once no transaction holds it, replays the record
// the first attempt kept, or else pays (with insert) and commits, and
// fails unless the key then holds exactly one payment. It returns what
// the retry found.
func retryPaysOnce(t *testing.T, st *postgres.Store, pay payments, key string, insert func(ctx context.Context, key, by string) error) store.State {
	t.Helper()
	ctx := context.Background()
	res, retry := claimWhenFree(t, st, key, newClaim(1))
	switch res.State {
	case store.Completed:
		t.Logf("the first attempt's commit ran: the retry replays its record")
	case store.Claimed:
		t.Logf("the first attempt's commit never ran: the retry took the key over and pays")
		if err := insert(retry.NewContext(ctx), key, "retry"); err != nil {
			t.Fatal(err)
		}
		if err := retry.Commit(ctx, record("paid again", 1), time.Minute); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("the retry: %v", res.State)
	}
	if got := pay.madeBy(t, key); len(got) != 1 {
		t.Fatalf("payments %v, want one", got)
	}
	return res.State
}

// claimWhenFree claims key with ClaimTx until the answer is no longer
// InFlight, for up to 10 s, and returns the answer. It is for a key whose
// owner's connection the store has just closed: the server notices a
// closed connection, and lets go of the session's lock, a moment later.
func claimWhenFree(t testing.TB, st *postgres.Store, key string, c store.Claim) (store.Result, store.Tx) {
	t.Helper()
	start := time.Now()
	for {
		res, tx, err := st.ClaimTx(context.Background(), key, c)
		if err != nil {
			t.Fatal(err)
		}
		if tx != nil {
			t.Cleanup(func() { tx.Rollback(context.Background()) })
		}
		if res.State != store.InFlight {
			t.Logf("ClaimTx answered %v after %v", res.State, time.Since(start).Round(time.Microsecond))
			return res, tx
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("still in flight 10 s after its owner's connection was closed")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestTxCommitKeepsRecordAndWrites(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	key, c := newKey(), newClaim(1)
	tx := claimTx(t, st, key, c, store.Claimed)
	ctx := tx.NewContext(context.Background())
	if err := pay.insert(ctx, key, "first"); err != nil {
		t.Fatal(err)
	}
	// Not visible outside the transaction before the commit.
	if n := pay.count(t, key); n != 0 {
		t.Fatalf("%d payments visible before the commit", n)
	}
	// Another request sees the key in flight: the owner is alive. A
	// repeat of the owner's request is told it is the same one; another
	// request, that it is not (its claim's fingerprint is not the one
	// answered).
	res, other, err := st.ClaimTx(context.Background(), key, newClaim(1))
	if err != nil || res.State != store.InFlight || res.Fingerprint != c.Fingerprint || other != nil {
		t.Fatalf("a repeat while the owner runs: %v %v %v", res.State, other, err)
	}
	c2 := newClaim(2)
	res, other, err = st.ClaimTx(context.Background(), key, c2)
	if err != nil || res.State != store.InFlight || res.Fingerprint == c2.Fingerprint || other != nil {
		t.Fatalf("another request while the owner runs: %v %v %v", res.State, other, err)
	}
	if res.ClaimedAt.IsZero() || res.TTL <= 0 || res.TTL > c.TTL {
		t.Errorf("in flight: ClaimedAt %v, TTL %v; want when the owner began, and at most the claim's life %v", res.ClaimedAt, res.TTL, c.TTL)
	}
	rec := record("paid", 1)
	if err := tx.Commit(context.Background(), rec, time.Minute); err != nil {
		t.Fatal(err)
	}
	if n := pay.count(t, key); n != 1 {
		t.Fatalf("%d payments after the commit, want 1", n)
	}
	res, other, err = st.ClaimTx(context.Background(), key, newClaim(1))
	if err != nil || res.State != store.Completed || other != nil || string(res.Record.Body) != "paid" {
		t.Fatalf("after the commit: %v %+v %v", res.State, res.Record, err)
	}
	// Once ended, the handler's transaction refuses further use.
	if _, err := postgres.Tx(ctx).Exec(context.Background(), "SELECT 1"); !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("Exec after the commit: %v, want pgx.ErrTxClosed", err)
	}
	if err := tx.Commit(context.Background(), rec, time.Minute); err == nil {
		t.Error("a second Commit succeeded")
	}
	if s := idle(pool); s.AcquiredConns() != 0 {
		t.Errorf("%d connections still acquired", s.AcquiredConns())
	}
}

func TestTxCommitWithoutWrites(t *testing.T) {
	pool := sharedPool(t)
	st, _ := newStore(t, pool)
	key, c := newKey(), newClaim(1)
	tx := claimTx(t, st, key, c, store.Claimed)
	if err := tx.Commit(context.Background(), record("bad request", 1), time.Minute); err != nil {
		t.Fatal(err)
	}
	res, err := st.Claim(context.Background(), key, newClaim(1))
	if err != nil || res.State != store.Completed || string(res.Record.Body) != "bad request" {
		t.Fatalf("after the commit: %v %v", res.State, err)
	}
}

func TestTxRollbackUndoesWritesAndReleases(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	key := newKey()
	for _, wrote := range []bool{true, false} {
		tx := claimTx(t, st, key, newClaim(1), store.Claimed)
		if wrote {
			if err := pay.insert(tx.NewContext(context.Background()), key, "rolled back"); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Rollback(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := pay.count(t, key); n != 0 {
			t.Fatalf("%d payments after the rollback", n)
		}
	}
	// The key is free for the next request, which runs and commits.
	tx := claimTx(t, st, key, newClaim(1), store.Claimed)
	if err := pay.insert(tx.NewContext(context.Background()), key, "second"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(context.Background(), record("ok", 1), time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := pay.madeBy(t, key); len(got) != 1 || got[0] != "second" {
		t.Fatalf("payments %v, want the second run's alone", got)
	}
}

// insertWithin inserts a payment through the request's transaction in
// ctx and returns its server backend's process id; life, started no
// later than start, is the claim's. When the insert failed after the life
// was over, it reports outrun: the lapse tests give their claims short
// lives, which a loaded machine can outrun between the claim and the
// insert, and such a round shows nothing (they run it again with a
// longer life). Any other failure fails t.
func insertWithin(t testing.TB, ctx context.Context, pay payments, key, by string, start time.Time, life time.Duration) (pid uint32, outrun bool) {
	t.Helper()
	pid, err := pay.insertPID(ctx, key, by)
	if err != nil {
		if time.Since(start) >= life {
			t.Logf("the insert came after the claim's life of %v (%v): again, with twice the life", life, err)
			return 0, true
		}
		t.Fatal(err)
	}
	return pid, false
}

// maxLapseLife bounds the lives the lapse tests double to.
const maxLapseLife = 10 * time.Second

// TestTxLapsedOwnerIsFenced: the owner outlives its claim, another
// request takes the key over and commits, and the late owner's commit
// keeps nothing.
func TestTxLapsedOwnerIsFenced(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	ctx := context.Background()
	for life := 200 * time.Millisecond; ; life *= 2 {
		if life > maxLapseLife {
			t.Fatalf("every round outran its claim's life, up to %v", life/2)
		}
		key := newKey()
		a := newClaim(1)
		a.TTL = life
		start := time.Now()
		txA := claimTx(t, st, key, a, store.Claimed)
		owner, outrun := insertWithin(t, txA.NewContext(ctx), pay, key, "late owner", start, life)
		if outrun {
			txA.Rollback(ctx)
			continue
		}
		// The owner is alive: before its life ends the key is in flight.
		res, other, err := st.ClaimTx(ctx, key, newClaim(1))
		if other != nil {
			other.Rollback(ctx)
		}
		if err != nil || res.State != store.InFlight {
			if time.Since(start) >= life {
				t.Logf("the repeat came after the claim's life of %v (%v %v): again, with twice the life", life, res.State, err)
				txA.Rollback(ctx)
				continue
			}
			t.Fatalf("a claim while the owner lives: %v %v, want in flight", res.State, err)
		}
		// At its life the owner's transaction is ended, its session with
		// it.
		waitBackendGone(t, pool, owner, life+10*time.Second)
		txB := claimTx(t, st, key, newClaim(1), store.Claimed)
		if err := pay.insert(txB.NewContext(ctx), key, "new owner"); err != nil {
			t.Fatal(err)
		}
		if err := txB.Commit(ctx, record("b", 1), time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := txA.Commit(ctx, record("a", 1), time.Minute); !errors.Is(err, store.ErrNotOwner) {
			t.Fatalf("the late owner's commit: %v, want store.ErrNotOwner", err)
		}
		if got := pay.madeBy(t, key); len(got) != 1 || got[0] != "new owner" {
			t.Fatalf("payments %v, want the new owner's alone", got)
		}
		res, err = st.Claim(ctx, key, newClaim(1))
		if err != nil || res.State != store.Completed || string(res.Record.Body) != "b" {
			t.Fatalf("kept: %v %v", res.State, err)
		}
		if s := idle(pool); s.AcquiredConns() != 0 {
			t.Errorf("%d connections still acquired", s.AcquiredConns())
		}
		return
	}
}

// TestTxLateCommitNeverLands: an owner that outlives its claim's life
// (the route's deadline plus the margin) has its transaction ended at
// that life, whether or not anyone took the key over: its commit keeps
// nothing, its writes are gone, and the key is free.
func TestTxLateCommitNeverLands(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	ctx := context.Background()
	for life := 50 * time.Millisecond; ; life *= 2 {
		if life > maxLapseLife {
			t.Fatalf("every round outran its claim's life, up to %v", life/2)
		}
		key := newKey()
		a := newClaim(1)
		a.TTL = life
		start := time.Now()
		tx := claimTx(t, st, key, a, store.Claimed)
		owner, outrun := insertWithin(t, tx.NewContext(ctx), pay, key, "slow", start, life)
		if outrun {
			tx.Rollback(ctx)
			continue
		}
		waitBackendGone(t, pool, owner, life+10*time.Second)
		if err := tx.Commit(ctx, record("slow", 1), time.Minute); !errors.Is(err, store.ErrNotOwner) {
			t.Fatalf("a commit after the claim's life: %v, want store.ErrNotOwner", err)
		}
		if n := pay.count(t, key); n != 0 {
			t.Fatalf("%d payments, want none", n)
		}
		claimTx(t, st, key, newClaim(1), store.Claimed).Rollback(ctx)
		assertNoLocks(t, pool, st, key, a.Fingerprint)
		return
	}
}

// TestTxLateCommitAfterTheServerEndedIt: when the server has ended the
// owner's session at the claim's life (the idle timeout the claim set)
// before the store's watchdog ran, as a busy machine can make it, a
// commit after that life still answers store.ErrNotOwner, as it does when
// the watchdog ran first: not an outage, and nothing kept.
func TestTxLateCommitAfterTheServerEndedIt(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	ctx := context.Background()
	key := newKey()
	a := newClaim(1)
	a.TTL = 300 * time.Millisecond
	tx := claimTx(t, st, key, a, store.Claimed)
	st.StopWatchdog(tx)
	owner, err := pay.insertPID(tx.NewContext(ctx), key, "slow")
	if err != nil {
		t.Fatal(err)
	}
	waitBackendGone(t, pool, owner, a.TTL+10*time.Second)
	if err := tx.Commit(ctx, record("slow", 1), time.Minute); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("a commit after the server ended the claim's transaction: %v, want store.ErrNotOwner", err)
	}
	if n := pay.count(t, key); n != 0 {
		t.Fatalf("%d payments, want none", n)
	}
	claimTx(t, st, key, newClaim(1), store.Claimed).Rollback(ctx)
}

// TestTxLateCommitFencedOnTheServer: the fence holds without the store's
// watchdog too: a keep sent after the claim's life, on a connection that
// is still open, finds the life over on the database's clock and rolls
// back.
func TestTxLateCommitFencedOnTheServer(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	key := newKey()
	a := newClaim(1)
	a.TTL = time.Second
	tx := claimTx(t, st, key, a, store.Claimed)
	ctx := tx.NewContext(context.Background())
	if err := pay.insert(ctx, key, "slow"); err != nil {
		t.Fatal(err)
	}
	// Hold the transaction busy on the server past the claim's life, in
	// one statement shorter than the statement timeout the claim set,
	// then commit at once, before the watchdog can fire.
	if _, err := postgres.Tx(ctx).Exec(ctx, "SELECT pg_sleep(0.9)"); err != nil {
		t.Fatal(err)
	}
	st.ShiftLife(tx, -time.Second)
	if err := tx.Commit(context.Background(), record("slow", 1), time.Minute); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("a keep after the claim's life: %v, want store.ErrNotOwner", err)
	}
	if n := pay.count(t, key); n != 0 {
		t.Fatalf("%d payments, want none", n)
	}
}

// TestTxTerminatedOwnerIsTakenOver: the owner's backend is terminated
// mid-handler; the next request takes the key over at once (no waiting
// for the claim's life), and only its payment exists.
func TestTxTerminatedOwnerIsTakenOver(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	key := newKey()
	a := newClaim(1)
	a.TTL = time.Hour
	txA := claimTx(t, st, key, a, store.Claimed)
	ctxA := txA.NewContext(context.Background())
	if err := pay.insert(ctxA, key, "terminated"); err != nil {
		t.Fatal(err)
	}
	pid := backendPID(t, ctxA)
	var ok bool
	// Wait (up to 5 s) until the backend has exited.
	if err := pool.QueryRow(context.Background(), "SELECT pg_terminate_backend($1, 5000)", int32(pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend: %v %v", ok, err)
	}
	start := time.Now()
	txB := claimTx(t, st, key, newClaim(1), store.Claimed)
	t.Logf("taken over %v after the owner's backend ended (claim life 1h)", time.Since(start).Round(time.Microsecond))
	if err := pay.insert(txB.NewContext(context.Background()), key, "retry"); err != nil {
		t.Fatal(err)
	}
	if err := txB.Commit(context.Background(), record("b", 1), time.Minute); err != nil {
		t.Fatal(err)
	}
	err := txA.Commit(context.Background(), record("a", 1), time.Minute)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("the terminated owner's commit: %v, want store.ErrUnavailable", err)
	}
	t.Logf("the terminated owner's commit: %v", err)
	if got := pay.madeBy(t, key); len(got) != 1 || got[0] != "retry" {
		t.Fatalf("payments %v, want the retry's alone", got)
	}
}

func TestTxConcurrentOneKey(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool, postgres.WithCallTimeout(10*time.Second))
	pay := newPayments(t, pool, table)
	for round := range 3 {
		key := newKey()
		const n = 64
		states := make([]store.State, n)
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				res, tx, err := st.ClaimTx(context.Background(), key, newClaim(1))
				states[i], errs[i] = res.State, err
				if tx == nil {
					return
				}
				ctx := tx.NewContext(context.Background())
				if err := pay.insert(ctx, key, fmt.Sprint(i)); err != nil {
					errs[i] = err
					tx.Rollback(context.Background())
					return
				}
				errs[i] = tx.Commit(context.Background(), record("once", 1), time.Minute)
			})
		}
		close(start)
		wg.Wait()
		count := map[store.State]int{}
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("round %d: request %d: %v", round, i, errs[i])
			}
			count[states[i]]++
		}
		t.Logf("round %d: %v", round, count)
		if count[store.Claimed] != 1 || count[store.Claimed]+count[store.InFlight]+count[store.Completed] != n {
			t.Fatalf("round %d: %v, want one claimed and the rest in flight or completed", round, count)
		}
		if c := pay.count(t, key); c != 1 {
			t.Fatalf("round %d: %d payments, want 1", round, c)
		}
	}
}

// TestTxOwnerGone: a ClaimTx whose connection died (terminated on the
// server) took its claim with it: the same request claims the key afresh
// at once, and another request then finds a live owner.
func TestTxOwnerGone(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	ctx := context.Background()

	key, c := newKey(), newClaim(1)
	first := claimTx(t, st, key, c, store.Claimed)
	pid := backendPID(t, first.NewContext(ctx))
	var ok bool
	if err := pool.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", int32(pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend: %v %v", ok, err)
	}
	again := claimTx(t, st, key, c, store.Claimed)
	claimTx(t, st, key, newClaim(1), store.InFlight)
	if err := pay.insert(again.NewContext(ctx), key, "again"); err != nil {
		t.Fatal(err)
	}
	if err := again.Commit(ctx, record("again", 1), time.Minute); err != nil {
		t.Fatal(err)
	}
	if n := pay.count(t, key); n != 1 {
		t.Fatalf("%d payments", n)
	}
	if err := first.Rollback(ctx); err == nil {
		t.Log("the dead transaction's rollback answered nil")
	}
	assertNoLocks(t, pool, st, key, c.Fingerprint)
	if n := sessionLocks(t, pool); n != 0 {
		t.Errorf("%d session advisory locks held", n)
	}
}

// TestTxCommitRefused: the server refuses the COMMIT (a deferred
// constraint the handler's write breaks). Nothing is kept, the failure is
// not ErrNotOwner, the key is free for the next request (transactional or
// not), and no advisory lock is left behind.
func TestTxCommitRefused(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	ctx := context.Background()
	checked := pgx.Identifier{table + "_checked"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+checked+` (n int, CONSTRAINT small EXCLUDE USING btree (n WITH =) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+checked) })
	if _, err := pool.Exec(ctx, "INSERT INTO "+checked+" VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	key, c := newKey(), newClaim(1)
	tx := claimTx(t, st, key, c, store.Claimed)
	tctx := tx.NewContext(ctx)
	// Accepted now, checked at COMMIT.
	if _, err := postgres.Tx(tctx).Exec(tctx, "INSERT INTO "+checked+" VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	err := tx.Commit(ctx, record("refused", 1), time.Minute)
	if !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("commit refused by the server: %v, want ErrUnavailable", err)
	}
	t.Logf("commit refused: %v", err)
	assertNoLocks(t, pool, st, key, c.Fingerprint)
	if res, err := st.Claim(ctx, key, newClaim(1)); err != nil || res.State != store.Claimed {
		t.Fatalf("a plain claim after the refused commit: %v %v, want the key free", res.State, err)
	}
}

// TestLateWritesUndone: a goroutine the handler left running keeps writing
// through the request's pgx.Tx while the store ends it without keeping
// anything. As TestSQLLateWritesUndone: none of those writes commits, on
// the request's connection or on the one the pool hands out next.
func TestLateWritesUndone(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	lateWritesUndone(t, st, pay, 20, pay.insert)
}

// lateWritesUndone: a goroutine the handler left running keeps writing
// (insert) through the request's transaction while the store ends it
// without keeping anything (a 5xx's rollback, a commit refused), rounds
// times each. None of those writes commits: the key is free after, and its
// retry runs the handler again, so a write that landed would be made
// twice.
func lateWritesUndone(t *testing.T, st *postgres.Store, pay payments, rounds int, insert func(ctx context.Context, key, by string) error) {
	for _, tc := range []struct {
		name string
		end  func(tx store.Tx) error
	}{
		{"Rollback", func(tx store.Tx) error { return tx.Rollback(context.Background()) }},
		{"CommitRefused", func(tx store.Tx) error { return tx.Commit(context.Background(), nil, time.Hour) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for round := range rounds {
				key, c := newKey(), newClaim(1)
				tx := claimTx(t, st, key, c, store.Claimed)
				ctx := tx.NewContext(context.Background())
				var wrote atomic.Int64
				stopped := make(chan error, 1)
				go func() {
					for {
						if err := insert(ctx, key, "late"); err != nil {
							stopped <- err
							return
						}
						wrote.Add(1)
					}
				}()
				for wrote.Load() < 3 {
					time.Sleep(time.Millisecond)
				}
				tc.end(tx)
				err := <-stopped
				if n := pay.count(t, key); n != 0 {
					t.Fatalf("round %d: %d of the late writes committed (the writer stopped with %v), want 0", round, n, err)
				}
				claimTx(t, st, key, newClaim(1), store.Claimed).Rollback(context.Background())
			}
		})
	}
}
