package middleware

import (
	"strconv"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

func TestReplayCacheBoundsAndExpiry(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	c := newReplayCache(cacheShards, time.Minute) // one entry a shard
	c.now = func() time.Time { return now }
	rec := &store.Record{Status: 201, CompletedAt: now}

	c.put("a", rec, time.Hour)
	if c.get("a") != rec {
		t.Fatal("miss right after put")
	}
	now = now.Add(time.Minute)
	if c.get("a") != nil {
		t.Fatal("entry outlived the cache TTL")
	}
	// Never past the record's own retention.
	c.put("b", &store.Record{CompletedAt: now.Add(-59 * time.Minute)}, time.Hour)
	now = now.Add(61 * time.Second)
	if c.get("b") != nil {
		t.Fatal("entry outlived the record's retention")
	}
	// Bounded: many keys leave at most one entry a shard.
	for i := range 1000 {
		c.put(strconv.Itoa(i), rec2(now), time.Hour)
	}
	n := 0
	for i := range c.shards {
		n += c.shards[i].order.Len()
		if len(c.shards[i].items) != c.shards[i].order.Len() {
			t.Fatal("map and list disagree")
		}
	}
	if n > cacheShards {
		t.Fatalf("%d entries, bound %d", n, cacheShards)
	}
}

func rec2(now time.Time) *store.Record { return &store.Record{Status: 200, CompletedAt: now} }

// TestCacheEntryNeverOutlivesItsRecordUnderClockSkew: a record kept by an
// instance whose clock is 30 s ahead of this one carries a CompletedAt 30 s
// in this clock's future, and the store drops it 30 s earlier than this
// clock's CompletedAt+retention. The cache entry used to live until then,
// replaying for 30 s a record the store no longer had.
func TestCacheEntryNeverOutlivesItsRecordUnderClockSkew(t *testing.T) {
	const retention, skew = time.Hour, 30 * time.Second
	local := time.Unix(1_000_000, 0)
	c := newReplayCache(cacheShards, 2*time.Hour) // the cache's own TTL never ends it first
	c.now = func() time.Time { return local }
	// Kept just now by a clock 30 s ahead: the store drops the record at
	// local+retention on the real (this) clock.
	rec := &store.Record{Status: 201, CompletedAt: local.Add(skew)}
	dropped := local.Add(retention)
	c.put("k", rec, retention)
	if c.get("k") != rec {
		t.Fatal("miss right after put")
	}
	local = dropped
	if c.get("k") != nil {
		t.Errorf("the entry replays a record the store dropped (CompletedAt %v ahead)", skew)
	}
	// Read back from the store near the end of its life: cached for what
	// is left of it less the margin, or not at all.
	local = time.Unix(2_000_000, 0)
	c.put("late", &store.Record{CompletedAt: local.Add(skew - retention + cacheSkewMargin/2)}, retention)
	if c.get("late") != nil {
		t.Error("a record within the margin of its end was cached")
	}
}
