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

// checkInvariants checks the counts a store keeps beside its maps.
func checkInvariants(t *testing.T, s *Store) {
	t.Helper()
	var total, bytes int64
	for i := range s.c.shards {
		sh := &s.c.shards[i]
		sh.mu.Lock()
		total += int64(len(sh.m))
		for _, e := range sh.m {
			bytes += e.cost()
		}
		sh.mu.Unlock()
	}
	st := statsOf(s)
	if st.Entries != total || st.Bytes != bytes {
		t.Errorf("Stats() = %+v, but the shards hold %d entries of %d bytes", st, total, bytes)
	}
	if total > s.c.max {
		t.Errorf("the store holds %d entries, over its bound of %d", total, s.c.max)
	}
}

func TestDefaults(t *testing.T) {
	s := mustNew(t)
	if s.c.max != 100_000 || DefaultMaxRecords != 100_000 {
		t.Errorf("max records %d (DefaultMaxRecords %d), want 100000", s.c.max, DefaultMaxRecords)
	}
	if s.c.maxBytes != 256<<20 || DefaultMaxBytes != 256<<20 {
		t.Errorf("max bytes %d (DefaultMaxBytes %d), want 256 MiB", s.c.maxBytes, DefaultMaxBytes)
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
	if statsOf(s).Entries != DefaultMaxRecords {
		t.Fatalf("Entries = %d, want %d", statsOf(s).Entries, DefaultMaxRecords)
	}
}

// TestDefaultMaxBytes checks that the default byte bound holds: records of
// 1 MiB fill a store at about 256 of them.
func TestDefaultMaxBytes(t *testing.T) {
	s := mustNew(t)
	ctx := t.Context()
	body := make([]byte, 1<<20)
	kept := 0
	for i := range 300 {
		key := store.KeyName("big", fmt.Sprint(i))
		_, err := s.Claim(ctx, key, claimOf("t"))
		if errors.Is(err, store.ErrFull) {
			if !strings.Contains(err.Error(), "bytes held") {
				t.Errorf("refusal %q does not say the byte bound was reached", err)
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, key, "t", &store.Record{Status: 200, Body: body}, time.Hour); err != nil {
			t.Fatal(err)
		}
		kept++
	}
	if kept < 250 || kept > 256 {
		t.Fatalf("%d records of 1 MiB kept before the store was full, want about 256", kept)
	}
	// The last claim was admitted under the bound, and its record may
	// take the store past it: by less than one record.
	const record = 1<<20 + 16<<10
	if b := statsOf(s).Bytes; b < DefaultMaxBytes-record || b > DefaultMaxBytes+record {
		t.Fatalf("Bytes = %d when full, want within a record of %d", b, DefaultMaxBytes)
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
		{"MaxBytesZero", WithMaxBytes(0)},
		{"MaxBytesNegative", WithMaxBytes(-1)},
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
	s := mustNew(t, WithMaxRecords(7), WithMaxBytes(1234), WithClock(clock.Now), WithJanitorInterval(3*time.Second))
	if s.c.max != 7 || s.c.maxBytes != 1234 || s.c.interval != 3*time.Second || !s.c.now().Equal(clock.Now()) {
		t.Errorf("options not applied: max %d, max bytes %d, interval %v, clock %v", s.c.max, s.c.maxBytes, s.c.interval, s.c.now())
	}
}

func TestBadArguments(t *testing.T) {
	s := mustNew(t, WithClock(newFakeClock().Now))
	ctx := t.Context()
	if _, err := s.Claim(ctx, "k", store.Claim{Token: "a", TTL: 0}); err == nil {
		t.Error("Claim with a zero TTL: no error")
	}
	if statsOf(s).Entries != 0 {
		t.Fatalf("a refused claim left %d entries", statsOf(s).Entries)
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
	if statsOf(s).Entries != 2 {
		t.Fatalf("Entries = %d before any access, want 2", statsOf(s).Entries)
	}
	// The owner of a lapsed claim finds it gone, and that removes it.
	if err := s.Complete(t.Context(), "claim", "a", &store.Record{}, time.Hour); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Complete of a lapsed claim: %v, want store.ErrNotOwner", err)
	}
	if held(s, "claim") || statsOf(s).Entries != 1 {
		t.Fatalf("a lapsed claim stayed after an access: Entries = %d", statsOf(s).Entries)
	}
	// A claim on a lapsed record replaces it.
	mustClaim(t, s, "record", "b", store.Claimed)
	if statsOf(s).Entries != 1 {
		t.Fatalf("Entries = %d, want 1", statsOf(s).Entries)
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
	if held(s, "new") || statsOf(s).Entries != 3 {
		t.Fatalf("a refused claim changed the store: Entries = %d", statsOf(s).Entries)
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
	if statsOf(s).Entries != 2 {
		t.Fatalf("Entries = %d: a pass was made within the sweep gap", statsOf(s).Entries)
	}
	clock.Advance(500 * time.Millisecond)
	mustClaim(t, s, "c", "t", store.Claimed)
	if held(s, "a") || held(s, "b") || statsOf(s).Entries != 1 {
		t.Fatalf("the pass left lapsed claims: Entries = %d", statsOf(s).Entries)
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
		if statsOf(s).Entries != 3 {
			t.Fatalf("at 1.7s Entries = %d, want 3: nothing has removed the lapsed claim yet", statsOf(s).Entries)
		}
		time.Sleep(time.Second) // the janitor ran at 2s
		synctest.Wait()
		if statsOf(s).Entries != 2 || held(s, "claim") {
			t.Fatalf("at 2.7s Entries = %d, want 2: the janitor should have removed the lapsed claim", statsOf(s).Entries)
		}
		time.Sleep(2 * time.Second) // the record lapsed at 3.5s, the janitor ran at 4s
		synctest.Wait()
		if statsOf(s).Entries != 1 || held(s, "record") || !held(s, "live") {
			t.Fatalf("at 4.7s Entries = %d, want 1: the janitor should have removed the lapsed record", statsOf(s).Entries)
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
			if statsOf(s).Entries > 300 {
				t.Fatalf("Entries = %d over the bound of 300", statsOf(s).Entries)
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

// TestMaxBytes checks the byte bound: claims are refused past it, a
// Complete is kept even when it takes the store past it, and room made by
// a release or a lapse is room again.
func TestMaxBytes(t *testing.T) {
	clock := newFakeClock()
	const bound = 8 << 10
	s := mustNew(t, WithMaxBytes(bound), WithClock(clock.Now))
	ctx := t.Context()
	body := make([]byte, 3000)
	complete := func(key, tok string, retention time.Duration) {
		t.Helper()
		if err := s.Complete(ctx, key, tok, &store.Record{Status: 200, Body: body}, retention); err != nil {
			t.Fatalf("Complete(%q): %v", key, err)
		}
	}
	// Two claims fit; their records together take the store past the
	// bound, and both are kept.
	mustClaim(t, s, "a", "t-a", store.Claimed)
	mustClaim(t, s, "b", "t-b", store.Claimed)
	mustClaim(t, s, "c", "t-c", store.Claimed)
	complete("a", "t-a", time.Hour)
	complete("b", "t-b", 10*time.Second)
	complete("c", "t-c", time.Hour)
	if b := statsOf(s).Bytes; b <= bound {
		t.Fatalf("Bytes = %d, want past the bound of %d (three records of 3000 bytes)", b, bound)
	}
	for _, k := range []string{"a", "b", "c"} {
		res := mustClaim(t, s, k, "other", store.Completed)
		if len(res.Record.Body) != len(body) {
			t.Fatalf("%s: body of %d bytes, want %d", k, len(res.Record.Body), len(body))
		}
	}
	// Past the bound, claims on new keys are refused.
	_, err := s.Claim(ctx, "d", claimOf("t-d"))
	if !errors.Is(err, store.ErrFull) || !strings.HasPrefix(err.Error(), "idemkey: memory: ") || !strings.Contains(err.Error(), "bytes held") {
		t.Fatalf("claim past the byte bound: %v, want an error wrapping store.ErrFull that names the byte bound", err)
	}
	checkInvariants(t, s)
	// When b lapses, its bytes are room again.
	clock.Advance(11 * time.Second)
	mustClaim(t, s, "d", "t-d", store.Claimed)
	if err := s.Release(ctx, "d", "t-d"); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, "a", "other", store.Completed)
	checkInvariants(t, s)
}

// TestStats checks what Stats counts for each kind of entry.
func TestStats(t *testing.T) {
	clock := newFakeClock()
	s := mustNew(t, WithClock(clock.Now))
	ctx := t.Context()
	if st := statsOf(s); st != (counts{}) {
		t.Fatalf("Stats of a new store = %+v, want zero", st)
	}
	tok := "token-0123456789"
	mustClaim(t, s, "k", tok, store.Claimed)
	if st, want := statsOf(s), (counts{Entries: 1, Bytes: entryOverhead + int64(len(tok))}); st != want {
		t.Fatalf("Stats with one claim = %+v, want %+v", st, want)
	}
	rec := &store.Record{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: make([]byte, 1000)}
	if err := s.Complete(ctx, "k", tok, rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	// The record counts its body, header, token and a few bytes more,
	// rounded up to its allocation.
	min := entryOverhead + int64(len(rec.Body)+len("Content-Type")+len("application/json")+len(tok))
	if st := statsOf(s); st.Entries != 1 || st.Bytes < min || st.Bytes > min+128 {
		t.Fatalf("Stats with one record = %+v, want 1 entry of %d to %d bytes", st, min, min+128)
	}
	mustClaim(t, s, "j", tok, store.Claimed)
	if err := s.Release(ctx, "j", tok); err != nil {
		t.Fatal(err)
	}
	if st := statsOf(s); st.Entries != 1 {
		t.Fatalf("Stats after a release = %+v, want the record alone", st)
	}
	clock.Advance(2 * time.Hour)
	s.c.sweep(s.c.clock())
	if st := statsOf(s); st != (counts{}) {
		t.Fatalf("Stats once the record lapsed and was removed = %+v, want zero", st)
	}
}

// TestBytesMatchHeap checks that what Stats counts is close to what the
// records take on the heap, for 50,000 records of a typical size.
func TestBytesMatchHeap(t *testing.T) {
	const n = 50_000
	// settle collects until the heap stops shrinking: a store that an
	// earlier test dropped goes in two collections, with its cleanup run
	// between them.
	settle := func() (m runtime.MemStats) {
		runtime.GC()
		runtime.ReadMemStats(&m)
		for range 20 {
			time.Sleep(10 * time.Millisecond)
			last := m.HeapAlloc
			runtime.GC()
			runtime.ReadMemStats(&m)
			if m.HeapAlloc >= last-last/1000 {
				break
			}
		}
		return m
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = store.KeyName("heap", fmt.Sprint(i))
	}
	recs := make([]*store.Record, n)
	for i := range recs {
		recs[i] = liveRecord(i)
	}
	before := settle()
	s, err := New(WithMaxRecords(n))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	for i, key := range keys {
		tok := fmt.Sprintf("token-%020d", i) // a fresh string per key, as the middleware makes
		if _, err := s.Claim(ctx, key, store.Claim{Token: tok, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, key, tok, recs[i], time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	after := settle()
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	counted := statsOf(s).Bytes
	t.Logf("%d records: heap grew %d bytes (%d a record), Stats counts %d (%d a record)", n, heap, heap/n, counted, counted/n)
	if counted < heap*3/4 || counted > heap*5/4 {
		t.Errorf("Stats counts %d bytes for records that took %d on the heap: more than 25%% apart", counted, heap)
	}
	runtime.KeepAlive(keys) // alive across both measurements, as recs is
	runtime.KeepAlive(recs)
}

// TestJanitorRacesCompletes runs the janitor every millisecond while
// claims lapse and records are kept around it, and checks that it never
// removes a record or a claim inside its life.
func TestJanitorRacesCompletes(t *testing.T) {
	clock := newFakeClock()
	s := mustNew(t, WithClock(clock.Now), WithJanitorInterval(time.Millisecond))
	ctx := t.Context()
	const workers, rounds = 4, 2000
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				key := store.KeyName("janitor", fmt.Sprint(w, "-", i))
				tok := fmt.Sprint("t", w, "-", i)
				// A claim that lapses within a round, then one that is kept.
				if _, err := s.Claim(ctx, key, store.Claim{Token: "lapsing", TTL: time.Millisecond}); err != nil {
					t.Error(err)
					return
				}
				clock.Advance(time.Millisecond)
				res, err := s.Claim(ctx, key, store.Claim{Token: tok, TTL: time.Minute})
				if err != nil || res.State != store.Claimed {
					t.Errorf("claim after a lapse: %v %v", res.State, err)
					return
				}
				if err := s.Complete(ctx, key, tok, &store.Record{Status: 201, Body: []byte(tok)}, time.Hour); err != nil {
					t.Errorf("Complete of a live claim: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	for w := range workers {
		for i := range rounds {
			key := store.KeyName("janitor", fmt.Sprint(w, "-", i))
			res := mustClaim(t, s, key, "check", store.Completed)
			if want := fmt.Sprint("t", w, "-", i); string(res.Record.Body) != want {
				t.Fatalf("%d-%d: body %q, want %q", w, i, res.Record.Body, want)
			}
		}
	}
	checkInvariants(t, s)
}

// TestWaitWakesOnCompleteAndRelease: a repeat waiting on a claim in
// flight for its own request is woken by the Complete or the Release that
// settles it; a key with no such claim is not waited on.
func TestWaitWakesOnCompleteAndRelease(t *testing.T) {
	st := mustNew(t)
	ctx := context.Background()
	fp := [32]byte{7}
	for _, keep := range []bool{true, false} {
		key := fmt.Sprint("wait-", keep)
		c := store.Claim{Token: "owner", Fingerprint: fp, TTL: time.Minute}
		if res, err := st.Claim(ctx, key, c); err != nil || res.State != store.Claimed {
			t.Fatalf("claim: %v %v", res.State, err)
		}
		if ok, _ := st.Wait(ctx, key, store.Claim{Token: "other", Fingerprint: [32]byte{8}, TTL: time.Minute}); ok {
			t.Fatal("a wait for another request's fingerprint was taken")
		}
		woke := make(chan bool, 1)
		go func() {
			ok, _ := st.Wait(ctx, key, store.Claim{Token: "repeat", Fingerprint: fp, TTL: time.Minute})
			woke <- ok
		}()
		select {
		case <-woke:
			t.Fatal("the waiter returned while the claim was in flight")
		case <-time.After(20 * time.Millisecond):
		}
		var err error
		if keep {
			err = st.Complete(ctx, key, "owner", &store.Record{Status: 201, Fingerprint: fp}, time.Hour)
		} else {
			err = st.Release(ctx, key, "owner")
		}
		if err != nil {
			t.Fatal(err)
		}
		select {
		case ok := <-woke:
			if !ok {
				t.Fatal("woken with false")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter was not woken")
		}
	}
	if ok, err := st.Wait(ctx, "nobody", store.Claim{Token: "t", Fingerprint: fp, TTL: time.Minute}); ok || err != nil {
		t.Errorf("a wait on a free key: %v %v, want false at once", ok, err)
	}
}

// counts is what Stats adds up to: every entry, the expired ones the
// janitor has not removed yet included, and the bytes counted against
// WithMaxBytes.
type counts struct{ Entries, Bytes int64 }

func statsOf(s *Store) counts {
	st, err := s.Stats(context.Background())
	if err != nil {
		panic(err)
	}
	return counts{Entries: st.Records + st.InFlight + st.Expired, Bytes: st.Bytes}
}
