package middleware

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/idemkey/idemkey/store"
)

// An owner is how a request that owns its key settles it: a store.Tx. A
// store.TxStore's claim hands one out, the handler's transaction; for a
// plain store the claim itself is seen as one (claimTx); a covered request
// without a key on a transactional store runs in a transaction with no
// claim (txOwner, keyless), and one that WithFailOpen runs without a claim
// has an owner that keeps nothing (openOwner). So the flow has one path
// whatever the store and the options: what differs is decided here, by
// the owner (what a failed keep means, whether anything is claimed) and by
// the functions below that choose it (keyless, claimFailed).
type owner interface {
	store.Tx
	// atomic reports whether the record commits with the handler's own
	// writes: a failed Commit then undid them (or may have), so the
	// response must not go out, and Commit is not tried again.
	atomic() bool
	// claimed reports whether the owner holds the request's key in the
	// store: the response of an owner that does not (a keyless request's
	// transaction, a fail-open run) is neither kept nor cached, and of its
	// events only store errors are reported.
	claimed() bool
	// done is called once the handler has returned: the claim is settled,
	// or left to lapse, and no longer held.
	done()
}

// claim makes one claim of the key in the store: in a transaction when the
// store runs handlers in one. When the answer is Claimed or Mine it
// returns the key's owner.
func (m *Middleware) claim(ctx context.Context, a *attempt) (store.Result, owner, error) {
	if m.tx != nil {
		a.Fingerprint()
		res, tx, err := m.tx.ClaimTx(ctx, a.skey, a.claim)
		if err != nil || tx == nil {
			return res, nil, err
		}
		return res, a.ownTx(tx), nil
	}
	var res store.Result
	var err error
	if m.lazy != nil && !a.printed {
		// The store asks for the fingerprint only to write the claim.
		res, err = m.lazy.ClaimLazy(ctx, a.skey, a.claim, a)
	} else {
		a.Fingerprint()
		res, err = m.store.Claim(ctx, a.skey, a.claim)
	}
	if err != nil || (res.State != store.Claimed && res.State != store.Mine) {
		return res, nil, err
	}
	// The claim's transaction lives in the attempt: no allocation of its
	// own.
	a.plain = claimTx{m: m, r: a.r, skey: a.skey, digest: a.digest, token: a.claim.Token, ttl: a.claim.TTL}
	c := &a.plain
	if m.ext != nil {
		m.beats.Hold(c, a.start)
	}
	return res, c, nil
}

// txOwner is a store.TxStore's transaction: the claim's (keyed), or that
// of a request without a key.
type txOwner struct {
	store.Tx
	keyed bool
}

// ownTx makes tx, the claim's transaction, the attempt's owner, kept in
// the attempt: no allocation of its own.
func (a *attempt) ownTx(tx store.Tx) owner {
	a.tx = txOwner{Tx: tx, keyed: true}
	return &a.tx
}

func (*txOwner) atomic() bool    { return true }
func (t *txOwner) claimed() bool { return t.keyed }
func (*txOwner) done()           {}

// claimTx is a plain store's claim seen as a transaction: the handler's
// context is unchanged, Commit completes the claim with the record, and
// Rollback releases it. While the handler runs, an Extender's claim is
// extended (Middleware.beats) until it is settled or the handler returns.
type claimTx struct {
	m      *Middleware
	r      *http.Request // for events
	skey   string
	digest string
	token  string
	ttl    time.Duration
}

func (c *claimTx) NewContext(ctx context.Context) context.Context { return ctx }

func (c *claimTx) Commit(ctx context.Context, rec *store.Record, retention time.Duration) error {
	err := c.m.store.Complete(ctx, c.skey, c.token, rec, retention)
	if err == nil || isNotOwner(err) {
		// Kept, or not ours to keep: either way, no longer held. A failed
		// keep holds the claim until the handler returns (it is tried
		// again then), and is left to lapse after.
		c.done()
	}
	return err
}

func (c *claimTx) Rollback(ctx context.Context) error {
	c.done()
	return c.m.store.Release(ctx, c.skey, c.token)
}

func (c *claimTx) atomic() bool  { return false }
func (c *claimTx) claimed() bool { return true }

func (c *claimTx) done() {
	if c.m.ext != nil {
		c.m.beats.Drop(c)
	}
}

// openOwner is the owner of a request that WithFailOpen runs without a
// claim: the handler's context is unchanged, and nothing is kept or
// released.
type openOwner struct{}

func (*openOwner) NewContext(ctx context.Context) context.Context             { return ctx }
func (*openOwner) Commit(context.Context, *store.Record, time.Duration) error { return nil }
func (*openOwner) Rollback(context.Context) error                             { return nil }
func (*openOwner) atomic() bool                                               { return false }
func (*openOwner) claimed() bool                                              { return false }
func (*openOwner) done()                                                      {}

// keyless serves a covered request that carries no key, on a route where
// the key is optional: with no idempotency at all, but on a transactional
// store inside a transaction of its own, so that the handler's code is the
// same with a key and without one. Its writes commit before the response
// goes out (no record is kept), and roll back after a 5xx or a panic.
func (h *handler) keyless(w http.ResponseWriter, r *http.Request) {
	m := h.m
	if m.tx == nil {
		h.next.ServeHTTP(w, r)
		return
	}
	a := &attempt{h: h, w: w, r: r}
	ctx, cancel := m.budget(r.Context())
	a.start = time.Now()
	tx, err := m.tx.Begin(ctx)
	cancel()
	if err != nil {
		m.refuse(w, r, Event{Kind: EventStoreError, StoreLatency: time.Since(a.start), Err: err}, problemUnavailable, 1)
		return
	}
	a.tx = txOwner{Tx: tx}
	a.own = &a.tx
	a.run()
}

// claimFailed answers a claim that failed with err: 503, or, under
// WithFailOpen when the store cannot be reached at all, a run of the
// handler without a claim (openOwner). ev is the claim's event.
func (a *attempt) claimFailed(ev Event, err error) {
	m := a.h.m
	ev.Kind, ev.Err = EventStoreError, err
	if errors.Is(err, store.ErrFull) {
		// The store refused a new key rather than drop a kept one: nothing
		// landed, and nothing runs (not even fail-open: the store is up).
		ev.Kind = EventStoreFull
		a.refuse(ev, problemUnavailable, 1)
		return
	}
	// The claim may have landed before the failure; free it if so.
	m.releaseAbandoned(a.r, a.skey, a.claim.Token, a.digest)
	if m.cfg.failOpen && errors.Is(err, store.ErrUnreachable) &&
		a.r.Context().Err() == nil && !a.sawInFlight {
		// The store cannot be reached at all: run without idempotency, on
		// the body already read (New refuses WithFailOpen with a
		// transactional store). Any other error (a full pool, a timeout of
		// a reachable store whose first request may still run, a value the
		// store could not read that may be a kept response) still answers
		// 503; so does a failure under a caller that has gone (its retry
		// would run again), and one met while waiting on a first request
		// this one saw running.
		m.emit(a.r, ev)
		a.own = &a.open
		a.run()
		return
	}
	a.refuse(ev, problemUnavailable, 1)
}

// settle keeps or releases the response cw holds, once the handler has
// returned, or (streaming) before the response starts to go out while the
// handler runs. A status that is not kept is released when the handler
// has returned, and holds the key until then. A keep that fails on an
// atomic owner undid the handler's writes (or may have): the response must
// not go out, and the middleware answers 503 in its place; settle then
// reports false. Without a transaction a failed keep leaves the claim to
// lapse (while streaming, held and extended until the handler returns,
// when it is tried again) and the response goes out.
func (a *attempt) settle(cw *capture, streaming bool) bool {
	if a.ended {
		return true
	}
	if cw.hijacked || !a.h.m.cfg.keep(cw.status) {
		if !streaming {
			a.release(cw.status)
		}
		return true
	}
	if a.keep(cw.record(streaming)) || !a.own.atomic() {
		return true
	}
	// Nothing was sent yet.
	cw.replace()
	a.refuse(a.event(0), problemUnavailable, 1)
	return false
}

// streaming is called by the capture before a response starts to go out
// while the handler runs (it flushed, or wrote past the capture limit). A
// response whose status is kept is kept now, with the body omitted, so
// that no repeat finds the key free or in flight while it streams. It
// reports false when the response must not go out (see settle).
func (a *attempt) streaming(cw *capture) bool { return a.settle(cw, true) }

func isNotOwner(err error) bool { return errors.Is(err, store.ErrNotOwner) }
