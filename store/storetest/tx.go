package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// TxHarness is one store.TxStore under test, with the handler's side of
// its transactions: how a handler writes through the transaction a
// request's context carries, ends it itself, or dies with it.
type TxHarness struct {
	// Store is the store under test. It must not be nil.
	Store store.TxStore
	// Write makes one business write, named id, through the transaction
	// that ctx carries (the context store.Tx.NewContext returned), as a
	// handler would.
	Write func(ctx context.Context, id string) error
	// Written counts the committed business writes named id, read outside
	// any request's transaction.
	Written func(ctx context.Context, id string) (int, error)
	// End ends the transaction that ctx carries the way a handler can
	// itself: committing it when commit is true, else rolling it back
	// (for a *sql.Tx, its Commit or Rollback method).
	End func(ctx context.Context, commit bool) error
	// Kill makes the transaction that ctx carries die with its
	// connection, as when the owner's process is killed: the server ends
	// the session (for example by terminating its backend).
	Kill func(ctx context.Context) error
}

// RunTx runs the transactional suite as subtests of t: what every
// store.TxStore promises about the transaction a claimed request's handler
// runs in. newHarness is called once per subtest, as Run's is; keys are
// random, so a shared store is fine. The suite runs in real time, with
// claims of a few seconds (one subtest lets a 300ms claim lapse).
//
// What it holds a store to:
//
//   - ClaimTx answers Claimed with a transaction for a free key, and
//     InFlight with no transaction for a key another request holds: with
//     the claim's fingerprint for a repeat of the same request, another
//     for a different one, and to a plain Claim too.
//   - Commit keeps the record and the handler's writes together: the key
//     then replays the record, and each write is there once. Rollback
//     undoes the writes and frees the key.
//   - An owner whose connection dies loses its claim at once (within a
//     second), with its writes; its later Commit fails.
//   - An owner whose claim's life is over keeps nothing: Commit answers
//     ErrNotOwner, its writes are gone, and the key is free for the next.
//   - A handler that commits the transaction itself: a Commit after it
//     keeps the record (the writes are in); a Rollback after it fails and
//     leaves the key held, so that the writes are never made twice. A
//     handler that rolls it back itself: Commit fails, nothing is kept
//     and the key is free.
//   - Begin opens a transaction with no claim, whose Commit keeps the
//     writes and whose Rollback undoes them.
//   - Of many requests racing for one key, exactly one runs and writes.
func RunTx(t *testing.T, newHarness func(t *testing.T) TxHarness) {
	t.Helper()
	for _, c := range txCases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			if h.Store == nil || h.Write == nil || h.Written == nil || h.End == nil || h.Kill == nil {
				t.Fatal("storetest: TxHarness needs Store, Write, Written, End and Kill")
			}
			c.run(&txSuite{t: t, h: h, ctx: t.Context(), scope: "storetest-tx-" + randomHex(16)})
		})
	}
}

var txCases = []struct {
	name string
	run  func(s *txSuite)
}{
	{"ClaimHolds", txClaimHolds},
	{"CommitKeeps", txCommitKeeps},
	{"RollbackReleases", txRollbackReleases},
	{"CrashIsTakenOver", txCrashIsTakenOver},
	{"LateCommitIsFenced", txLateCommitIsFenced},
	{"HandlerCommitsThenKept", txHandlerCommitsThenKept},
	{"HandlerCommitsThenFails", txHandlerCommitsThenFails},
	{"HandlerRollsBack", txHandlerRollsBack},
	{"Begin", txBegin},
	{"Race", txRace},
}

// txSuite is the state one transactional subtest works with.
type txSuite struct {
	t     *testing.T
	h     TxHarness
	ctx   context.Context
	scope string
}

// txLife is the claim life of subtests that do not let it lapse.
const txLife = 10 * time.Second

func (s *txSuite) key(name string) string { return store.KeyName(s.scope, name) }

// claim runs ClaimTx and fails on an error.
func (s *txSuite) claim(key string, c store.Claim) (store.Result, store.Tx) {
	s.t.Helper()
	res, tx, err := s.h.Store.ClaimTx(s.ctx, key, c)
	if err != nil {
		s.t.Fatalf("ClaimTx: %v", err)
	}
	if (tx != nil) != (res.State == store.Claimed || res.State == store.Mine) {
		s.t.Fatalf("ClaimTx answered %v with transaction %v: want one exactly when claimed", res.State, tx)
	}
	return res, tx
}

// claimed claims a free key in a transaction, rolled back at the end of
// the subtest unless it ended, and returns the transaction and the
// context the handler runs with.
func (s *txSuite) claimed(key string, c store.Claim) (store.Tx, context.Context) {
	s.t.Helper()
	res, tx := s.claim(key, c)
	if res.State != store.Claimed {
		s.t.Fatalf("ClaimTx of a free key: %v, want %v", res.State, store.Claimed)
	}
	// A subtest that fails half way must not leave the claim, its
	// connection and its locks held for the next (a second end is
	// refused, and changes nothing).
	s.t.Cleanup(func() { tx.Rollback(context.WithoutCancel(s.ctx)) })
	return tx, tx.NewContext(s.ctx)
}

func (s *txSuite) write(ctx context.Context, id string) {
	s.t.Helper()
	if err := s.h.Write(ctx, id); err != nil {
		s.t.Fatalf("the handler's write through the request's transaction: %v", err)
	}
}

// written fails unless id was written want times.
func (s *txSuite) written(id string, want int) {
	s.t.Helper()
	n, err := s.h.Written(s.ctx, id)
	if err != nil {
		s.t.Fatalf("Written: %v", err)
	}
	if n != want {
		s.t.Errorf("write %q committed %d times, want %d", id, n, want)
	}
}

// state claims key under a fresh token and request, in a transaction
// rolled back at once, and returns the answer.
func (s *txSuite) state(key string) store.Result {
	s.t.Helper()
	res, tx := s.claim(key, newClaim(txLife))
	if tx != nil {
		if err := tx.Rollback(s.ctx); err != nil {
			s.t.Fatalf("Rollback of a probe's claim: %v", err)
		}
	}
	return res
}

// free fails unless key can be claimed (the probe's claim is rolled back).
func (s *txSuite) free(key string) {
	s.t.Helper()
	if res := s.state(key); res.State != store.Claimed {
		s.t.Fatalf("key after its claim ended: %v, want it free (%v)", res.State, store.Claimed)
	}
}

// freeWithin polls until key can be claimed, and fails after d.
func (s *txSuite) freeWithin(key string, d time.Duration) time.Duration {
	s.t.Helper()
	start := time.Now()
	for {
		res := s.state(key)
		if res.State == store.Claimed {
			return time.Since(start)
		}
		if time.Since(start) > d {
			s.t.Fatalf("key still %v %v after its owner's end, want it free within %v", res.State, time.Since(start).Round(time.Millisecond), d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// paid claims a free key named name for a request whose claim lives ttl,
// and makes the handler's write through its transaction. It returns the
// key, the claim, the transaction, the context the handler runs with, and
// the write's name.
func (s *txSuite) paid(name string, ttl time.Duration) (string, store.Claim, store.Tx, context.Context, string) {
	s.t.Helper()
	key, c := s.key(name), newClaim(ttl)
	tx, ctx := s.claimed(key, c)
	id := randomHex(8)
	s.write(ctx, id)
	return key, c, tx, ctx, id
}

func newClaim(ttl time.Duration) store.Claim {
	return store.Claim{Token: newToken(), Fingerprint: randomFP(), TTL: ttl}
}

func txClaimHolds(s *txSuite) {
	key, c := s.key("holds"), newClaim(txLife)
	tx, _ := s.claimed(key, c)
	defer tx.Rollback(s.ctx)

	again := c
	again.Token = newToken()
	res, _ := s.claim(key, again)
	if res.State != store.InFlight || res.Fingerprint != c.Fingerprint {
		s.t.Errorf("ClaimTx by a repeat of the request: %v with fingerprint %x, want %v with the claim's", res.State, res.Fingerprint, store.InFlight)
	}
	if res.TTL <= 0 || res.TTL > txLife {
		s.t.Errorf("InFlight TTL %v, want in (0, %v]", res.TTL, txLife)
	}
	res, _ = s.claim(key, newClaim(txLife))
	if res.State != store.InFlight || res.Fingerprint == c.Fingerprint {
		s.t.Errorf("ClaimTx by another request: %v with fingerprint %x, want %v with another than %x", res.State, res.Fingerprint, store.InFlight, c.Fingerprint)
	}
	plain, err := s.h.Store.Claim(s.ctx, key, newClaim(txLife))
	if err != nil {
		s.t.Fatalf("Claim: %v", err)
	}
	if plain.State != store.InFlight {
		s.t.Errorf("plain Claim of a key a transaction holds: %v, want %v", plain.State, store.InFlight)
	}
	if err := tx.Rollback(s.ctx); err != nil {
		s.t.Fatalf("Rollback: %v", err)
	}
	s.free(key)
}

func txCommitKeeps(s *txSuite) {
	key, c, tx, _, id := s.paid("commit", txLife)
	// Nothing is seen before the commit.
	s.written(id, 0)
	rec := newRecord(c.Fingerprint, "commit")
	if err := tx.Commit(s.ctx, rec, time.Hour); err != nil {
		s.t.Fatalf("Commit: %v", err)
	}
	s.written(id, 1)
	res := s.state(key)
	checkCompleted(s.t, res, rec)
	if err := tx.Rollback(s.ctx); err == nil {
		s.t.Error("Rollback after Commit: nil error, want one (the transaction ended)")
	}
	s.written(id, 1)
}

func txRollbackReleases(s *txSuite) {
	key, _, tx, _, id := s.paid("rollback", txLife)
	if err := tx.Rollback(s.ctx); err != nil {
		s.t.Fatalf("Rollback: %v", err)
	}
	s.written(id, 0)
	s.free(key)
}

func txCrashIsTakenOver(s *txSuite) {
	key, c, tx, ctx, id := s.paid("crash", txLife)
	if err := s.h.Kill(ctx); err != nil {
		s.t.Fatalf("Kill: %v", err)
	}
	took := s.freeWithin(key, time.Second)
	s.t.Logf("taken over %v after the owner's connection died", took.Round(100*time.Microsecond))
	s.written(id, 0)
	if err := tx.Commit(s.ctx, newRecord(c.Fingerprint, "crash"), time.Hour); err == nil {
		s.t.Error("Commit after the owner's connection died: nil error, want one")
	}
	s.written(id, 0)
	s.free(key)
}

func txLateCommitIsFenced(s *txSuite) {
	const life = 300 * time.Millisecond
	key, c, tx, _, id := s.paid("late", life)
	time.Sleep(past(life))
	// The next request gets the key once the claim's life is over (a
	// store whose owner lets go by a timer of its own, as MySQL's kills
	// the session, may be late by a scheduler's delay on a loaded
	// machine)...
	s.freeWithin(key, time.Second)
	next, nctx := s.claimed(key, newClaim(txLife))
	nid := randomHex(8)
	s.write(nctx, nid)
	// ...and the late owner's commit keeps nothing.
	err := tx.Commit(s.ctx, newRecord(c.Fingerprint, "late"), time.Hour)
	if !errors.Is(err, store.ErrNotOwner) {
		s.t.Errorf("Commit after the claim's life: %v, want store.ErrNotOwner", err)
	}
	s.written(id, 0)
	if err := next.Commit(s.ctx, newRecord(randomFP(), "next"), time.Hour); err != nil {
		s.t.Fatalf("the next request's Commit: %v", err)
	}
	s.written(nid, 1)
}

func txHandlerCommitsThenKept(s *txSuite) {
	key, c, tx, ctx, id := s.paid("own-commit", txLife)
	if err := s.h.End(ctx, true); err != nil {
		s.t.Fatalf("the handler's own commit: %v", err)
	}
	s.written(id, 1)
	// Until the record is kept, the key is held: the writes are in.
	if res := s.state(key); res.State != store.InFlight {
		s.t.Errorf("key after the handler's own commit: %v, want %v", res.State, store.InFlight)
	}
	rec := newRecord(c.Fingerprint, "own-commit")
	if err := tx.Commit(s.ctx, rec, time.Hour); err != nil {
		s.t.Fatalf("Commit after the handler's own commit: %v, want the record kept", err)
	}
	checkCompleted(s.t, s.state(key), rec)
	s.written(id, 1)
}

func txHandlerCommitsThenFails(s *txSuite) {
	key, _, tx, ctx, id := s.paid("own-commit-5xx", txLife)
	if err := s.h.End(ctx, true); err != nil {
		s.t.Fatalf("the handler's own commit: %v", err)
	}
	// The handler answers 5xx (or panics): the middleware rolls back, and
	// the writes are in already, so the key must stay held.
	if err := tx.Rollback(s.ctx); err == nil {
		s.t.Error("Rollback after the handler's own commit: nil error, want one saying the key is held")
	}
	if res := s.state(key); res.State != store.InFlight {
		s.t.Fatalf("key after the handler's own commit and a rollback: %v, want %v (held, so that the writes are never made twice)", res.State, store.InFlight)
	}
	s.written(id, 1)
}

func txHandlerRollsBack(s *txSuite) {
	key, c, tx, ctx, id := s.paid("own-rollback", txLife)
	if err := s.h.End(ctx, false); err != nil {
		s.t.Fatalf("the handler's own rollback: %v", err)
	}
	if err := tx.Commit(s.ctx, newRecord(c.Fingerprint, "own-rollback"), time.Hour); err == nil || errors.Is(err, store.ErrNotOwner) {
		s.t.Errorf("Commit after the handler's own rollback: %v, want an error that is not ErrNotOwner (nothing was kept)", err)
	}
	s.written(id, 0)
	s.free(key)
}

func txBegin(s *txSuite) {
	for _, commit := range []bool{true, false} {
		tx, err := s.h.Store.Begin(s.ctx)
		if err != nil {
			s.t.Fatalf("Begin: %v", err)
		}
		id := randomHex(8)
		s.write(tx.NewContext(s.ctx), id)
		want := 0
		if commit {
			want = 1
			err = tx.Commit(s.ctx, &store.Record{Status: 201}, time.Hour)
		} else {
			err = tx.Rollback(s.ctx)
		}
		if err != nil {
			s.t.Fatalf("ending a transaction with no claim (commit %v): %v", commit, err)
		}
		s.written(id, want)
	}
}

func txRace(s *txSuite) {
	const n = 16
	key, fp := s.key("race"), randomFP()
	id := randomHex(8)
	var (
		mu     sync.Mutex
		states = map[store.State]int{}
	)
	race(n, func(int) {
		res, tx, err := s.h.Store.ClaimTx(s.ctx, key, store.Claim{Token: newToken(), Fingerprint: fp, TTL: txLife})
		if err != nil {
			s.t.Errorf("ClaimTx: %v", err)
			return
		}
		mu.Lock()
		states[res.State]++
		mu.Unlock()
		if tx == nil {
			return
		}
		if err := s.h.Write(tx.NewContext(s.ctx), id); err != nil {
			s.t.Errorf("write: %v", err)
			tx.Rollback(s.ctx)
			return
		}
		if err := tx.Commit(s.ctx, newRecord(fp, "race"), time.Hour); err != nil {
			s.t.Errorf("Commit: %v", err)
		}
	})
	if states[store.Claimed] != 1 || states[store.Mine] != 0 {
		s.t.Errorf("%d racing claims of one key: %v, want exactly one claimed", n, states)
	}
	s.written(id, 1)
}
