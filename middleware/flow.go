package middleware

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/keyctx"
	"github.com/idemkey/idemkey/store"
)

// The flow of one request: read the key, the scope and the body; claim the
// key; then replay, refuse, or run the handler as the key's owner and keep
// or release what it answered. There is one path whatever the store: the
// key's owner is a store.Tx (owner.go), the handler's transaction or a
// plain store's claim seen as one.

// ServeHTTP runs the flow of one request.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := h.m
	if !m.cfg.covers(r.Method) {
		h.next.ServeHTTP(w, r)
		return
	}
	if h.invalid != nil {
		m.refuse(w, r, Event{Kind: EventRouteInvalid, Err: h.invalid}, problemRouteInvalid, 0)
		return
	}
	key, err := idemkey.ParseKey(r.Header[m.cfg.header])
	switch err {
	case nil:
	case idemkey.ErrKeyMissing:
		if h.route.Required {
			m.refuse(w, r, Event{Kind: EventKeyMissing}, problemKeyMissing, 0)
		} else {
			h.runKeyless(w, r)
		}
		return
	default:
		m.refuse(w, r, Event{Kind: EventKeyInvalid}, problemKeyInvalid, 0)
		return
	}

	sc, ok := m.scopeOf(w, r)
	if !ok {
		return
	}
	skey := store.KeyName(sc, key)
	digest := store.DigestOf(skey)

	buf := getBodyBuffer()
	defer putBodyBuffer(buf)
	body, err := m.readBody(w, r, buf)
	if err != nil {
		if errors.Is(err, errTooLarge) {
			m.refuse(w, r, Event{Kind: EventRequestTooLarge, KeyDigest: digest}, problemRequestTooLarge, 0)
		} else {
			m.refuse(w, r, Event{Kind: EventBodyUnreadable, KeyDigest: digest}, problemBodyUnreadable, 0)
		}
		return
	}
	if m.cache != nil {
		if rec, raw, hasRaw := m.cache.lookup(skey); rec != nil {
			m.cached(w, r, skey, rec, raw, hasRaw, body, Event{KeyDigest: digest})
			return
		}
	}

	token, id := newToken(m.needsNewRequestID(w, r))
	a := &attempt{h: h, w: w, r: r, body: body, skey: skey, digest: digest, id: id,
		key:   idemkey.Key{Scope: sc, Value: key},
		claim: store.Claim{Token: token, Fingerprint: m.cfg.fingerprint(r, body), TTL: h.route.Deadline + ClaimMargin},
	}
	a.decide(a.claimKey())
}

// runKeyless runs a covered request that carries no key, on a route where
// the key is optional: with no idempotency at all, but on a transactional
// store inside a transaction of its own, so that the handler's code is the
// same with a key and without one. Its writes commit before the response
// goes out (no record is kept), and roll back after a 5xx or a panic.
func (h *handler) runKeyless(w http.ResponseWriter, r *http.Request) {
	m := h.m
	if m.tx == nil {
		h.next.ServeHTTP(w, r)
		return
	}
	a := &attempt{h: h, w: w, r: r, keyless: true}
	ctx, cancel := m.budget(r.Context())
	a.start = time.Now()
	tx, err := m.tx.Begin(ctx)
	cancel()
	if err != nil {
		m.refuse(w, r, Event{Kind: EventStoreError, StoreLatency: time.Since(a.start), Err: err}, problemUnavailable, 1)
		return
	}
	a.own = a.ownTx(tx)
	a.run()
}

// attempt is one covered request with a valid key: one attempt at the
// operation the key names. It claims the key, and when it owns it, runs
// the handler and keeps or releases the response.
type attempt struct {
	h      *handler
	w      http.ResponseWriter
	r      *http.Request
	body   []byte
	skey   string
	digest string
	key    idemkey.Key
	claim  store.Claim
	id     string    // a new request id, made with the owner token, or ""
	start  time.Time // when the claim was made

	// keyless: a request without a key run in a transaction of its own
	// (runKeyless): nothing is claimed or kept, and only failures are
	// reported.
	keyless bool
	// While the attempt owns the key:
	own   owner
	plain claimTx // own, for a plain store
	tx    txOwner // own, for a transactional store
	ended bool    // the record was kept, or the claim released
	// sawInFlight: this request found its key running for its own request
	// (and waits on it): a store failure then never fails open.
	sawInFlight bool
}

type claimOutcome struct {
	res store.Result
	own owner
	err error
}

// claimKey makes one claim of the key, within the store's budget.
func (a *attempt) claimKey() claimOutcome {
	m := a.h.m
	ctx, cancel := m.budget(a.r.Context())
	defer cancel()
	a.start = time.Now()
	res, own, err := m.claim(ctx, a)
	return claimOutcome{res, own, err}
}

// event returns an event about this attempt's key.
func (a *attempt) event(kind EventKind) Event {
	return Event{Kind: kind, KeyDigest: a.digest}
}

// emit reports ev; of a keyless request, only failures.
func (a *attempt) emit(ev Event) {
	if a.keyless && ev.Kind != EventStoreError {
		return
	}
	a.h.m.emit(a.r, ev)
}

func (a *attempt) decide(o claimOutcome) {
	m := a.h.m
	ev := a.event(0)
	ev.StoreLatency = m.since(a.start)
	if o.err != nil {
		ev.Kind, ev.Err = EventStoreError, o.err
		if errors.Is(o.err, store.ErrFull) {
			// The store refused a new key rather than drop a kept one:
			// nothing landed, and nothing runs (not even fail-open: the
			// store is up).
			ev.Kind = EventStoreFull
			a.refuse(ev, problemUnavailable, 1)
			return
		}
		// The claim may have landed before the failure; free it if so.
		m.releaseAbandoned(a.r, a.skey, a.claim.Token, a.digest)
		if m.cfg.failOpen && errors.Is(o.err, store.ErrUnreachable) &&
			a.r.Context().Err() == nil && !a.sawInFlight {
			// The store cannot be reached at all: run without idempotency,
			// on the body already read. Any other error (a full pool, a
			// timeout of a reachable store whose first request may still
			// run, a value the store could not read that may be a kept
			// response) still answers 503; so does
			// a failure under a caller that has gone (its retry would run
			// again), and one met while waiting on a first request this
			// one saw running.
			m.emit(a.r, ev)
			a.runOpen()
			return
		}
		a.refuse(ev, problemUnavailable, 1)
		return
	}
	res := o.res
	switch res.State {
	case store.Claimed, store.Mine:
		if o.own == nil {
			ev.Kind, ev.Err = EventStoreError, errors.New("idemkey: middleware: transactional store claimed without a transaction")
			m.releaseAbandoned(a.r, a.skey, a.claim.Token, a.digest)
			a.refuse(ev, problemUnavailable, 1)
			return
		}
		a.own = o.own
		ev.Kind = EventFirstAttempt
		m.emit(a.r, ev)
		a.run()
	case store.Completed:
		if res.Record == nil {
			ev.Kind, ev.Err = EventStoreError, errors.New("idemkey: middleware: store answered completed without a record")
			a.refuse(ev, problemUnavailable, 1)
			return
		}
		if m.cache != nil {
			m.cache.put(a.skey, res.Record, m.cfg.retention)
		}
		m.completed(a.w, a.r, res.Record, a.claim.Fingerprint, ev, a.id)
	case store.InFlight:
		if res.Fingerprint != a.claim.Fingerprint {
			ev.Kind = EventKeyReused
			a.refuse(ev, problemKeyReused, 0)
			return
		}
		if m.cfg.wait > 0 {
			a.sawInFlight = true
			if o, ok := a.wait(); ok {
				a.decide(o)
				return
			}
		}
		ev.Kind = EventInFlight
		a.refuse(ev, problemConflict, a.h.retryAfter(res, time.Now()))
	default:
		ev.Kind, ev.Err = EventStoreError, errors.New("idemkey: middleware: store answered an unknown claim state")
		a.refuse(ev, problemUnavailable, 1)
	}
}

// wait waits until the key is no longer in flight for this request's
// fingerprint or the wait budget is spent: woken by the store when it is
// a store.Waiter, else polling it every 10 to 250 ms. It reports false
// when the budget ran out with the key still in flight.
func (a *attempt) wait() (claimOutcome, bool) {
	deadline := time.Now().Add(a.h.m.cfg.wait)
	pause := 10 * time.Millisecond
	for {
		left := time.Until(deadline)
		if left <= 0 || !a.pause(left, pause) {
			return claimOutcome{}, false
		}
		pause = min(2*pause, 250*time.Millisecond)
		o := a.claimKey()
		if o.err != nil || o.res.State != store.InFlight || o.res.Fingerprint != a.claim.Fingerprint {
			// Decided: including a key now held for a different request,
			// which is 422 however long one waits.
			return o, true
		}
	}
}

// pause waits, at most left, for the key's first request to end: on the
// store when it can wait on it, else for pause. It reports false when the
// request's context ended.
func (a *attempt) pause(left, pause time.Duration) bool {
	m := a.h.m
	if m.waiter != nil {
		ctx, cancel := context.WithTimeout(a.r.Context(), left)
		waited, err := m.waiter.Wait(ctx, a.skey, a.claim)
		cancel()
		if a.r.Context().Err() != nil {
			return false
		}
		if waited || err != nil {
			// Woken (or the store failed: the claim that follows says
			// how it stands).
			return true
		}
	}
	t := time.NewTimer(min(pause, left))
	defer t.Stop()
	select {
	case <-a.r.Context().Done():
		return false
	case <-t.C:
		return true
	}
}

// run runs the handler as the key's owner, then keeps or releases.
func (a *attempt) run() {
	m := a.h.m
	// Once the handler has returned, the claim is kept, released, or
	// (when keeping failed) left to lapse: never held any longer.
	defer a.own.done()

	cw, w := newCapture(a.w, m.cfg.maxResponseBody, m.cfg.keepHeader, a)
	ctx, cancel := a.handlerContext()
	defer cancel()
	r := a.r
	if !a.keyless {
		m.setRequestID(a.w, a.r, &cw.request, a.id)
		ctx = &keyContext{Context: ctx, key: a.key}
		cw.in.Reset(a.body)
		r = r.WithContext(a.own.NewContext(ctx))
		r.Body, r.GetBody = &cw.in, nil
	} else {
		r = r.WithContext(a.own.NewContext(ctx))
	}

	returned := false
	defer func() {
		// The body's buffer goes back to the pool when ServeHTTP returns:
		// a read after the handler returned (which net/http forbids) finds
		// EOF, never another request's body.
		cw.in.Reset(nil)
		if !returned && !a.ended {
			// A panic (http.ErrAbortHandler included) or runtime.Goexit:
			// free the key so a retry runs again, and let the panic go on.
			a.release(0)
		}
	}()
	a.h.next.ServeHTTP(w, r)
	returned = true
	if !a.keyless {
		a.h.runs.add(time.Since(a.start))
	}

	if cw.status == 0 && !cw.hijacked {
		cw.WriteHeader(http.StatusOK)
	}
	if !a.ended {
		if cw.hijacked || !m.cfg.keep(cw.status) {
			a.release(cw.status)
		} else if !a.keep(cw.record(false)) && a.own.atomic() {
			// The transaction did not commit: the response must not go
			// out. Nothing was sent yet.
			cw.replace()
			a.refuse(a.event(0), problemUnavailable, 1)
		}
	}
	cw.finish()
}

// handlerContext returns the context the handler runs under: the
// request's, bounded by the route's deadline from the claim. A request
// whose context already ends by then keeps its own (with its own, earlier
// deadline), which spares a child context and its place among the
// parent's children; it is then cancelled when net/http cancels the
// request's, once the middleware has returned, not the moment the handler
// does.
func (a *attempt) handlerContext() (context.Context, context.CancelFunc) {
	ctx := a.r.Context()
	deadline := a.start.Add(a.h.route.Deadline)
	if d, ok := ctx.Deadline(); ok && !d.After(deadline) {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, deadline)
}

// keyContext is the context that carries the request's key to the handler
// (idemkey.FromContext), as idemkey.NewContext does, in one allocation
// instead of two: the key is kept in it and handed out by pointer, where
// context.WithValue would box a copy. It holds nothing else of the
// request, so that a context a handler hands on to work that outlives the
// request keeps no more alive than before. Everything else it asks of its
// parent.
type keyContext struct {
	context.Context
	key idemkey.Key
}

func (c *keyContext) Value(k any) any {
	if k == (keyctx.Key{}) {
		return &c.key
	}
	return c.Context.Value(k)
}

// streaming is called by the capture before a response starts to go out
// while the handler runs (it flushed, or wrote past the capture limit). A
// response whose status is kept is kept now, with the body omitted, so
// that no repeat finds the key free or in flight while it streams. It
// reports false when the response must not go out: the transaction of a
// transactional route did not commit, and the middleware has answered 503
// in its place.
func (a *attempt) streaming(cw *capture) bool {
	if cw.hijacked || a.ended || !a.h.m.cfg.keep(cw.status) {
		// Not kept (a 5xx): the claim is held until the handler returns,
		// and then released.
		return true
	}
	if a.keep(cw.record(true)) || !a.own.atomic() {
		// Without a transaction, a failed keep leaves the claim held (and
		// extended) until the handler returns, when it is tried again.
		return true
	}
	cw.replace()
	a.refuse(a.event(0), problemUnavailable, 1)
	return false
}

// keep keeps rec as the key's record, and reports whether it was kept.
func (a *attempt) keep(rec *store.Record) bool {
	m := a.h.m
	rec.Fingerprint = a.claim.Fingerprint
	ctx, cancel := m.detached(a.r)
	defer cancel()
	t := time.Now()
	rec.CreatedAt, rec.CompletedAt = a.start, t
	err := a.own.Commit(ctx, rec, m.cfg.retention)
	if err == nil || isNotOwner(err) || a.own.atomic() {
		// Kept, not ours to keep, or (in a transaction) over either way.
		a.ended = true
	}
	ev := a.event(EventKept)
	ev.Status, ev.StoreLatency = rec.Status, m.since(t)
	switch {
	case err == nil:
		if m.cache != nil && !a.keyless {
			m.cache.put(a.skey, rec, m.cfg.retention)
		}
		if m.observed() {
			ev.Size = recordSize(rec)
		}
	case isNotOwner(err):
		ev.Kind, ev.Err = EventOwnershipLost, err
	default:
		ev.Kind, ev.Err = EventStoreError, err
	}
	a.emit(ev)
	return err == nil
}

// release frees the key (rolls the transaction back) so that a retry runs
// again.
func (a *attempt) release(status int) {
	m := a.h.m
	ctx, cancel := m.detached(a.r)
	defer cancel()
	t := time.Now()
	err := a.own.Rollback(ctx)
	a.ended = true
	ev := a.event(EventReleased)
	ev.Status, ev.StoreLatency = status, m.since(t)
	switch {
	case isNotOwner(err):
		ev.Kind, ev.Err = EventOwnershipLost, err
	case err != nil:
		ev.Kind, ev.Err = EventStoreError, err
	}
	a.emit(ev)
}

func isNotOwner(err error) bool { return errors.Is(err, store.ErrNotOwner) }

// runOpen runs the handler without idempotency, for WithFailOpen, on the
// body already read.
func (a *attempt) runOpen() {
	r := new(http.Request)
	*r = *a.r
	in := new(bodyReader)
	in.Reset(a.body)
	// As in run: the body's buffer goes back to the pool when ServeHTTP
	// returns, so a late read finds EOF.
	defer in.Reset(nil)
	r.Body, r.GetBody = in, nil
	a.h.next.ServeHTTP(a.w, r)
}

// detached returns a context for keeping or releasing: it keeps r's values
// but not its cancellation, so a client that hangs up does not stop the
// record from being kept. The store's own budget bounds the call.
func (m *Middleware) detached(r *http.Request) (context.Context, context.CancelFunc) {
	return m.budget(context.WithoutCancel(r.Context()))
}

// budget adds WithStoreTimeout's bound to ctx, when one was set.
func (m *Middleware) budget(ctx context.Context) (context.Context, context.CancelFunc) {
	if m.cfg.storeTimeout > 0 {
		return context.WithTimeout(ctx, m.cfg.storeTimeout)
	}
	return ctx, func() {}
}

// releaseAbandoned frees, in the background, a claim whose reply was lost
// to a store failure, in case it landed. The handler never ran, so freeing
// it is always safe. At most maxAbandoned run at once: during an outage
// the rest are left to lapse at the end of their life. A failure other
// than the store still being down is reported, from the releasing
// goroutine.
func (m *Middleware) releaseAbandoned(r *http.Request, skey, token, digest string) {
	select {
	case m.abandoned <- struct{}{}:
	default:
		return
	}
	ctx := context.WithoutCancel(r.Context())
	go func() {
		defer func() { <-m.abandoned }()
		ctx, cancel := m.budget(ctx)
		defer cancel()
		t := time.Now()
		err := m.store.Release(ctx, skey, token)
		if err != nil && !errors.Is(err, store.ErrUnavailable) && !isNotOwner(err) {
			m.emit(r, Event{Kind: EventStoreError, KeyDigest: digest, StoreLatency: time.Since(t), Err: err})
		}
	}()
}

// refuse writes one of the middleware's problems and reports ev (when its
// Kind is set), with the problem's status.
func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, ev Event, p idemkey.Problem, retryAfter int) {
	m.refuseWithID(w, r, ev, p, retryAfter, "")
}

// refuse is Middleware.refuse for the attempt's request, whose new request
// id (when it needs one) was made with its owner token.
func (a *attempt) refuse(ev Event, p idemkey.Problem, retryAfter int) {
	a.h.m.refuseWithID(a.w, a.r, ev, p, retryAfter, a.id)
}

// refuseWithID is refuse, with fresh as for requestID.
func (m *Middleware) refuseWithID(w http.ResponseWriter, r *http.Request, ev Event, p idemkey.Problem, retryAfter int, fresh string) {
	p.RetryAfter = retryAfter
	if ev.Kind != 0 {
		if ev.Status == 0 {
			ev.Status = p.Status
		}
		m.emit(r, ev)
	}
	m.setRequestID(w, r, nil, fresh)
	m.cfg.errorWriter(w, r, p)
}
