package memory

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey/store"
)

// entry is one key: a claim while rec is nil, a completed record after.
type entry struct {
	token   string   // the owner's token; kept with the record, so a resent Complete finds its own
	fp      [32]byte // the claim's fingerprint, then the record's
	claimed int64    // clock offset at which the key was claimed
	expires int64    // clock offset at which the entry lapses
	seq     uint64   // completion order; 0 while in flight
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

// doneRef names a completed record in a shard's completion queue. It is
// stale once the key no longer holds the record with that sequence number.
type doneRef struct {
	key string
	seq uint64
}

// shard is one independently locked part of the store.
type shard struct {
	mu sync.Mutex
	m  map[string]entry
	// done holds the shard's completed records from done[head] on, in
	// completion order, oldest first, with stale references among them.
	// The front, when there is one, is never stale.
	done []doneRef
	head int
	// oldest is the sequence number of the front of done, or MaxUint64
	// when there is none. It is written under mu and read without it.
	oldest atomic.Uint64
	_      [64]byte // keeps neighbouring shards' locks off one cache line
}

// owned reports whether e (ok: present) is a live claim held by token. A
// lapsed entry it finds is removed.
func (sh *shard) owned(c *core, key string, e entry, ok bool, token string, now int64) bool {
	if !ok {
		return false
	}
	if now >= e.expires {
		sh.remove(c, key, e)
		return false
	}
	return e.rec == nil && e.token == token
}

// remove deletes key, which holds e.
func (sh *shard) remove(c *core, key string, e entry) {
	delete(sh.m, key)
	c.n.Add(-1)
	if e.rec != nil && sh.head < len(sh.done) && sh.done[sh.head].seq == e.seq {
		sh.trimFront()
	}
}

func (sh *shard) live(r doneRef) bool {
	e, ok := sh.m[r.key]
	return ok && e.seq == r.seq
}

// pushDone appends a newly completed record to the completion queue.
func (sh *shard) pushDone(key string, seq uint64) {
	switch {
	case len(sh.done)-sh.head > 2*len(sh.m)+64:
		// Mostly stale: records that lapsed behind a longer-lived one.
		sh.compact()
	case sh.head > 0 && sh.head >= len(sh.done)/2:
		n := copy(sh.done, sh.done[sh.head:])
		clear(sh.done[n:])
		sh.done, sh.head = sh.done[:n], 0
	}
	sh.done = append(sh.done, doneRef{key: key, seq: seq})
	if sh.head == len(sh.done)-1 {
		sh.oldest.Store(seq)
	}
}

// compact drops the stale references from the completion queue.
func (sh *shard) compact() {
	n := 0
	for _, r := range sh.done[sh.head:] {
		if sh.live(r) {
			sh.done[n] = r
			n++
		}
	}
	clear(sh.done[n:])
	sh.done, sh.head = sh.done[:n], 0
	sh.setOldest()
}

// trimFront drops stale references from the front of the completion queue.
func (sh *shard) trimFront() {
	for sh.head < len(sh.done) && !sh.live(sh.done[sh.head]) {
		sh.done[sh.head] = doneRef{}
		sh.head++
	}
	sh.setOldest()
}

func (sh *shard) setOldest() {
	if sh.head == len(sh.done) {
		sh.done, sh.head = sh.done[:0], 0
		sh.oldest.Store(math.MaxUint64)
		return
	}
	sh.oldest.Store(sh.done[sh.head].seq)
}

// evictOldest removes the shard's record completed longest ago, and reports
// whether there was one.
func (sh *shard) evictOldest(c *core) bool {
	if sh.head == len(sh.done) {
		return false
	}
	r := sh.done[sh.head]
	delete(sh.m, r.key)
	c.n.Add(-1)
	sh.trimFront()
	return true
}

// sweep removes the shard's expired entries and returns how many it
// removed.
func (sh *shard) sweep(c *core, now int64) int {
	removed, records := 0, false
	for k, e := range sh.m {
		if now >= e.expires {
			delete(sh.m, k)
			removed++
			records = records || e.rec != nil
		}
	}
	if removed > 0 {
		c.n.Add(int64(-removed))
	}
	if records {
		sh.compact()
	}
	return removed
}
