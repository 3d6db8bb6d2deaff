package memory

import (
	"sync"
	"time"

	"github.com/idemkey/idemkey/store"
)

// entry is one key: a claim while rec is nil, a completed record after.
type entry struct {
	token   string   // the owner's token; kept with the record, so a resent Complete finds its own
	fp      [32]byte // the claim's fingerprint, then the record's
	claimed int64    // clock offset at which the key was claimed
	expires int64    // clock offset at which the entry lapses
	rec     *store.Record
}

func (e *entry) result(c *core, token string, now int64) store.Result {
	switch {
	case e.rec != nil:
		return store.Result{State: store.Completed, Fingerprint: e.fp, Record: e.rec}
	case e.token == token:
		return store.Result{State: store.Mine, Fingerprint: e.fp}
	default:
		return store.Result{State: store.InFlight, Fingerprint: e.fp, TTL: time.Duration(e.expires - now), ClaimedAt: c.base.Add(time.Duration(e.claimed))}
	}
}

// shard is one independently locked part of the store.
type shard struct {
	mu sync.Mutex
	m  map[string]entry
	_  [64]byte // keeps neighbouring shards' locks off one cache line
}

// owned reports whether e (ok: present) is a live claim held by token. A
// lapsed entry it finds is removed.
func (sh *shard) owned(c *core, key string, e entry, ok bool, token string, now int64) bool {
	if !ok {
		return false
	}
	if now >= e.expires {
		sh.remove(c, key)
		return false
	}
	return e.rec == nil && e.token == token
}

// remove deletes key.
func (sh *shard) remove(c *core, key string) {
	delete(sh.m, key)
	c.n.Add(-1)
}

// sweep removes the shard's expired entries and returns how many it
// removed.
func (sh *shard) sweep(c *core, now int64) int {
	removed := 0
	for k, e := range sh.m {
		if now >= e.expires {
			delete(sh.m, k)
			removed++
		}
	}
	if removed > 0 {
		c.n.Add(int64(-removed))
	}
	return removed
}
