package memory

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkey/idemkey/store"
)

func claimOf(token string) store.Claim {
	return store.Claim{Token: token, Fingerprint: [32]byte{byte(len(token))}, TTL: time.Hour}
}

func mustClaim(t *testing.T, s *Store, key, token string, want store.State) store.Result {
	t.Helper()
	res, err := s.Claim(t.Context(), key, claimOf(token))
	if err != nil {
		t.Fatalf("Claim(%q): %v", key, err)
	}
	if res.State != want {
		t.Fatalf("Claim(%q): state %v, want %v", key, res.State, want)
	}
	return res
}

func mustComplete(t *testing.T, s *Store, key, token string, retention time.Duration) *store.Record {
	t.Helper()
	rec := &store.Record{Status: http.StatusCreated, Body: []byte(key)}
	if err := s.Complete(t.Context(), key, token, rec, retention); err != nil {
		t.Fatalf("Complete(%q): %v", key, err)
	}
	return rec
}

// held reports whether the store holds an entry for key, without touching
// it the way a Claim would.
func held(s *Store, key string) bool {
	d := digestOf(key)
	sh := s.c.shard(d)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	_, ok := sh.m[d]
	return ok
}

// checkInvariants checks the bookkeeping a store keeps beside its maps.
func checkInvariants(t *testing.T, s *Store) {
	t.Helper()
	total := 0
	for i := range s.c.shards {
		sh := &s.c.shards[i]
		sh.mu.Lock()
		total += len(sh.m)
		sh.mu.Unlock()
	}
	if n := s.Len(); n != total {
		t.Errorf("Len() = %d, but the shards hold %d entries", n, total)
	}
	if int64(total) > s.c.max {
		t.Errorf("the store holds %d entries, over its bound of %d", total, s.c.max)
	}
}

func TestDefaults(t *testing.T) {
	s := mustNew(t)
	if s.c.max != 100_000 || DefaultMaxRecords != 100_000 {
		t.Errorf("max records %d (DefaultMaxRecords %d), want 100000", s.c.max, DefaultMaxRecords)
	}
	if s.c.interval != time.Minute || DefaultJanitorInterval != time.Minute {
		t.Errorf("janitor interval %v (DefaultJanitorInterval %v), want 1m", s.c.interval, DefaultJanitorInterval)
	}
	// The default clock is the wall clock.
	before := time.Now()
	got := s.c.now()
	if got.Before(before) || got.Sub(before) > time.Hour {
		t.Errorf("default clock reads %v at %v", got, before)
	}

	// And the default bound holds: 100,000 live claims fill the store.
	for i := range DefaultMaxRecords {
		if _, err := s.Claim(t.Context(), fmt.Sprint("k", i), claimOf("t")); err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
	}
	if _, err := s.Claim(t.Context(), "one-more", claimOf("t")); !errors.Is(err, store.ErrFull) {
		t.Fatalf("claim past the default bound: error %v, want store.ErrFull", err)
	}
	if s.Len() != DefaultMaxRecords {
		t.Fatalf("Len() = %d, want %d", s.Len(), DefaultMaxRecords)
	}
}

// mustNew returns a new store and closes it when the test ends.
func mustNew(tb testing.TB, opts ...Option) *Store {
	tb.Helper()
	s, err := New(opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

func TestOptionsInvalid(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  Option
	}{
		{"MaxRecordsZero", WithMaxRecords(0)},
		{"MaxRecordsNegative", WithMaxRecords(-1)},
		{"NilClock", WithClock(nil)},
		{"JanitorIntervalZero", WithJanitorInterval(0)},
		{"JanitorIntervalNegative", WithJanitorInterval(-time.Second)},
		{"NilOption", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(tc.opt)
			if err == nil || !strings.HasPrefix(err.Error(), "idemkey: memory: ") {
				t.Fatalf("New: store %v, error %v; want an error starting %q", s, err, "idemkey: memory: ")
			}
			if s != nil {
				t.Fatalf("New returned a store with the error %v", err)
			}
		})
	}
}

func TestOptionsApplied(t *testing.T) {
	clock := newFakeClock()
	s := mustNew(t, WithMaxRecords(7), WithClock(clock.Now), WithJanitorInterval(3*time.Second))
	if s.c.max != 7 || s.c.interval != 3*time.Second || !s.c.now().Equal(clock.Now()) {
		t.Errorf("options not applied: max %d, interval %v, clock %v", s.c.max, s.c.interval, s.c.now())
	}
}

func TestBadArguments(t *testing.T) {
	s := mustNew(t, WithClock(newFakeClock().Now))
	ctx := t.Context()
	if _, err := s.Claim(ctx, "k", store.Claim{Token: "a", TTL: 0}); err == nil {
		t.Error("Claim with a zero TTL: no error")
	}
	if s.Len() != 0 {
		t.Fatalf("a refused claim left %d entries", s.Len())
	}
	mustClaim(t, s, "k", "a", store.Claimed)
	if err := s.Complete(ctx, "k", "a", nil, time.Hour); err == nil {
		t.Error("Complete with a nil record: no error")
	}
	if err := s.Complete(ctx, "k", "a", &store.Record{Status: 200}, 0); err == nil {
		t.Error("Complete with a zero retention: no error")
	}
	if err := s.Extend(ctx, "k", "a", -time.Second); err == nil {
		t.Error("Extend with a negative TTL: no error")
	}
	res := mustClaim(t, s, "k", "b", store.InFlight)
	if res.TTL != time.Hour {
		t.Errorf("refused calls changed the claim: TTL %v, want 1h", res.TTL)
	}
}

func TestLazyExpiry(t *testing.T) {
	clock := newFakeClock()
	s := mustNew(t, WithClock(clock.Now))
	mustClaim(t, s, "claim", "a", store.Claimed)
	mustClaim(t, s, "record", "a", store.Claimed)
	mustComplete(t, s, "record", "a", 2*time.Hour)
	clock.Advance(3 * time.Hour)
	// Nothing has touched them yet, and the janitor has not run.
	if s.Len() != 2 {
		t.Fatalf("Len() = %d before any access, want 2", s.Len())
	}
	// The owner of a lapsed claim finds it gone, and that removes it.
	if err := s.Complete(t.Context(), "claim", "a", &store.Record{}, time.Hour); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Complete of a lapsed claim: %v, want store.ErrNotOwner", err)
	}
	if held(s, "claim") || s.Len() != 1 {
		t.Fatalf("a lapsed claim stayed after an access: Len() = %d", s.Len())
	}
	// A claim on a lapsed record replaces it.
	mustClaim(t, s, "record", "b", store.Claimed)
	if s.Len() != 1 {
		t.Fatalf("Len() = %d, want 1", s.Len())
	}
	checkInvariants(t, s)
}

// TestFullStore checks that a full store refuses claims on new keys, and
// only those: replays, in-flight answers, Complete, Release and Extend work
// as ever, and nothing inside its life is removed.
func TestFullStore(t *testing.T) {
	clock := newFakeClock()
	s := mustNew(t, WithMaxRecords(3), WithClock(clock.Now))
	ctx := t.Context()
	mustClaim(t, s, "kept", "t-kept", store.Claimed)
	kept := mustComplete(t, s, "kept", "t-kept", time.Hour)
	mustClaim(t, s, "x", "t-x", store.Claimed)
	mustClaim(t, s, "y", "t-y", store.Claimed)

	for range 2 {
		_, err := s.Claim(ctx, "new", claimOf("t-new"))
		if !errors.Is(err, store.ErrFull) {
			t.Fatalf("claim of a new key in a full store: %v, want store.ErrFull", err)
		}
		if want := "idemkey: memory: 3 entries held, the bound is 3: idemkey: store: full"; err.Error() != want {
			t.Errorf("error %q, want %q", err, want)
		}
		clock.Advance(2 * time.Second) // past the sweep gap: the pass finds nothing to remove
	}
	if held(s, "new") || s.Len() != 3 {
		t.Fatalf("a refused claim changed the store: Len() = %d", s.Len())
	}

	// Everything held still answers, and its owners can still finish.
	res := mustClaim(t, s, "kept", "someone else", store.Completed)
	if string(res.Record.Body) != string(kept.Body) {
		t.Fatalf("replay in a full store: body %q, want %q", res.Record.Body, kept.Body)
	}
	mustClaim(t, s, "x", "someone else", store.InFlight)
	mustClaim(t, s, "x", "t-x", store.Mine)
	if err := s.Extend(ctx, "x", "t-x", time.Hour); err != nil {
		t.Fatalf("Extend in a full store: %v", err)
	}
	mustComplete(t, s, "x", "t-x", time.Hour)
	mustClaim(t, s, "x", "someone else", store.Completed)

	// Room made by an owner is room again.
	if err := s.Release(ctx, "y", "t-y"); err != nil {
		t.Fatalf("Release in a full store: %v", err)
	}
	mustClaim(t, s, "new", "t-new", store.Claimed)
	mustClaim(t, s, "kept", "someone else", store.Completed)
	mustClaim(t, s, "x", "someone else", store.Completed)
	checkInvariants(t, s)
}

// TestFullStoreSweepGap checks that claims on a full store look for
// expired entries at most once per minSweepGap of the store's clock.
func TestFullStoreSweepGap(t *testing.T) {
	clock := newFakeClock()
	s := mustNew(t, WithMaxRecords(2), WithClock(clock.Now))
	ctx := t.Context()
	short := store.Claim{Token: "t", TTL: 100 * time.Millisecond}
	for _, k := range []string{"a", "b"} {
		if _, err := s.Claim(ctx, k, short); err != nil {
			t.Fatal(err)
		}
	}
	// The first refusal makes a pass; it finds nothing lapsed yet.
	if _, err := s.Claim(ctx, "c", claimOf("t")); !errors.Is(err, store.ErrFull) {
		t.Fatalf("claim in a full store: %v, want store.ErrFull", err)
	}
	clock.Advance(500 * time.Millisecond) // a and b lapsed, but the last pass was 0.5s ago
	if _, err := s.Claim(ctx, "c", claimOf("t")); !errors.Is(err, store.ErrFull) {
		t.Fatalf("claim within the sweep gap: %v, want store.ErrFull", err)
	}
	if s.Len() != 2 {
		t.Fatalf("Len() = %d: a pass was made within the sweep gap", s.Len())
	}
	clock.Advance(500 * time.Millisecond)
	mustClaim(t, s, "c", "t", store.Claimed)
	if held(s, "a") || held(s, "b") || s.Len() != 1 {
		t.Fatalf("the pass left lapsed claims: Len() = %d", s.Len())
	}
}

func TestFullStoreDropsExpiredFirst(t *testing.T) {
	clock := newFakeClock()
	s := mustNew(t, WithMaxRecords(3), WithClock(clock.Now))
	ctx := t.Context()
	// The oldest record outlives a younger one and an abandoned claim.
	mustClaim(t, s, "old", "t", store.Claimed)
	mustComplete(t, s, "old", "t", time.Hour)
	mustClaim(t, s, "young", "t", store.Claimed)
	mustComplete(t, s, "young", "t", time.Second)
	if _, err := s.Claim(ctx, "abandoned", store.Claim{Token: "t", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)
	mustClaim(t, s, "new-1", "t", store.Claimed)
	mustClaim(t, s, "new-2", "t", store.Claimed)
	if !held(s, "old") {
		t.Fatal("a live record was removed while expired entries took room")
	}
	if held(s, "young") || held(s, "abandoned") {
		t.Fatal("expired entries survived a full store")
	}
	checkInvariants(t, s)

	// A store full of claims that have all lapsed takes new ones.
	s2 := mustNew(t, WithMaxRecords(2), WithClock(clock.Now))
	defer s2.Close()
	for _, k := range []string{"a", "b"} {
		if _, err := s2.Claim(ctx, k, store.Claim{Token: "t", TTL: time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s2.Claim(ctx, "c", claimOf("t")); !errors.Is(err, store.ErrFull) {
		t.Fatalf("claim in a full store: %v, want store.ErrFull", err)
	}
	clock.Advance(2 * time.Second)
	mustClaim(t, s2, "c", "t", store.Claimed)
	mustClaim(t, s2, "d", "t", store.Claimed)
	checkInvariants(t, s2)
}

func TestJanitor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := mustNew(t, WithJanitorInterval(time.Second))
		ctx := context.Background()
		if _, err := s.Claim(ctx, "claim", store.Claim{Token: "t", TTL: 1500 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		mustClaim(t, s, "record", "t", store.Claimed)
		mustComplete(t, s, "record", "t", 3500*time.Millisecond)
		mustClaim(t, s, "live", "t", store.Claimed)

		time.Sleep(1700 * time.Millisecond) // the claim lapsed at 1.5s; the janitor last ran at 1s
		synctest.Wait()
		if s.Len() != 3 {
			t.Fatalf("at 1.7s Len() = %d, want 3: nothing has removed the lapsed claim yet", s.Len())
		}
		time.Sleep(time.Second) // the janitor ran at 2s
		synctest.Wait()
		if s.Len() != 2 || held(s, "claim") {
			t.Fatalf("at 2.7s Len() = %d, want 2: the janitor should have removed the lapsed claim", s.Len())
		}
		time.Sleep(2 * time.Second) // the record lapsed at 3.5s, the janitor ran at 4s
		synctest.Wait()
		if s.Len() != 1 || held(s, "record") || !held(s, "live") {
			t.Fatalf("at 4.7s Len() = %d, want 1: the janitor should have removed the lapsed record", s.Len())
		}
		checkInvariants(t, s)

		// Close stops the janitor; synctest fails the test if it leaks.
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		// The store still answers after Close.
		mustClaim(t, s, "live", "t", store.Mine)
	})
}

func TestCloseStopsJanitor(t *testing.T) {
	s := mustNew(t)
	done := s.c.done
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	default:
		t.Fatal("Close returned before the janitor exited")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	mustClaim(t, s, "k", "t", store.Claimed)
}

func TestUnreachableStoreStopsJanitor(t *testing.T) {
	done := func() chan struct{} {
		s, err := New() // not mustNew: its cleanup would keep the store reachable
		if err != nil {
			t.Fatal(err)
		}
		mustClaim(t, s, "k", "t", store.Claimed)
		return s.c.done
	}()
	// The cleanup runs some time after a collection finds the store
	// unreachable; wait for it, but not forever.
	for range 500 {
		runtime.GC()
		select {
		case <-done:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatal("the janitor of an unreachable store kept running")
}

// TestKeptRecordIsCopied checks the package documentation's promise:
// Complete keeps a copy, the caller's record stays the caller's, and each
// Claim returns a new Record and Header whose Body cannot be grown into the
// store's copy.
func TestKeptRecordIsCopied(t *testing.T) {
	s := mustNew(t)
	body := make([]byte, 4, 64)
	copy(body, "body")
	rec := &store.Record{Status: 200, Header: http.Header{"X-A": {"a"}}, Body: body}
	mustClaim(t, s, "k", "t", store.Claimed)
	if err := s.Complete(t.Context(), "k", "t", rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	// The caller reuses its record: the kept one does not change.
	copy(body, "BODY")
	rec.Header.Set("X-A", "changed")
	rec.Status = 500
	first := mustClaim(t, s, "k", "u", store.Completed).Record
	if first == rec || first.Status != 200 || string(first.Body) != "body" || first.Header.Get("X-A") != "a" {
		t.Fatalf("kept record changed with the caller's: %+v", first)
	}
	if cap(first.Body) != len(first.Body) {
		t.Errorf("Claim returned a body with spare capacity: %d/%d", len(first.Body), cap(first.Body))
	}
	// A caller may change the Record and Header it was given; an append to
	// the Body copies it.
	first.Status = 418
	first.Header.Set("X-A", "mine")
	first.Header["X-B"] = append(first.Header["X-A"], "more")
	_ = append(first.Body, "tail"...)
	second := mustClaim(t, s, "k", "v", store.Completed).Record
	if second == first || second.Status != 200 || string(second.Body) != "body" || len(second.Header) != 1 || second.Header.Get("X-A") != "a" {
		t.Fatalf("a change to one Claim's record reached the next: %+v", second)
	}
}

// TestChurn drives many keys with mixed lives through claims, completions,
// releases, lapses and refusals, and checks the bookkeeping throughout.
func TestChurn(t *testing.T) {
	clock := newFakeClock()
	s := mustNew(t, WithMaxRecords(300), WithClock(clock.Now))
	ctx := t.Context()
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20_000 {
		key := fmt.Sprint("k", r.IntN(600))
		tok := fmt.Sprint("t", i)
		ttl := time.Duration(1+r.IntN(5)) * time.Second
		res, err := s.Claim(ctx, key, store.Claim{Token: tok, TTL: ttl})
		if errors.Is(err, store.ErrFull) {
			clock.Advance(time.Second)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if res.State == store.Claimed {
			switch r.IntN(4) {
			case 0:
				err = s.Release(ctx, key, tok)
			case 1:
				// Left to lapse.
			case 2:
				err = s.Complete(ctx, key, tok, &store.Record{}, time.Hour)
			default:
				err = s.Complete(ctx, key, tok, &store.Record{}, time.Duration(1+r.IntN(3))*time.Second)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		clock.Advance(time.Duration(r.IntN(200)) * time.Millisecond)
		if i%1000 == 0 {
			checkInvariants(t, s)
			if s.Len() > 300 {
				t.Fatalf("Len() = %d over the bound of 300", s.Len())
			}
		}
	}
	checkInvariants(t, s)
}

// TestConcurrentFullStore races claims, completions and releases on a
// small store that is often full, and checks that every record kept stays
// kept: a full store refuses claims, it never makes room.
func TestConcurrentFullStore(t *testing.T) {
	clock := newFakeClock()
	const max, workers = 64, 8
	s := mustNew(t, WithMaxRecords(max), WithClock(clock.Now))
	ctx := t.Context()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		kept = map[string]string{} // key: the body kept for it
		full atomic.Int64
	)
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range 3000 {
				key := fmt.Sprint("k", r.IntN(500))
				tok := fmt.Sprint(w, "-", i)
				res, err := s.Claim(ctx, key, store.Claim{Token: tok, TTL: time.Minute})
				if errors.Is(err, store.ErrFull) {
					full.Add(1)
					continue
				}
				if err != nil {
					t.Errorf("Claim: %v", err)
					return
				}
				if res.State != store.Claimed {
					continue
				}
				if r.IntN(3) == 0 {
					err = s.Release(ctx, key, tok)
				} else {
					err = s.Complete(ctx, key, tok, &store.Record{Body: []byte(tok)}, 24*time.Hour)
					mu.Lock()
					kept[key] = tok
					mu.Unlock()
				}
				if err != nil {
					t.Errorf("finishing an owned claim: %v", err)
					return
				}
				if i%100 == 0 {
					clock.Advance(time.Second)
				}
			}
		})
	}
	wg.Wait()
	if full.Load() == 0 {
		t.Error("the store was never full: the test tests nothing")
	}
	for key, body := range kept {
		res := mustClaim(t, s, key, "check", store.Completed)
		if string(res.Record.Body) != body {
			t.Errorf("%s: body %q, want %q", key, res.Record.Body, body)
		}
	}
	checkInvariants(t, s)
}

// TestFloodKeepsOthersRecords is the flood of issue 10: alice's kept
// response must outlive another caller's flood of fresh keys, which the
// store refuses once it is full instead of making room.
func TestFloodKeepsOthersRecords(t *testing.T) {
	clock := newFakeClock()
	s := mustNew(t, WithClock(clock.Now))
	ctx := t.Context()
	alice := store.KeyName("alice", "pay-1")
	fp := [32]byte{0xa1}
	if _, err := s.Claim(ctx, alice, store.Claim{Token: "alice-1", Fingerprint: fp, TTL: 35 * time.Second}); err != nil {
		t.Fatal(err)
	}
	kept := &store.Record{Status: http.StatusCreated, Body: []byte(`{"id":"pay_1"}`), Fingerprint: fp}
	if err := s.Complete(ctx, alice, "alice-1", kept, 24*time.Hour); err != nil {
		t.Fatal(err)
	}

	// Another caller sends 100,000 fresh keys over about two seconds, and
	// each is run and kept.
	refused := 0
	for i := range 100_000 {
		key := store.KeyName("mallory", fmt.Sprint("flood-", i))
		tok := fmt.Sprint("m-", i)
		res, err := s.Claim(ctx, key, store.Claim{Token: tok, TTL: 35 * time.Second})
		if err != nil {
			if !errors.Is(err, store.ErrFull) || !strings.HasPrefix(err.Error(), "idemkey: memory: ") {
				t.Fatalf("flood claim %d: error %q, want one from this package wrapping store.ErrFull", i, err)
			}
			refused++
			continue
		}
		if res.State != store.Claimed {
			t.Fatalf("flood claim %d: state %v", i, res.State)
		}
		if err := s.Complete(ctx, key, tok, &store.Record{Status: http.StatusCreated}, 24*time.Hour); err != nil {
			t.Fatalf("flood complete %d: %v", i, err)
		}
		if i%1000 == 0 {
			clock.Advance(20 * time.Millisecond)
		}
	}
	if refused != 1 {
		t.Errorf("the flood had %d claims refused, want 1: the one past the default bound", refused)
	}

	// Alice's retry gets her kept response, not a second run.
	res, err := s.Claim(ctx, alice, store.Claim{Token: "alice-2", Fingerprint: fp, TTL: 35 * time.Second})
	if err != nil {
		t.Fatalf("alice's retry: %v", err)
	}
	if res.State != store.Completed || res.Record == nil || string(res.Record.Body) != `{"id":"pay_1"}` {
		t.Fatalf("alice's retry: state %v, want her kept response replayed", res.State)
	}
}

// TestClockReadUnderLock has a second claim of the same key land between
// a claim's reading of the clock and its look at the key, when there is
// such a moment. A claim that then found the key held computed its
// remaining life from its own earlier reading, answering more life than the
// holder's TTL gave it (the conformance suite's ClaimRace caught this now
// and then in real time).
func TestClockReadUnderLock(t *testing.T) {
	fake := newFakeClock()
	const ttl = 30 * time.Second
	var (
		s       *Store
		between atomic.Pointer[func()]
		other   store.Result
	)
	clock := func() time.Time {
		t0 := fake.Now()
		if f := between.Swap(nil); f != nil {
			(*f)()
		}
		return t0
	}
	s = mustNew(t, WithClock(clock))
	key := store.KeyName("scope", "key")
	sh := s.c.shard(digestOf(key))
	ranBetween := false
	run := func() {
		if !sh.mu.TryLock() {
			return // the clock is read under the shard's lock: no moment between
		}
		sh.mu.Unlock()
		ranBetween = true
		fake.Advance(time.Second)
		var err error
		if other, err = s.Claim(t.Context(), key, store.Claim{Token: "a", TTL: ttl}); err != nil {
			t.Error(err)
		}
	}
	between.Store(&run)
	res, err := s.Claim(t.Context(), key, store.Claim{Token: "b", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if !ranBetween {
		if other, err = s.Claim(t.Context(), key, store.Claim{Token: "a", TTL: ttl}); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []store.Result{res, other} {
		if r.State == store.InFlight && r.TTL > ttl {
			t.Errorf("InFlight with %v of life left, more than the holder's TTL of %v", r.TTL, ttl)
		}
	}
}
