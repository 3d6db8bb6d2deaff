package main

import (
	"context"
	"errors"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/proctest"
	"github.com/idemkey/idemkey/store"
)

// The soak is a command for minutes of load; these tests run it for two
// seconds at a time to show that its checks pass on a correct store and
// catch the faults they are there for, on stores broken on purpose.

func shortSoak(t *testing.T, cfg config) *result {
	t.Helper()
	// More repeats than the command's default, so that a short run on a
	// slow machine (a few hundred requests under the race detector) still
	// sends every kind.
	m, err := newMix(0.5, 0.05, 0.2)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.store == "" {
		cfg.store = "memory"
	}
	cfg.cacheSize, cfg.cacheTTL = 1000, time.Minute
	cfg.retention, cfg.maxRecords, cfg.janitor = 30*time.Second, 100_000, time.Second
	cfg.redisBin, cfg.pool = "redis-server", 8
	res, err := soak(options{
		cfg: cfg, d: 2 * time.Second, startAt: 500 * time.Millisecond, every: time.Hour,
		clients: 4, mix: m, ring: 256,
		// Long enough that a pair's second request finds the first in
		// flight however the goroutines are scheduled.
		pairWork: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.rows) != 3 {
		t.Fatalf("rows %+v, want start, middle and end", res.rows)
	}
	return res
}

// exercised checks that a soak sent each kind of request and got each
// kind of answer it is there to check.
func exercised(t *testing.T, res *result) {
	t.Helper()
	l := res.last()
	if l.firstRuns == 0 || l.replays == 0 || l.conflicts == 0 || l.reused == 0 || res.tally.pairs.Load() == 0 {
		t.Errorf("the soak did not exercise every path: %+v, %d pairs", l, res.tally.pairs.Load())
	}
	if l.storeKeys == 0 || l.goroutines == 0 || l.heapInuse == 0 {
		t.Errorf("end row without process or store figures: %+v", l)
	}
}

func TestSoakMemory(t *testing.T) {
	res := shortSoak(t, config{})
	if !res.ok() {
		t.Fatalf("failed checks on the memory store: %+v\n%q", res.last(), res.notes)
	}
	exercised(t, res)
}

func TestSoakMemoryLocalCache(t *testing.T) {
	res := shortSoak(t, config{cache: true})
	if !res.ok() {
		t.Fatalf("failed checks on the memory store with the local cache: %+v\n%q", res.last(), res.notes)
	}
	exercised(t, res)
}

func TestSoakRedis(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		proctest.Unavailable(t, "redis-server not on PATH")
	}
	res := shortSoak(t, config{store: "redis"})
	if !res.ok() {
		t.Fatalf("failed checks on the redis store: %+v\n%q", res.last(), res.notes)
	}
	exercised(t, res)
}

// forgetful keeps no record: Complete releases the claim instead, so every
// repeat runs the handler again.
type forgetful struct{ store.Store }

func (f forgetful) Complete(ctx context.Context, key, token string, _ *store.Record, _ time.Duration) error {
	return f.Store.Release(ctx, key, token)
}

func TestSoakCatchesDoubleRuns(t *testing.T) {
	res := shortSoak(t, config{wrap: func(s store.Store) store.Store { return forgetful{s} }})
	if res.ok() || res.last().doubleRuns == 0 {
		t.Fatalf("a store that keeps nothing passed: %+v", res.last())
	}
}

// mixedUp answers a completed key with the record of the key completed
// last: the same request, another key's answer.
type mixedUp struct {
	store.Store
	last atomic.Pointer[store.Record]
}

func (m *mixedUp) Claim(ctx context.Context, key string, c store.Claim) (store.Result, error) {
	r, err := m.Store.Claim(ctx, key, c)
	if err == nil && r.State == store.Completed {
		if other := m.last.Load(); other != nil {
			r.Record = other
		}
	}
	return r, err
}

func (m *mixedUp) Complete(ctx context.Context, key, token string, rec *store.Record, retention time.Duration) error {
	err := m.Store.Complete(ctx, key, token, rec, retention)
	if err == nil {
		// Only now: the store may adjust rec as it keeps it.
		m.last.Store(rec)
	}
	return err
}

func TestSoakCatchesWrongReplays(t *testing.T) {
	res := shortSoak(t, config{wrap: func(s store.Store) store.Store { return &mixedUp{Store: s} }})
	if res.ok() || res.last().wrongReplays == 0 {
		t.Fatalf("a store that replays another key's answer passed: %+v", res.last())
	}
	if res.last().doubleRuns != 0 {
		t.Errorf("double runs from a store that only mixes up replays: %+v", res.last())
	}
}

// refusing fails every third claim, as a full or unreachable store does.
type refusing struct {
	store.Store
	n atomic.Int64
}

func (r *refusing) Claim(ctx context.Context, key string, c store.Claim) (store.Result, error) {
	if r.n.Add(1)%3 == 0 {
		return store.Result{}, errors.New("refusing: full")
	}
	return r.Store.Claim(ctx, key, c)
}

func TestSoakCountsRefusalsApart(t *testing.T) {
	res := shortSoak(t, config{wrap: func(s store.Store) store.Store { return &refusing{Store: s} }})
	if !res.ok() {
		t.Fatalf("503s counted as failures: %+v\n%q", res.last(), res.notes)
	}
	if res.last().refused == 0 {
		t.Fatalf("no 503 from a store that refuses every third claim: %+v", res.last())
	}
}
