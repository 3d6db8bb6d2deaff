package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/mysql"
)

// TestClaimTx: a transactional claim holds the key with its two named
// locks; a repeat of the same request is in flight with its fingerprint,
// another request with another; the commit keeps the record and lets go
// of the locks, and repeats replay it.
func TestClaimTx(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	pay := newPayments(t, db)
	key, c := newKey(), newClaim(1)
	ctx, tx := claimTx(t, st, key, c)
	if n := heldLocks(t, db, st, key, c.Fingerprint); n != 2 {
		t.Fatalf("%d of the claim's named locks held, want 2", n)
	}
	if err := pay.insert(ctx, mysql.Tx(ctx), key, "first"); err != nil {
		t.Fatal(err)
	}
	same := newClaim(1)
	res, tx2, err := st.ClaimTx(context.Background(), key, same)
	if err != nil || res.State != store.InFlight || res.Fingerprint != c.Fingerprint || tx2 != nil {
		t.Fatalf("ClaimTx of the same request in flight = %v %x %v; want in flight with its fingerprint", res.State, res.Fingerprint[:1], err)
	}
	other := newClaim(2)
	res, _, err = st.ClaimTx(context.Background(), key, other)
	if err != nil || res.State != store.InFlight || res.Fingerprint == other.Fingerprint {
		t.Fatalf("ClaimTx of another request in flight = %v %x %v; want in flight with another fingerprint", res.State, res.Fingerprint[:1], err)
	}
	// The plain claim agrees, and does not wait for the transaction's row.
	res, err = st.Claim(context.Background(), key, other)
	if err != nil || res.State != store.InFlight || res.Fingerprint == other.Fingerprint {
		t.Fatalf("Claim of a key a transaction holds = %v %v; want in flight with another fingerprint", res.State, err)
	}
	// The answers in flight took nothing: the owner still holds both.
	if n := heldLocks(t, db, st, key, c.Fingerprint); n != 2 {
		t.Fatalf("%d of the claim's named locks held after the repeats, want 2", n)
	}
	if n := pay.count(t, key); n != 0 {
		t.Fatalf("%d payments visible before the commit, want 0", n)
	}
	rec := record(c.Fingerprint, 201)
	if err := tx.Commit(context.Background(), rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	if n := pay.count(t, key); n != 1 {
		t.Fatalf("%d payments after the commit, want 1", n)
	}
	noLocks(t, db, st, key, c.Fingerprint)
	for _, claim := range []store.Claim{newClaim(1), newClaim(2)} {
		res, tx, err := st.ClaimTx(context.Background(), key, claim)
		if err != nil || res.State != store.Completed || tx != nil || res.Record == nil || string(res.Record.Body) != "kept" || res.Record.Status != 201 {
			t.Fatalf("ClaimTx after the commit = %+v %v; want the record replayed", res, err)
		}
		if res.Fingerprint != c.Fingerprint {
			t.Fatalf("replay: fingerprint %x, want the record's", res.Fingerprint[:1])
		}
	}
}

// TestRollbackFrees: a rollback undoes the handler's writes and frees the
// key at once.
func TestRollbackFrees(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	pay := newPayments(t, db)
	key, c := newKey(), newClaim(1)
	ctx, tx := claimTx(t, st, key, c)
	if err := pay.insert(ctx, mysql.Tx(ctx), key, "first"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := heldLocks(t, db, st, key, c.Fingerprint); n != 0 {
		t.Fatalf("%d named locks held after the rollback, want 0", n)
	}
	if n := pay.count(t, key); n != 0 {
		t.Fatalf("%d payments after the rollback, want 0", n)
	}
	_, tx2 := claimTx(t, st, key, newClaim(2))
	tx2.Rollback(context.Background())
}

// TestExactlyOnceTx: 32 requests race for one key, under each isolation
// level, five rounds; each that claims writes a payment and commits, the
// others try again until they see the record. Exactly one payment per
// key, and every racer ends with the record.
func TestExactlyOnceTx(t *testing.T) {
	db := sharedDB(t)
	for _, level := range []sql.IsolationLevel{sql.LevelDefault, sql.LevelRepeatableRead, sql.LevelReadCommitted} {
		t.Run(level.String(), func(t *testing.T) {
			st, _ := newStore(t, db, mysql.WithTxOptions(&sql.TxOptions{Isolation: level}))
			pay := newPayments(t, db)
			const racers, rounds = 32, 5
			for round := range rounds {
				key := newKey()
				var wg sync.WaitGroup
				var mu sync.Mutex
				claimed, replayed := 0, 0
				errs := make(chan error, racers)
				for i := range racers {
					wg.Go(func() {
						c := newClaim(7)
						for attempt := 0; ; attempt++ {
							res, tx, err := st.ClaimTx(context.Background(), key, c)
							if err != nil {
								errs <- err
								return
							}
							switch res.State {
							case store.Claimed:
								ctx := tx.NewContext(context.Background())
								if err := pay.insert(ctx, mysql.Tx(ctx), key, fmt.Sprint(i)); err != nil {
									errs <- err
									tx.Rollback(context.Background())
									return
								}
								if err := tx.Commit(context.Background(), record(c.Fingerprint, 201), time.Hour); err != nil {
									errs <- err
									return
								}
								mu.Lock()
								claimed++
								mu.Unlock()
								return
							case store.Completed:
								mu.Lock()
								replayed++
								mu.Unlock()
								return
							case store.InFlight:
								if res.Fingerprint != c.Fingerprint {
									errs <- fmt.Errorf("in flight with another fingerprint")
									return
								}
								time.Sleep(time.Millisecond)
							}
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatalf("round %d: %v", round, err)
				}
				if claimed != 1 || replayed != racers-1 {
					t.Fatalf("round %d: %d claimed and %d replayed, want 1 and %d", round, claimed, replayed, racers-1)
				}
				if n := pay.count(t, key); n != 1 {
					t.Fatalf("round %d: %d payments, want 1", round, n)
				}
			}
		})
	}
}

// TestKillTakeover: an owner whose session is killed (its process died,
// its connection dropped) is replaced at once: the next claim gets the
// key, and the dead owner's write is gone.
func TestKillTakeover(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	pay := newPayments(t, db)
	key, c := newKey(), newClaim(1)
	ctx, tx := claimTx(t, st, key, c)
	if err := pay.insert(ctx, mysql.Tx(ctx), key, "dead"); err != nil {
		t.Fatal(err)
	}
	id := connID(t, ctx)
	if _, err := db.Exec(fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
		t.Fatal(err)
	}
	tx2, took := untilClaimed(t, st, key, newClaim(2), 5*time.Second)
	t.Logf("the key was claimed again %v after its owner's session was killed", took)
	if n := pay.count(t, key); n != 0 {
		t.Fatalf("%d payments of the killed owner, want 0", n)
	}
	// The dead owner cannot keep anything now.
	err := tx.Commit(context.Background(), record(c.Fingerprint, 201), time.Hour)
	if err == nil {
		t.Fatal("Commit of a killed owner: nil, want an error")
	}
	if err := tx2.Commit(context.Background(), record([32]byte{2}, 201), time.Hour); err != nil {
		t.Fatal(err)
	}
}

// TestLiveOwnerPastTTL: an owner that outlives its claim's life has its
// session killed at the TTL: a retry claims the key then, and the late
// owner's Commit keeps nothing (ErrNotOwner), its write gone.
func TestLiveOwnerPastTTL(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	pay := newPayments(t, db)
	key, c := newKey(), newClaim(1)
	c.TTL = 500 * time.Millisecond
	ctx, tx := claimTx(t, st, key, c)
	start := time.Now()
	if err := pay.insert(ctx, mysql.Tx(ctx), key, "late"); err != nil {
		t.Fatal(err)
	}
	retry := newClaim(1)
	tx2, _ := untilClaimed(t, st, key, retry, 10*time.Second)
	if took := time.Since(start); took < c.TTL {
		t.Fatalf("a live owner's key was taken after %v, before its TTL %v", took, c.TTL)
	}
	err := tx.Commit(context.Background(), record(c.Fingerprint, 201), time.Hour)
	if !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Commit after the claim's life: %v, want ErrNotOwner", err)
	}
	ctx2 := tx2.NewContext(context.Background())
	if err := pay.insert(ctx2, mysql.Tx(ctx2), key, "retry"); err != nil {
		t.Fatal(err)
	}
	if err := tx2.Commit(context.Background(), record(retry.Fingerprint, 201), time.Hour); err != nil {
		t.Fatal(err)
	}
	var by string
	if err := db.QueryRow("SELECT GROUP_CONCAT(made_by) FROM `"+pay.name+"` WHERE k = ?", key).Scan(&by); err != nil {
		t.Fatal(err)
	}
	if by != "retry" {
		t.Fatalf("payments made by %q, want only the retry's", by)
	}
}

// TestHandlerEndsTx: the handler commits or rolls back the request's
// transaction itself (or runs DDL, which commits it). That never makes a
// second run nor loses a record.
func TestHandlerEndsTx(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	pay := newPayments(t, db)
	// state claims key again with fingerprint fp and returns the answer.
	state := func(key string, fp byte) store.State {
		t.Helper()
		res, tx, err := st.ClaimTx(context.Background(), key, newClaim(fp))
		if err != nil {
			t.Fatal(err)
		}
		if tx != nil {
			tx.Rollback(context.Background())
		}
		return res.State
	}
	ddl := func(ctx context.Context) error {
		_, err := mysql.Tx(ctx).ExecContext(ctx, "CREATE TABLE IF NOT EXISTS `"+pay.name+"_ddl` (id INT)")
		dropOnCleanup(t, db, pay.name+"_ddl")
		return err
	}
	commit := func(ctx context.Context) error { return mysql.Tx(ctx).Commit() }
	// lockTables takes LOCK TABLES on the payments (which commits the
	// transaction, as DDL does) and writes a second payment under it.
	lockTables := func(ctx context.Context) error {
		if _, err := mysql.Tx(ctx).ExecContext(ctx, "LOCK TABLES `"+pay.name+"` WRITE"); err != nil {
			return err
		}
		return pay.insert(ctx, mysql.Tx(ctx), lockedKey(ctx), "under LOCK TABLES")
	}
	for _, tc := range []struct {
		name   string
		end    func(ctx context.Context) error
		status int // 0: the middleware rolls back (a 5xx)
		// What follows: the error of Commit or Rollback, the key's state,
		// and the payments.
		wantErr  bool
		want     store.State
		payments int
	}{
		{"CommitThen201", commit, 201, false, store.Completed, 1},
		{"CommitThen5xx", commit, 0, true, store.InFlight, 1},
		{"CommitThen400", commit, 400, false, store.Completed, 1},
		{"RollbackThen201", func(ctx context.Context) error { return mysql.Tx(ctx).Rollback() }, 201, true, store.Claimed, 0},
		{"RollbackThen5xx", func(ctx context.Context) error { return mysql.Tx(ctx).Rollback() }, 0, false, store.Claimed, 0},
		{"DDLThen201", ddl, 201, false, store.Completed, 1},
		{"DDLThen5xx", ddl, 0, true, store.InFlight, 1},
		{"DDLThen400", ddl, 400, false, store.Completed, 1},
		{"LockTablesThen201", lockTables, 201, false, store.Completed, 2},
		{"LockTablesThen5xx", lockTables, 0, true, store.InFlight, 1},
		{"LockTablesThen400", lockTables, 400, false, store.Completed, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, c := newKey(), newClaim(1)
			ctx, tx := claimTx(t, st, key, c)
			ctx = context.WithValue(ctx, lockedKeyKey{}, key)
			if err := pay.insert(ctx, mysql.Tx(ctx), key, "handler"); err != nil {
				t.Fatal(err)
			}
			if err := tc.end(ctx); err != nil {
				t.Fatal(err)
			}
			var err error
			if tc.status == 0 {
				err = tx.Rollback(context.Background())
			} else {
				err = tx.Commit(context.Background(), record(c.Fingerprint, tc.status), time.Hour)
			}
			if (err != nil) != tc.wantErr {
				t.Fatalf("ending the request: %v, want error %v", err, tc.wantErr)
			}
			if err != nil && !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("ending the request: %v, want it to wrap ErrUnavailable", err)
			}
			noLocks(t, db, st, key, c.Fingerprint)
			if got := state(key, 1); got != tc.want {
				t.Fatalf("the key is %v after, want %v", got, tc.want)
			}
			if n := pay.count(t, key); n != tc.payments {
				t.Fatalf("%d payments, want %d", n, tc.payments)
			}
		})
	}
}

type lockedKeyKey struct{}

// lockedKey is the key TestHandlerEndsTx's case runs.
func lockedKey(ctx context.Context) string { return ctx.Value(lockedKeyKey{}).(string) }

// TestClientErrorUndone: a kept 4xx keeps its answer and undoes the
// handler's writes (rolled back to the savepoint), unless
// WithClientErrorWrites(true).
func TestClientErrorUndone(t *testing.T) {
	db := sharedDB(t)
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprint("writes=", keep), func(t *testing.T) {
			st, _ := newStore(t, db, mysql.WithClientErrorWrites(keep))
			pay := newPayments(t, db)
			key, c := newKey(), newClaim(1)
			ctx, tx := claimTx(t, st, key, c)
			if err := pay.insert(ctx, mysql.Tx(ctx), key, "refused"); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(context.Background(), record(c.Fingerprint, 422), time.Hour); err != nil {
				t.Fatal(err)
			}
			want := 0
			if keep {
				want = 1
			}
			if n := pay.count(t, key); n != want {
				t.Fatalf("%d payments after a kept 422, want %d", n, want)
			}
			res, _, err := st.ClaimTx(context.Background(), key, newClaim(1))
			if err != nil || res.State != store.Completed || res.Record.Status != 422 {
				t.Fatalf("after a kept 422: %v %v, want it replayed", res.State, err)
			}
		})
	}
}

// TestBeginNoKey: a request without a key runs in a transaction that
// commits its writes and keeps nothing.
func TestBeginNoKey(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	pay := newPayments(t, db)
	for _, commit := range []bool{true, false} {
		tx, err := st.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		ctx := tx.NewContext(context.Background())
		key := newKey()
		if err := pay.insert(ctx, mysql.Tx(ctx), key, "nokey"); err != nil {
			t.Fatal(err)
		}
		want := 0
		if commit {
			want = 1
			err = tx.Commit(context.Background(), &store.Record{Status: 201}, time.Hour)
		} else {
			err = tx.Rollback(context.Background())
		}
		if err != nil {
			t.Fatal(err)
		}
		if n := pay.count(t, key); n != want {
			t.Fatalf("commit %v: %d payments, want %d", commit, n, want)
		}
	}
}

// TestPlainAndTxShareTable: plain claims and transactional ones on the
// same table never both hold a key.
func TestPlainAndTxShareTable(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	// A plain claim in flight answers a transactional one.
	key, c := newKey(), newClaim(1)
	if res, err := st.Claim(context.Background(), key, c); err != nil || res.State != store.Claimed {
		t.Fatalf("Claim: %v %v", res.State, err)
	}
	res, tx, err := st.ClaimTx(context.Background(), key, newClaim(1))
	if err != nil || res.State != store.InFlight || tx != nil || res.Fingerprint != c.Fingerprint {
		t.Fatalf("ClaimTx of a key a plain claim holds: %v %v", res.State, err)
	}
	// Its own token is not a transaction's.
	res, tx, err = st.ClaimTx(context.Background(), key, c)
	if err != nil || res.State != store.InFlight || tx != nil {
		t.Fatalf("ClaimTx with the plain claim's token: %v %v, want in flight", res.State, err)
	}
	if err := st.Release(context.Background(), key, c.Token); err != nil {
		t.Fatal(err)
	}
	// A lapsed plain claim is taken over by a transaction, and then a
	// plain claim meets the transaction.
	short := newClaim(1)
	short.TTL = 50 * time.Millisecond
	if res, err := st.Claim(context.Background(), key, short); err != nil || res.State != store.Claimed {
		t.Fatalf("Claim: %v %v", res.State, err)
	}
	tx2, _ := untilClaimed(t, st, key, newClaim(2), 5*time.Second)
	plain := newClaim(3)
	if res, err := st.Claim(context.Background(), key, plain); err != nil || res.State != store.InFlight {
		t.Fatalf("Claim of a key a transaction took over: %v %v, want in flight", res.State, err)
	}
	if err := st.Complete(context.Background(), key, short.Token, record(short.Fingerprint, 201), time.Hour); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Complete by the lapsed plain owner: %v, want ErrNotOwner", err)
	}
	if err := tx2.Commit(context.Background(), record([32]byte{2}, 201), time.Hour); err != nil {
		t.Fatal(err)
	}
	res, err = st.Claim(context.Background(), key, plain)
	if err != nil || res.State != store.Completed || res.Fingerprint != [32]byte{2} {
		t.Fatalf("Claim after the transaction committed: %v %v, want its record", res.State, err)
	}
}

// TestWait: a repeat waits for the request in flight and wakes when it
// commits; a key no transaction holds for the request answers false at
// once.
func TestWait(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	key, c := newKey(), newClaim(1)
	ctx := context.Background()
	if ok, err := st.Wait(ctx, key, c); ok || err != nil {
		t.Fatalf("Wait on a free key: %v %v, want false", ok, err)
	}
	_, tx := claimTx(t, st, key, c)
	woke := make(chan time.Time, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		ok, err := st.Wait(wctx, key, newClaim(1))
		if !ok || err != nil {
			t.Errorf("Wait on a key in flight: %v %v, want true", ok, err)
		}
		woke <- time.Now()
	}()
	// The waiter waits while the owner runs.
	select {
	case <-woke:
		t.Fatal("Wait returned while the owner still ran")
	case <-time.After(100 * time.Millisecond):
	}
	committed := time.Now()
	if err := tx.Commit(ctx, record(c.Fingerprint, 201), time.Hour); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-woke:
		t.Logf("the waiter woke %v after the commit", at.Sub(committed))
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after the owner committed")
	}
	res, _, err := st.ClaimTx(ctx, key, newClaim(1))
	if err != nil || res.State != store.Completed {
		t.Fatalf("after the wait: %v %v, want the record", res.State, err)
	}
	// A wait whose time is up answers true (claim again to learn more).
	key2 := newKey()
	_, tx2 := claimTx(t, st, key2, c)
	defer tx2.Rollback(ctx)
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if ok, err := st.Wait(wctx, key2, newClaim(1)); !ok || err != nil {
		t.Fatalf("Wait whose time is up: %v %v, want true", ok, err)
	}
	// (The server's own timer ends the wait, to the millisecond.)
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Fatalf("Wait returned after %v, before its time was up, while the owner ran", took)
	}
}

// TestLateWritesUndone: a goroutine the handler left running keeps writing
// through the request's transaction while the store ends it without
// keeping anything (a 5xx's rollback, a commit refused). None of those
// writes commits: the key is free after, and its retry runs the handler
// again, so a write that landed would be made twice.
func TestLateWritesUndone(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	pay := newPayments(t, db)
	for _, tc := range []struct {
		name string
		end  func(tx store.Tx) error
	}{
		{"Rollback", func(tx store.Tx) error { return tx.Rollback(context.Background()) }},
		// A record the store refuses to keep: the transaction is rolled
		// back, as after a keep that failed.
		{"CommitRefused", func(tx store.Tx) error {
			return tx.Commit(context.Background(), record([32]byte{1}, -1), time.Hour)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for round := range 10 {
				key, c := newKey(), newClaim(1)
				ctx, tx := claimTx(t, st, key, c)
				sqlTx := mysql.Tx(ctx)
				var wrote atomic.Int64
				stopped := make(chan error, 1)
				go func() {
					for {
						if err := pay.insert(context.Background(), sqlTx, key, "late"); err != nil {
							stopped <- err
							return
						}
						wrote.Add(1)
					}
				}()
				for wrote.Load() < 3 {
					time.Sleep(time.Millisecond)
				}
				// (The late writes and the store's statements share the
				// session: one of them may find it busy, and then the
				// session is closed, which rolls back too.)
				tc.end(tx)
				err := <-stopped
				noLocks(t, db, st, key, c.Fingerprint)
				if n := pay.count(t, key); n != 0 {
					t.Fatalf("round %d: %d of the late writes committed (the writer stopped with %v), want 0", round, n, err)
				}
				tx2, _ := untilClaimed(t, st, key, newClaim(1), 5*time.Second)
				tx2.Rollback(context.Background())
			}
		})
	}
}

// TestTakeoverRace: plain and transactional requests race for keys whose
// row has lapsed (a record past its retention, a plain claim past its
// life), under each isolation level, while the sweeper deletes lapsed
// rows; the first two runs of each key fail (a 5xx: rolled back, or
// released) and free it again. Exactly one payment per key, and every
// racer ends with its record; no racer is told that another request holds
// the key (a plain claim waiting for it holds its locks a moment, as a
// claim does).
func TestTakeoverRace(t *testing.T) {
	db := sharedDB(t)
	for _, level := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelReadCommitted, sql.LevelSerializable} {
		t.Run(level.String(), func(t *testing.T) {
			st, _ := newStore(t, db, mysql.WithTxOptions(&sql.TxOptions{Isolation: level}))
			pay := newPayments(t, db)
			const racers, rounds, failures = 12, 4, 2
			for round := range rounds {
				key := newKey()
				lapsed := newClaim(7)
				if round%2 == 1 {
					lapsed.TTL = time.Millisecond
				}
				if res, err := st.Claim(context.Background(), key, lapsed); err != nil || res.State != store.Claimed {
					t.Fatalf("Claim: %v %v", res.State, err)
				}
				if round%2 == 0 {
					if err := st.Complete(context.Background(), key, lapsed.Token, record(lapsed.Fingerprint, 201), time.Millisecond); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(5 * time.Millisecond)
				sweeping, swept := make(chan struct{}), make(chan error, 1)
				go func() {
					for {
						select {
						case <-sweeping:
							swept <- nil
							return
						default:
						}
						if _, err := st.Sweep(context.Background()); err != nil {
							swept <- err
							return
						}
					}
				}()
				var mu sync.Mutex
				runs, kept := 0, 0
				errs := make(chan error, racers)
				var wg sync.WaitGroup
				for i := range racers {
					wg.Go(func() {
						c := newClaim(7)
						plain := i%2 == 1
						for {
							var res store.Result
							var tx store.Tx
							var err error
							if plain {
								res, err = st.Claim(context.Background(), key, c)
							} else {
								res, tx, err = st.ClaimTx(context.Background(), key, c)
							}
							if err != nil {
								errs <- err
								return
							}
							switch res.State {
							case store.Claimed, store.Mine:
								mu.Lock()
								runs++
								fail := runs <= failures
								mu.Unlock()
								switch {
								case plain && fail:
									err = st.Release(context.Background(), key, c.Token)
								case plain:
									if _, err = db.Exec("INSERT INTO `"+pay.name+"` (k, made_by) VALUES (?, 'plain')", key); err == nil {
										err = st.Complete(context.Background(), key, c.Token, record(c.Fingerprint, 201), time.Hour)
									}
								default:
									ctx := tx.NewContext(context.Background())
									if err = pay.insert(ctx, mysql.Tx(ctx), key, "tx"); err != nil {
										tx.Rollback(context.Background())
									} else if fail {
										err = tx.Rollback(context.Background())
									} else {
										err = tx.Commit(context.Background(), record(c.Fingerprint, 201), time.Hour)
									}
								}
								if err != nil {
									errs <- err
									return
								}
								if fail {
									c = newClaim(7)
									continue
								}
								mu.Lock()
								kept++
								mu.Unlock()
								return
							case store.Completed:
								if res.Fingerprint != c.Fingerprint {
									errs <- fmt.Errorf("a record of another request")
								}
								return
							case store.InFlight:
								if res.Fingerprint != c.Fingerprint {
									errs <- fmt.Errorf("in flight with another fingerprint")
									return
								}
								time.Sleep(time.Millisecond)
							}
						}
					})
				}
				wg.Wait()
				close(sweeping)
				if err := <-swept; err != nil {
					t.Fatalf("round %d: sweep: %v", round, err)
				}
				close(errs)
				for err := range errs {
					t.Fatalf("round %d: %v", round, err)
				}
				if kept != 1 {
					t.Fatalf("round %d: %d records kept, want 1", round, kept)
				}
				if n := pay.count(t, key); n != 1 {
					t.Fatalf("round %d: %d payments, want 1", round, n)
				}
			}
		})
	}
}

// TestWaitHangUp: a repeat waiting on a key in flight hangs up (its
// context ends): its server session does not go on waiting, holding a
// connection of the server's that the pool no longer counts.
func TestWaitHangUp(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	key, c := newKey(), newClaim(1)
	_, tx := claimTx(t, st, key, c)
	defer tx.Rollback(context.Background())
	wctx, hangUp := context.WithTimeout(context.Background(), 30*time.Second)
	time.AfterFunc(200*time.Millisecond, hangUp)
	if ok, err := st.Wait(wctx, key, newClaim(1)); !ok || err != nil {
		t.Fatalf("Wait cut short: %v %v, want true", ok, err)
	}
	_, fl := st.Locks(key, c.Fingerprint)
	waiting := func() (n int) {
		err := db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE CONCAT('%GET_LOCK(''', ?, '%')", fl).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for deadline := time.Now().Add(500 * time.Millisecond); waiting() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the waiter's session still waits on the server after it hung up")
		}
	}
}

// TestHangUpAfterClaim: the request's context ends (the client hung up)
// after the claim while the handler goes on: the transaction is not the
// request context's, so the handler's writes and the record commit
// together.
func TestHangUpAfterClaim(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	pay := newPayments(t, db)
	key, c := newKey(), newClaim(1)
	reqCtx, hangUp := context.WithCancel(context.Background())
	res, tx, err := st.ClaimTx(reqCtx, key, c)
	if err != nil || res.State != store.Claimed {
		t.Fatalf("ClaimTx: %v %v", res.State, err)
	}
	ctx := tx.NewContext(context.WithoutCancel(reqCtx))
	hangUp()
	time.Sleep(20 * time.Millisecond) // (database/sql would roll back now, were it the transaction's context)
	if err := pay.insert(ctx, mysql.Tx(ctx), key, "handler"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(context.WithoutCancel(reqCtx), record(c.Fingerprint, 201), time.Hour); err != nil {
		t.Fatal(err)
	}
	if n := pay.count(t, key); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
}

// TestDeadlockInTheHandler: a statement of the handler is chosen as a
// deadlock's victim, and InnoDB rolls the request's whole transaction
// back (the claim's row and the savepoint with it) while database/sql
// still holds the *sql.Tx open. A handler that goes on (a retry of the
// statement, a best-effort write) must not write on its own, outside any
// transaction: whether it then answers 201, a kept 4xx or a 5xx, its
// writes are undone and the key is free, or they are kept with the record;
// never written and freed.
func TestDeadlockInTheHandler(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	pay := newPayments(t, db)
	locks := "idemkey_dl_" + randomHex(6)
	if _, err := db.Exec("CREATE TABLE `" + locks + "` (id INT PRIMARY KEY, n INT) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	dropOnCleanup(t, db, locks)
	if _, err := db.Exec("INSERT INTO `" + locks + "` VALUES (1, 0), (2, 0)"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		ttl  time.Duration // the claim's, when not newClaim's
		end  func(sqlTx *sql.Tx, tx store.Tx) error
	}{
		{"201", 0, func(_ *sql.Tx, tx store.Tx) error {
			return tx.Commit(context.Background(), record([32]byte{1}, 201), time.Hour)
		}},
		{"kept 4xx", 0, func(_ *sql.Tx, tx store.Tx) error {
			return tx.Commit(context.Background(), record([32]byte{1}, 404), time.Hour)
		}},
		{"5xx", 0, func(_ *sql.Tx, tx store.Tx) error { return tx.Rollback(context.Background()) }},
		// The handler's next statement runs out of its context: the
		// driver closes the connection, and the server ends the session.
		{"deadline", 0, func(sqlTx *sql.Tx, tx store.Tx) error {
			dctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			sqlTx.ExecContext(dctx, "DO SLEEP(2)")
			return tx.Rollback(context.Background())
		}},
		// The handler outlives its claim: the watchdog kills the session.
		{"watchdog", 1500 * time.Millisecond, func(_ *sql.Tx, tx store.Tx) error {
			time.Sleep(2500 * time.Millisecond)
			return tx.Rollback(context.Background())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			key, c := newKey(), newClaim(1)
			if tc.ttl > 0 {
				c.TTL = tc.ttl
			}
			rctx, tx := claimTx(t, st, key, c)
			sqlTx := mysql.Tx(rctx)
			if _, err := sqlTx.ExecContext(ctx, "UPDATE `"+locks+"` SET n = n + 1 WHERE id = 1"); err != nil {
				t.Fatal(err)
			}
			// Another transaction, heavier (so that InnoDB picks the
			// request's as the victim), holds row 2 and waits for row 1.
			other, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Rollback()
			for i := range 20 {
				if err := pay.insert(ctx, other, "heavier-"+strconv.Itoa(i), "other"); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := other.ExecContext(ctx, "UPDATE `"+locks+"` SET n = n + 1 WHERE id = 2"); err != nil {
				t.Fatal(err)
			}
			waited := make(chan error, 1)
			go func() {
				_, err := other.ExecContext(ctx, "UPDATE `"+locks+"` SET n = n + 1 WHERE id = 1")
				waited <- err
			}()
			time.Sleep(100 * time.Millisecond) // the other waits on row 1
			_, err = sqlTx.ExecContext(ctx, "UPDATE `"+locks+"` SET n = n + 1 WHERE id = 2")
			if !isDeadlock(err) {
				t.Fatalf("the handler's statement: %v, want a deadlock (1213)", err)
			}
			if err := <-waited; err != nil {
				t.Fatalf("the other transaction: %v", err)
			}
			other.Rollback()
			// The handler goes on and writes.
			if err := pay.insert(ctx, sqlTx, key, "after the deadlock"); err != nil {
				t.Fatalf("the handler's write after the deadlock: %v", err)
			}
			tc.end(sqlTx, tx)
			written := pay.count(t, key)
			res, again, err := st.ClaimTx(ctx, key, newClaim(1))
			if err != nil {
				t.Fatal(err)
			}
			if again != nil {
				again.Rollback(ctx)
			}
			if written != 0 && res.State == store.Claimed {
				t.Fatalf("after a deadlock and %s: %d payments committed and the key free for a second run", tc.name, written)
			}
			t.Logf("after a deadlock and %s: %d payments, the key %v", tc.name, written, res.State)
			noLocks(t, db, st, key, c.Fingerprint)
		})
	}
}

// isDeadlock reports a deadlock (1213).
func isDeadlock(err error) bool {
	var myErr *gomysql.MySQLError
	return errors.As(err, &myErr) && myErr.Number == 1213
}

// Requests that end while their Store closes let go of their claims'
// locks before Close returns or, once it has, before their own Commit or
// Rollback returns: when both have returned, no lock is left held, nor
// still to be let go of by work the Store no longer waits for.
func TestCloseWhileRequestsEnd(t *testing.T) {
	db := sharedDB(t)
	ctx := context.Background()
	for round := range 20 {
		st, _ := newStore(t, db)
		const n = 4
		keys := make([]string, n)
		claims := make([]store.Claim, n)
		txs := make([]store.Tx, n)
		for i := range n {
			keys[i], claims[i] = newKey(), newClaim(byte(i))
			res, tx, err := st.ClaimTx(ctx, keys[i], claims[i])
			if err != nil || res.State != store.Claimed {
				t.Fatalf("round %d: claim %d: %v, %v", round, i, res.State, err)
			}
			txs[i] = tx
		}
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				if i%2 == 0 {
					txs[i].Rollback(ctx)
				} else {
					txs[i].Commit(ctx, &store.Record{Status: 201, Fingerprint: claims[i].Fingerprint}, time.Hour)
				}
			})
		}
		wg.Go(func() { st.Close() })
		wg.Wait()
		for i := range n {
			if held := heldLocks(t, db, st, keys[i], claims[i].Fingerprint); held != 0 {
				t.Fatalf("round %d: request %d ended and the Store closed, and %d of its named locks are still held", round, i, held)
			}
		}
	}
}

// A request's transaction runs with autocommit off; however it ends, the
// connection goes back to the pool with autocommit on, as the service's
// other code expects of it.
func TestAutocommitRestored(t *testing.T) {
	const conns = 3
	db := openDB(t, sharedURL(), conns)
	st, _ := newStore(t, db)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		end  func(sqlTx *sql.Tx, tx store.Tx)
	}{
		{"commit", func(_ *sql.Tx, tx store.Tx) { tx.Commit(ctx, record([32]byte{1}, 201), time.Hour) }},
		{"kept 4xx", func(_ *sql.Tx, tx store.Tx) { tx.Commit(ctx, record([32]byte{1}, 404), time.Hour) }},
		{"rollback", func(_ *sql.Tx, tx store.Tx) { tx.Rollback(ctx) }},
		{"handler commits, then commit", func(sqlTx *sql.Tx, tx store.Tx) {
			sqlTx.Commit()
			tx.Commit(ctx, record([32]byte{1}, 201), time.Hour)
		}},
		{"handler rolls back, then rollback", func(sqlTx *sql.Tx, tx store.Tx) {
			sqlTx.Rollback()
			tx.Rollback(ctx)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, c := newKey(), newClaim(1)
			rctx, tx := claimTx(t, st, key, c)
			tc.end(mysql.Tx(rctx), tx)
			noLocks(t, db, st, key, c.Fingerprint) // the background work is done
			// Every connection of the pool, the request's among them.
			held := make([]*sql.Conn, 0, conns)
			defer func() {
				for _, c := range held {
					c.Close()
				}
			}()
			for range conns {
				c, err := db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, c)
				var on int
				if err := c.QueryRowContext(ctx, "SELECT @@autocommit").Scan(&on); err != nil {
					t.Fatal(err)
				}
				if on != 1 {
					t.Fatalf("a pooled connection has autocommit %d after the request ended", on)
				}
			}
		})
	}
}
