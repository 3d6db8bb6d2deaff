package middleware

import (
	"container/list"
	"hash/maphash"
	"sync"
	"time"

	"github.com/idemkey/idemkey/store"
)

// replayCache is a bounded in-process LRU of completed records, keyed by
// store key. A completed record never changes, so a cached one is exactly
// what the store would answer, for as long as the entry's life (never past
// the record's own retention).
type replayCache struct {
	seed   maphash.Seed
	shards [cacheShards]cacheShard
	ttl    time.Duration
	now    func() time.Time
}

const cacheShards = 16

type cacheShard struct {
	mu    sync.Mutex
	max   int
	items map[string]*list.Element
	order list.List // front: most recently used
}

type cacheEntry struct {
	key     string
	rec     *store.Record
	expires time.Time
	// raw is the raw digest (internal/rawdigest) of a request whose fingerprint
	// matched rec's, when hasRaw: a repeat with the same digest has the same
	// fingerprint (see Middleware.cached).
	raw    [32]byte
	hasRaw bool
}

func newReplayCache(size int, ttl time.Duration) *replayCache {
	c := &replayCache{seed: maphash.MakeSeed(), ttl: ttl, now: time.Now}
	per := max(1, (size+cacheShards-1)/cacheShards)
	for i := range c.shards {
		c.shards[i].max = per
		c.shards[i].items = make(map[string]*list.Element)
	}
	return c
}

func (c *replayCache) shard(key string) *cacheShard {
	return &c.shards[maphash.String(c.seed, key)%cacheShards]
}

// get returns the cached record for key, if there is a live one.
func (c *replayCache) get(key string) *store.Record {
	rec, _, _ := c.lookup(key)
	return rec
}

// lookup returns the cached record for key, if there is a live one, and
// the raw digest of a request known to match it (when hasRaw).
func (c *replayCache) lookup(key string) (rec *store.Record, raw [32]byte, hasRaw bool) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.items[key]
	if !ok {
		return nil, raw, false
	}
	e := el.Value.(*cacheEntry)
	if !c.now().Before(e.expires) {
		s.order.Remove(el)
		delete(s.items, key)
		return nil, raw, false
	}
	s.order.MoveToFront(el)
	return e.rec, e.raw, e.hasRaw
}

// learn notes that requests whose raw digest is raw match rec, while rec is
// still key's entry.
func (c *replayCache) learn(key string, rec *store.Record, raw [32]byte) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.items[key]; ok {
		if e := el.Value.(*cacheEntry); e.rec == rec {
			e.raw, e.hasRaw = raw, true
		}
	}
}

// cacheSkewMargin is how long before the end of a record's retention, as
// this process's clock reads it, its local cache entry (WithLocalCache)
// lapses at the latest.
//
// A record's CompletedAt comes from the clock of the process (or server)
// that kept it, and the store drops the record by its own: when this
// process's clock is behind theirs, CompletedAt plus the retention ends
// later here than the record does there, and an entry bounded by it alone
// would replay a record the store no longer has (after which the key runs
// again elsewhere) for as long as the clocks are apart. Clocks up to this
// margin apart never make an entry outlive its record.
const cacheSkewMargin = time.Minute

// put caches rec under key until the cache's TTL or cacheSkewMargin before
// the end of the record's retention, whichever comes first.
func (c *replayCache) put(key string, rec *store.Record, retention time.Duration) {
	now := c.now()
	expires := now.Add(c.ttl)
	if end := rec.CompletedAt.Add(retention - cacheSkewMargin); end.Before(expires) {
		expires = end
	}
	if !now.Before(expires) {
		return
	}
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.items[key]; ok {
		el.Value = &cacheEntry{key: key, rec: rec, expires: expires}
		s.order.MoveToFront(el)
		return
	}
	s.items[key] = s.order.PushFront(&cacheEntry{key: key, rec: rec, expires: expires})
	if s.order.Len() > s.max {
		last := s.order.Back()
		s.order.Remove(last)
		delete(s.items, last.Value.(*cacheEntry).key)
	}
}
