// Package memory is the embedded store: claims and records kept in this
// process's memory.
//
// It is for a service that runs as one process, and for tests. Everything
// it holds is lost when the process exits, and two processes never see each
// other's claims, so a service with several replicas behind a load balancer
// needs a shared store such as store/redis.
//
// # Bounds: full means 503, never eviction
//
// The store holds at most WithMaxRecords claims and records together
// (default 100,000) and at most WithMaxBytes bytes of them (default
// 256 MiB; see Stats for what is counted). A claim on a new key that would
// pass either bound first removes expired entries (one pass over the store
// at most every second), and is then refused with an error wrapping
// store.ErrFull, which the middleware answers with 503 unavailable and
// reports. The store never drops a claim or a record inside its life to
// make room, so one caller's flood of fresh keys cannot make another
// caller's retry run its handler again: it fills the store, and new keys
// wait until records lapse. On a full store everything already held works
// as ever: replays, in-flight answers, Complete, Release and Extend.
//
// Complete is never refused, whatever the record's size: the bytes held can
// pass WithMaxBytes by the records of the claims in flight when it was
// reached (see WithMaxBytes).
//
// Stats (store.Inspector) counts the entries and bytes held, to see how
// near the bounds a service runs; Inspect and Delete look into and remove
// one key's entry.
//
// # Time
//
// Claims and records lapse against the store's clock (see WithClock): every
// access checks the entry it touches, and a background janitor removes the
// rest (see WithJanitorInterval). Expired entries count against the bounds
// until they are removed.
//
// # Records are copied
//
// Complete copies the record it is given, and its owner token, into one
// byte slice, so that the garbage collector has one object, with no pointer
// in it, to mark for each record the store holds: the caller keeps rec, and
// may reuse or change it once Complete returns. Every Claim that finds the
// key completed returns a new Record decoded from that copy, with a new
// Header: the caller may change both. Its Body, though, is the store's own
// copy, shared with every other replay of the key, and must not be written
// to; its capacity is clipped to its length, so an append to it copies it.
// Decoding costs a replay three small allocations (the Record, its Header
// map and the map's table; the names and values are read from the kept
// bytes without a copy); a service that replays the same keys often can
// keep decoded records with the middleware's WithLocalCache.
//
// # Inside
//
// The store is split into shards by the key's digest, each with its own
// lock, so requests for different keys rarely wait for each other. A claim
// is a map lookup and, for a new key, an insert under one shard's lock. The
// maps are keyed by the 32-byte SHA-256 inside a name store.KeyName makes
// (any other name is held under a SHA-256 of it), so their keys hold no
// pointers either.
package memory

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey/store"
)

// numShards is the number of independently locked parts of the store; a
// power of two.
const numShards = 64

// minSweepGap is how long, on the store's clock, a claim that finds the
// store full waits before it makes another pass over the whole store for
// expired entries.
const minSweepGap = int64(time.Second)

var (
	errTTL       = errors.New("idemkey: memory: the claim's TTL must be positive")
	errRetention = errors.New("idemkey: memory: the retention must be positive")
	errNilRecord = errors.New("idemkey: memory: the record must not be nil")
)

// Store keeps claims and records in memory. It implements store.Store and
// store.Extender, and is safe for concurrent use. Create it with New and
// stop its janitor with Close.
type Store struct {
	c *core
}

var (
	_ store.Store       = (*Store)(nil)
	_ store.Extender    = (*Store)(nil)
	_ store.Waiter      = (*Store)(nil)
	_ store.LazyClaimer = (*Store)(nil)
)

// core is the state the janitor shares with the store. It is separate from
// Store so that a Store that is dropped without Close can be collected, and
// its janitor stopped.
type core struct {
	shards [numShards]shard

	now      func() time.Time
	base     time.Time // clock offsets are measured from here
	mono     bool      // now is time.Now: measure with time.Since
	max      int64     // bound on entries
	maxBytes int64     // bound on bytes, checked by claims
	interval time.Duration

	_ [64]byte
	// n and bytes are what the store holds, expired entries not yet
	// removed included; bytes as cost counts them. They share a cache
	// line: every change to one changes the other.
	n         atomic.Int64
	bytes     atomic.Int64
	_         [48]byte
	lastSweep atomic.Int64 // clock offset of the last pass over the whole store

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// New returns an empty store and starts its janitor, which runs until Close.
// A store that becomes unreachable without Close has its janitor stopped
// when it is garbage collected. It returns an error, and no store, when an
// option is invalid (see each option).
func New(opts ...Option) (*Store, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	c := &core{
		now:      cfg.now,
		max:      int64(cfg.maxRecords),
		maxBytes: cfg.maxBytes,
		interval: cfg.interval,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	c.base = c.now()
	c.mono = cfg.defaultClock
	c.lastSweep.Store(math.MinInt64 / 2)
	for i := range c.shards {
		c.shards[i].m = make(map[digest]entry)
	}
	go c.janitor()
	s := &Store{c: c}
	runtime.AddCleanup(s, (*core).stopJanitor, c)
	return s, nil
}

// Close stops the janitor and waits for it to exit. It is idempotent and
// always returns nil. The store stays usable after Close: entries still
// lapse when they are accessed, but nothing removes the ones that are not.
func (s *Store) Close() error {
	s.c.stopJanitor()
	<-s.c.done
	return nil
}

// Claim implements store.Store. It returns the context's error, and claims
// nothing, when ctx is already done; an error when c.TTL is not positive;
// and an error wrapping store.ErrFull when the store is full.
//
// A Completed result carries a new Record whose Body is shared and
// read-only (see the package documentation).
func (s *Store) Claim(ctx context.Context, key string, c store.Claim) (store.Result, error) {
	if err := ctx.Err(); err != nil {
		return store.Result{}, err
	}
	if c.TTL <= 0 {
		return store.Result{}, errTTL
	}
	return s.c.claim(digestOf(key), c, nil)
}

// ClaimLazy implements store.LazyClaimer: it is Claim, asking fp for the
// fingerprint only when the key is free, outside the shard's lock (the
// key is looked at again once it is computed).
func (s *Store) ClaimLazy(ctx context.Context, key string, c store.Claim, fp store.Fingerprinter) (store.Result, error) {
	if err := ctx.Err(); err != nil {
		return store.Result{}, err
	}
	if c.TTL <= 0 {
		return store.Result{}, errTTL
	}
	return s.c.claim(digestOf(key), c, fp)
}

// Complete implements store.Store. It keeps a copy of rec as given (see the
// package documentation): the store does not set CreatedAt or CompletedAt.
// It returns the context's error when ctx is already done, and an error
// when rec is nil or retention is not positive; in each case it changes
// nothing.
func (s *Store) Complete(ctx context.Context, key, token string, rec *store.Record, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if rec == nil {
		return errNilRecord
	}
	if retention <= 0 {
		return errRetention
	}
	return s.c.complete(digestOf(key), token, rec, retention)
}

// Release implements store.Store. It returns the context's error, and
// releases nothing, when ctx is already done.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.c.release(digestOf(key), token)
}

// Wait implements store.Waiter: it returns true when the claim in flight
// for c's request on key has been kept or released, or when ctx is done,
// woken at that moment by the Complete or Release that settled it, and
// false at once when key holds no such claim. A claim that lapses wakes
// its waiters when the store next finds it lapsed (a claim of the key, or
// the sweeper).
func (s *Store) Wait(ctx context.Context, key string, c store.Claim) (bool, error) {
	ch := s.c.wait(digestOf(key), c.Fingerprint)
	if ch == nil {
		return false, nil
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
	return true, nil
}

// Extend implements store.Extender. It returns the context's error when ctx
// is already done, and an error when ttl is not positive; in each case it
// changes nothing.
func (s *Store) Extend(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ttl <= 0 {
		return errTTL
	}
	return s.c.extend(digestOf(key), token, ttl)
}

// clock returns the current time as an offset from c.base.
func (c *core) clock() int64 {
	if c.mono {
		// time.Since reads only the monotonic clock, half the cost of
		// time.Now, which reads the wall clock too.
		return int64(time.Since(c.base))
	}
	return int64(c.now().Sub(c.base))
}

// shard returns the shard that holds d. A digest is a SHA-256 already, so
// its first byte spreads keys evenly.
func (c *core) shard(d digest) *shard {
	return &c.shards[d[0]&(numShards-1)]
}

// claim claims d for cl, or says what holds it. When fp is not nil, the
// claim's fingerprint is fp's, asked for only when d is free, outside the
// lock: d is looked at again once it is known.
func (c *core) claim(d digest, cl store.Claim, fp store.Fingerprinter) (store.Result, error) {
	sh := c.shard(d)
	for {
		sh.mu.Lock()
		// Read the clock under the lock: a reading taken before it could
		// predate a claim made meanwhile, and then answer that claim's
		// remaining life as longer than its TTL, or start this claim's
		// life before it was made.
		now := c.clock()
		e, ok := sh.live(c, d, now)
		if ok {
			sh.mu.Unlock()
			return e.result(c, cl.Token, now), nil
		}
		if fp != nil {
			sh.mu.Unlock()
			cl.Fingerprint, fp = fp.Fingerprint(), nil
			continue
		}
		e = entry{token: cl.Token, fp: cl.Fingerprint, claimed: now, expires: later(now, cl.TTL)}
		bound := c.reserve(e.cost())
		if bound == withinBounds {
			sh.m[d] = e
			sh.mu.Unlock()
			return store.Result{State: store.Claimed, Fingerprint: cl.Fingerprint}, nil
		}
		sh.mu.Unlock()
		if !c.makeRoom(now) {
			return store.Result{}, c.full(bound)
		}
	}
}

// The outcomes of reserve.
const (
	withinBounds = iota
	entriesFull
	bytesFull
)

// reserve counts one more entry, of cost bytes, unless that would take the
// store past one of its bounds: then it counts nothing and says which.
func (c *core) reserve(cost int64) int {
	for {
		n := c.n.Load()
		if n >= c.max {
			return entriesFull
		}
		if c.n.CompareAndSwap(n, n+1) {
			break
		}
	}
	for {
		b := c.bytes.Load()
		if b+cost > c.maxBytes {
			c.n.Add(-1)
			return bytesFull
		}
		if c.bytes.CompareAndSwap(b, b+cost) {
			return withinBounds
		}
	}
}

// full returns the error of a claim that reserve refused for bound. It is
// made outside the shard's lock, which a flood of refused claims would
// otherwise hold the longer.
func (c *core) full(bound int) error {
	if bound == entriesFull {
		return fmt.Errorf("idemkey: memory: %d entries held, the bound is %d: %w", c.n.Load(), c.max, store.ErrFull)
	}
	return fmt.Errorf("idemkey: memory: %d bytes held, the bound is %d: %w", c.bytes.Load(), c.maxBytes, store.ErrFull)
}

// complete keeps rec when d is in flight under token. It returns nil, and
// changes nothing, when d already holds a record kept under token (a
// resent Complete), and store.ErrNotOwner otherwise.
func (c *core) complete(d digest, token string, rec *store.Record, retention time.Duration) error {
	data := encode(token, rec) // outside the lock: it allocates and copies
	sh := c.shard(d)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := c.clock() // under the lock, as in claim
	e, ok := sh.live(c, d, now)
	switch {
	case !ok:
		return store.ErrNotOwner
	case e.data == nil && e.token == token:
		// Kept even when it takes the store past its byte bound: the
		// handler has run, and a record dropped here would let a retry
		// run it again. Claims are what the bound refuses.
		kept := entry{fp: rec.Fingerprint, claimed: e.claimed, expires: later(now, retention), data: data}
		sh.m[d] = kept
		c.bytes.Add(kept.cost() - e.cost())
		sh.wake(d)
		return nil
	case e.data != nil && string(tokenOf(e.data)) == token:
		return nil
	}
	return store.ErrNotOwner
}

// release deletes d's claim when it is in flight under token. It returns
// nil when d holds nothing (a resent Release, or a lapsed claim), and
// store.ErrNotOwner, deleting nothing, otherwise.
func (c *core) release(d digest, token string) error {
	sh := c.shard(d)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.live(c, d, c.clock())
	switch {
	case !ok:
		return nil
	case e.data == nil && e.token == token:
		sh.remove(c, d, e) // which wakes its waiters
		return nil
	}
	return store.ErrNotOwner
}

// wait returns a channel closed when d's claim in flight with fingerprint
// fp is kept or released, or nil when d holds no such claim at now.
func (c *core) wait(d digest, fp [32]byte) <-chan struct{} {
	sh := c.shard(d)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.live(c, d, c.clock())
	if !ok || e.data != nil || e.fp != fp {
		return nil
	}
	if sh.waiters == nil {
		sh.waiters = make(map[digest]chan struct{})
	}
	ch, ok := sh.waiters[d]
	if !ok {
		ch = make(chan struct{})
		sh.waiters[d] = ch
	}
	return ch
}

// extend sets the remaining life of d's claim when it is in flight under
// token, and returns store.ErrNotOwner otherwise.
func (c *core) extend(d digest, token string, ttl time.Duration) error {
	sh := c.shard(d)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := c.clock()
	e, ok := sh.live(c, d, now)
	if !ok || e.data != nil || e.token != token {
		return store.ErrNotOwner
	}
	e.expires = later(now, ttl)
	sh.m[d] = e
	return nil
}

// makeRoom removes expired entries for a claim that found the store full,
// and reports whether it removed any. It makes a pass over the whole store
// only when no pass was made in the last minSweepGap (the janitor's
// included), so that a flood of claims on a full store does not make one
// pass each. It never removes an entry inside its life.
func (c *core) makeRoom(now int64) bool {
	last := c.lastSweep.Load()
	if now-last < minSweepGap || !c.lastSweep.CompareAndSwap(last, now) {
		return false
	}
	return c.sweep(now) > 0
}

// sweep removes every expired entry and returns how many it removed.
func (c *core) sweep(now int64) int {
	removed := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		removed += sh.sweep(c, now)
		sh.mu.Unlock()
	}
	return removed
}

func (c *core) janitor() {
	defer close(c.done)
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			now := c.clock()
			c.lastSweep.Store(now)
			c.sweep(now)
		}
	}
}

// stopJanitor tells the janitor to exit, without waiting for it.
func (c *core) stopJanitor() {
	c.closeOnce.Do(func() { close(c.stop) })
}

// later returns now+d, saturating instead of overflowing.
func later(now int64, d time.Duration) int64 {
	if now > 0 && int64(d) > math.MaxInt64-now {
		return math.MaxInt64
	}
	return now + int64(d)
}
