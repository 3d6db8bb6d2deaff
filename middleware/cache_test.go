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
