package memory

import (
	"sync"
	"time"

	"github.com/idemkey/idemkey/store"
)

// entry is one key: a claim while data is nil, a kept record after.
type entry struct {
	expires int64    // clock offset at which the entry lapses
	claimed int64    // clock offset at which the key was claimed
	fp      [32]byte // the claim's fingerprint, then the record's
	// token is a claim's owner token, the caller's own string. A kept
	// record holds its token in data, and token is empty.
	token string
	// data is the kept record, encoded (see encode); nil while in flight.
	data []byte
}

// result is the answer to a claim under token that finds e, live, at now.
// It reads only e, a copy, and the record's bytes, which never change once
// kept: claim calls it after letting go of the shard's lock.
func (e *entry) result(c *core, token string, now int64) store.Result {
	switch {
	case e.data != nil:
		return store.Result{State: store.Completed, Fingerprint: e.fp, Record: decode(e.data, e.fp)}
	case e.token == token:
		return store.Result{State: store.Mine, Fingerprint: e.fp}
	default:
		return store.Result{State: store.InFlight, Fingerprint: e.fp, TTL: time.Duration(e.expires - now), ClaimedAt: c.base.Add(time.Duration(e.claimed))}
	}
}

// shard is one independently locked part of the store.
type shard struct {
	mu sync.Mutex
	m  map[digest]entry
	_  [64]byte // keeps neighbouring shards' locks off one cache line
}

// live returns d's entry when it is inside its life at now. An entry past
// its life is removed, and reported as absent.
func (sh *shard) live(c *core, d digest, now int64) (entry, bool) {
	e, ok := sh.m[d]
	if !ok {
		return entry{}, false
	}
	if now >= e.expires {
		sh.remove(c, d)
		return entry{}, false
	}
	return e, true
}

// remove deletes d.
func (sh *shard) remove(c *core, d digest) {
	delete(sh.m, d)
	c.n.Add(-1)
}

// sweep removes the shard's expired entries and returns how many it
// removed.
func (sh *shard) sweep(c *core, now int64) int {
	removed := 0
	for d, e := range sh.m {
		if now >= e.expires {
			delete(sh.m, d)
			removed++
		}
	}
	if removed > 0 {
		c.n.Add(int64(-removed))
	}
	return removed
}
