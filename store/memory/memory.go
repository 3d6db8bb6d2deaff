// Package memory is the embedded store: claims and records kept in this
// process's memory.
//
// It suits a service that runs as one process. Everything it holds is lost
// when the process exits, and two processes never see each other's claims,
// so a service with several replicas behind a load balancer needs a shared
// store such as store/redis.
//
// The store is split into shards by a hash of the key, each with its own
// lock, so requests for different keys rarely wait for each other. A claim
// is a map lookup and, for a new key, an insert under one shard's lock.
// Claims and records lapse against the store's clock (see WithClock): every
// access checks the entry it touches, and a background janitor removes the
// rest (see WithJanitorInterval). The store holds at most a fixed number of
// entries (see WithMaxRecords); when it is full it refuses claims on new
// keys with an error wrapping store.ErrFull, and never drops a claim or a
// record inside its life to make room.
//
// # Records are shared, not copied
//
// Complete takes ownership of the record it is given: the caller must not
// modify the Record, its Header or its Body afterwards. The store keeps that
// very pointer, and every Claim that finds the key completed returns it.
// Such a record is shared by every request that replays it and must be
// treated as read-only. To make accidental appends harmless, Complete clips
// the capacity of the Body slice and of each Header value slice to their
// length, so that an append to a value copied out of a kept record
// allocates a new array instead of writing into the store's.
package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
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

// Store keeps claims and records in memory. It implements store.Store and is
// safe for concurrent use. Create it with New and stop its janitor with
// Close.
type Store struct {
	c *core
}

var _ store.Store = (*Store)(nil)

// core is the state the janitor shares with the store. It is separate from
// Store so that a Store that is dropped without Close can be collected, and
// its janitor stopped.
type core struct {
	shards [numShards]shard

	seed     maphash.Seed
	now      func() time.Time
	base     time.Time // clock offsets are measured from here
	mono     bool      // now is time.Now: measure with time.Since
	max      int64
	interval time.Duration

	_         [64]byte
	n         atomic.Int64 // entries held, expired ones not yet removed included
	_         [56]byte
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
		seed:     maphash.MakeSeed(),
		now:      cfg.now,
		max:      int64(cfg.maxRecords),
		interval: cfg.interval,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	c.base = c.now()
	c.mono = cfg.defaultClock
	c.lastSweep.Store(math.MinInt64 / 2)
	for i := range c.shards {
		c.shards[i].m = make(map[string]entry)
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

// Len returns the number of claims and records the store holds, including
// expired ones that have not been removed yet.
func (s *Store) Len() int { return int(s.c.n.Load()) }

// Claim implements store.Store. It returns the context's error, and claims
// nothing, when ctx is already done; an error when c.TTL is not positive;
// and store.ErrFull when the store is full of live claims.
//
// A Completed result carries the record that Complete was given: it is
// shared, and read-only (see the package documentation).
func (s *Store) Claim(ctx context.Context, key string, c store.Claim) (store.Result, error) {
	if err := ctx.Err(); err != nil {
		return store.Result{}, err
	}
	if c.TTL <= 0 {
		return store.Result{}, errTTL
	}
	return s.c.claim(key, c)
}

// Complete implements store.Store. It takes ownership of rec (see the
// package documentation) and keeps it as given: the store does not set
// CreatedAt or CompletedAt. It returns the context's error when ctx is already
// done, and an error when rec is nil or retention is not positive; in each
// case it changes nothing.
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
	return s.c.complete(key, token, rec, retention)
}

// Release implements store.Store. It returns the context's error, and
// releases nothing, when ctx is already done.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.c.release(key, token)
}

// Extend implements store.Store. It returns the context's error when ctx is
// already done, and an error when ttl is not positive; in each case it
// changes nothing.
func (s *Store) Extend(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ttl <= 0 {
		return errTTL
	}
	return s.c.extend(key, token, ttl)
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

func (c *core) shard(key string) *shard {
	return &c.shards[maphash.String(c.seed, key)&(numShards-1)]
}

func (c *core) claim(key string, cl store.Claim) (store.Result, error) {
	sh := c.shard(key)
	for {
		sh.mu.Lock()
		// Read the clock under the lock: a reading taken before it could
		// predate a claim made meanwhile, and then answer that claim's
		// remaining life as longer than its TTL, or start this claim's
		// life before it was made.
		now := c.clock()
		if e, ok := sh.m[key]; ok {
			if now < e.expires {
				res := e.result(c, cl.Token, now)
				sh.mu.Unlock()
				return res, nil
			}
			sh.remove(c, key)
		}
		if c.reserve() {
			sh.m[key] = entry{token: cl.Token, fp: cl.Fingerprint, claimed: now, expires: later(now, cl.TTL)}
			sh.mu.Unlock()
			return store.Result{State: store.Claimed, Fingerprint: cl.Fingerprint}, nil
		}
		sh.mu.Unlock()
		if !c.makeRoom(now) {
			return store.Result{}, c.full()
		}
	}
}

// reserve counts one more entry, unless the store is full.
func (c *core) reserve() bool {
	for {
		n := c.n.Load()
		if n >= c.max {
			return false
		}
		if c.n.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (c *core) complete(key, token string, rec *store.Record, retention time.Duration) error {
	clip(rec)
	return c.owned(key, token, keptBy(token), func(sh *shard, e entry, now int64) {
		sh.m[key] = entry{token: token, fp: rec.Fingerprint, claimed: e.claimed, expires: later(now, retention), rec: rec}
	})
}

func (c *core) release(key, token string) error {
	return c.owned(key, token, free, func(sh *shard, e entry, _ int64) {
		sh.remove(c, key)
	})
}

func (c *core) extend(key, token string, ttl time.Duration) error {
	return c.owned(key, token, nil, func(sh *shard, e entry, now int64) {
		e.expires = later(now, ttl)
		sh.m[key] = e
	})
}

// owned runs change on key's entry, under its shard's lock, when key is in
// flight under token. Otherwise it changes nothing, and returns nil when
// done (if not nil) reports that the key already is as the call would have
// left it (a resent call), and store.ErrNotOwner when it is not. Complete,
// Release and Extend are all this check followed by their own change.
func (c *core) owned(key, token string, done func(e entry, ok bool) bool, change func(sh *shard, e entry, now int64)) error {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := c.clock() // under the lock, as in claim
	e, ok := sh.m[key]
	if !sh.owned(c, key, e, ok, token, now) {
		if ok && now >= e.expires {
			ok = false // owned removed it
		}
		if done != nil && done(e, ok) {
			return nil
		}
		return store.ErrNotOwner
	}
	change(sh, e, now)
	return nil
}

// keptBy reports a key that holds a record kept under token.
func keptBy(token string) func(e entry, ok bool) bool {
	return func(e entry, ok bool) bool { return ok && e.rec != nil && e.token == token }
}

// free reports a key that holds nothing.
func free(_ entry, ok bool) bool { return !ok }

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

// full returns the error of a claim refused because the store is full.
func (c *core) full() error {
	return fmt.Errorf("idemkey: memory: %d entries held, the bound is %d: %w", c.n.Load(), c.max, store.ErrFull)
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

// clip sets the capacity of rec's slices to their length.
func clip(rec *store.Record) {
	if cap(rec.Body) > len(rec.Body) {
		rec.Body = rec.Body[:len(rec.Body):len(rec.Body)]
	}
	for k, vs := range rec.Header {
		if cap(vs) > len(vs) {
			rec.Header[k] = vs[:len(vs):len(vs)]
		}
	}
}
