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

// entryOverhead is what the store counts, in bytes, for each claim or
// record it holds, beside the claim's token or the record's own bytes: its
// slot in a shard's map (a 32-byte key and the 88-byte entry, a control
// byte, and the map's spare room). TestEntryOverheadCoversWhatASlotTakes
// measures it with runtime.MemStats, the heap's growth while a store fills
// with up to 128,000 claims or records, less their tokens and records:
// 170 to 276 bytes an entry (Go 1.26, amd64), the most just after the
// maps' tables double (121 bytes a slot at 7/16 full). The count is the
// most, with room for noise, so that WithMaxBytes bounds what the store
// takes.
const entryOverhead = 300

// cost returns the bytes e counts for against the store's byte bound.
func (e *entry) cost() int64 {
	return entryOverhead + int64(len(e.token)) + int64(cap(e.data))
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
	// waiters holds, for a claim in flight that repeats wait on (Wait),
	// the channel its Complete or Release closes; nil until one waits.
	waiters map[digest]chan struct{}
	_       [64]byte // keeps neighbouring shards' locks off one cache line
}

// wake wakes the waiters of d, whose claim was just kept or released.
func (sh *shard) wake(d digest) {
	if ch, ok := sh.waiters[d]; ok {
		close(ch)
		delete(sh.waiters, d)
	}
}

// live returns d's entry when it is inside its life at now. An entry past
// its life is removed, and reported as absent.
func (sh *shard) live(c *core, d digest, now int64) (entry, bool) {
	e, ok := sh.m[d]
	if !ok {
		return entry{}, false
	}
	if now >= e.expires {
		sh.remove(c, d, e)
		return entry{}, false
	}
	return e, true
}

// remove deletes d, which holds e.
func (sh *shard) remove(c *core, d digest, e entry) {
	delete(sh.m, d)
	sh.wake(d)
	c.n.Add(-1)
	c.bytes.Add(-e.cost())
}

// sweep removes the shard's expired entries and returns how many it
// removed.
func (sh *shard) sweep(c *core, now int64) int {
	removed, bytes := 0, int64(0)
	for d, e := range sh.m {
		if now >= e.expires {
			delete(sh.m, d)
			sh.wake(d)
			removed++
			bytes += e.cost()
		}
	}
	if removed > 0 {
		c.n.Add(int64(-removed))
		c.bytes.Add(-bytes)
	}
	return removed
}
