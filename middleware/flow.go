package middleware

import (
	"bytes"
	"errors"
	"net/http"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/rawdigest"
	"github.com/idemkey/idemkey/internal/storecall"
	"github.com/idemkey/idemkey/store"
)

// The flow of one request: read the key, the scope and the body; claim the
// key; then replay, refuse, or run the handler as the key's owner and keep
// or release what it answered. There is one path whatever the store and
// the options: the key's owner (owner.go) is a store.Tx, the handler's
// transaction or a plain store's claim seen as one, and it decides what
// differs between them (a keyless request, a fail-open run, what a failed
// keep means). Refusals are in refuse.go, events in event.go, the store's
// budgets in budget.go, the bounded wait in wait.go.

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
			h.keyless(w, r)
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
	// The key's name in the store, its owner token and the request id
	// (when the middleware makes one) in one string.
	skey, token, id := names(sc, key, m.needsNewRequestID(w, r))
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
			m.cached(w, r, skey, rec, raw, hasRaw, body, Event{KeyDigest: digest}, id)
			return
		}
	}

	a := &attempt{h: h, w: w, r: r, body: body, skey: skey, digest: digest, id: id,
		key:   idemkey.Key{Scope: sc, Value: key},
		claim: store.Claim{Token: token, TTL: h.route.Deadline + ClaimMargin},
	}
	if m.cfg.defaultFingerprint {
		// The raw digest now, the canonical fingerprint when it is first
		// needed (see the package documentation).
		a.raw, a.hasRaw = rawdigest.Of(r, body), true
	} else {
		a.Fingerprint()
	}
	a.decide(a.claimKey())
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
	// raw is the request's raw digest (internal/rawdigest), when hasRaw:
	// with the default fingerprint. printed: claim.Fingerprint is
	// computed (Fingerprint).
	raw             [32]byte
	hasRaw, printed bool
	// values holds a replay's header values (the kept ones and the four
	// the replay may add), when they fit.
	values [8]string

	// While the attempt owns the key (owner.go):
	own   owner
	plain claimTx   // own, for a plain store's claim
	tx    txOwner   // own, for a transactional store's transaction
	open  openOwner // own, for a run without a claim (WithFailOpen)
	ended bool      // the record was kept, or the claim released
	// sawInFlight: this request found its key running for its own request
	// (and waits on it): a store failure then never fails open.
	sawInFlight bool
	// unbound is the context of the keep or release (detached).
	unbound storecall.Unbound
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

// Fingerprint returns the request's fingerprint (the claim's), computing
// it the first time: a store.Fingerprinter, for a store.LazyClaimer.
func (a *attempt) Fingerprint() [32]byte {
	if !a.printed {
		a.claim.Fingerprint, a.printed = a.h.m.cfg.fingerprint(a.r, a.body), true
	}
	return a.claim.Fingerprint
}

// same reports whether rec was kept for this request: by the raw digest
// when both have one and they are equal, else by the fingerprint.
func (a *attempt) same(rec *store.Record) bool {
	if a.hasRaw && rec.RawDigest == a.raw && a.raw != ([32]byte{}) {
		return true
	}
	return rec.Fingerprint == a.Fingerprint()
}

func (a *attempt) decide(o claimOutcome) {
	m := a.h.m
	ev := a.event(0)
	ev.StoreLatency = m.since(a.start)
	if o.err != nil {
		a.claimFailed(ev, o.err)
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
			m.cache.put(a.skey, res.Record, m.cfg.Retention)
		}
		m.completed(a.w, a.r, res.Record, a.same(res.Record), ev, a.id, a.values[:])
	case store.InFlight:
		if res.Fingerprint != a.Fingerprint() {
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

// run runs the handler as the key's owner, then keeps or releases.
func (a *attempt) run() {
	m := a.h.m
	// Once the handler has returned, the claim is kept, released, or
	// (when keeping failed) left to lapse: never held any longer.
	defer a.own.done()

	cw, w := newCapture(a.w, m.cfg.maxResponseBody, m.cfg.keepHeader, a)
	ctx, hc := a.newHandlerCtx()
	defer hc.end()
	r := a.r
	if a.skey != "" {
		// A request with a key: its response carries its request id, the
		// handler finds the key in its context (newHandlerCtx), and reads
		// the body already read from memory.
		m.setRequestID(a.w, a.r, &cw.request, a.id)
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
	if a.own.claimed() {
		a.h.runs.Add(time.Since(a.start))
	}
	if cw.status == 0 && !cw.hijacked {
		cw.WriteHeader(http.StatusOK)
	}
	a.settle(cw, false)
	cw.finish()
}

// keep keeps rec as the key's record, and reports whether it was kept.
func (a *attempt) keep(rec *store.Record) bool {
	m := a.h.m
	if a.skey != "" {
		rec.Fingerprint, rec.RawDigest = a.Fingerprint(), a.raw
	}
	ctx, cancel := a.detached()
	defer cancel()
	t := time.Now()
	rec.CreatedAt, rec.CompletedAt = a.start, t
	err := a.own.Commit(ctx, rec, m.cfg.Retention)
	if err == nil || isNotOwner(err) || a.own.atomic() {
		// Kept, not ours to keep, or (in a transaction) over either way.
		a.ended = true
	}
	ev := a.event(EventKept)
	ev.Status, ev.StoreLatency = rec.Status, m.since(t)
	switch {
	case err == nil:
		if m.cache != nil && a.own.claimed() {
			// A copy, whose body and header values are its own: the
			// record's are held in the capture, which the cache must not
			// keep alive.
			kept := *rec
			kept.Body, kept.Header = bytes.Clone(rec.Body), rec.Header.Clone()
			m.cache.put(a.skey, &kept, m.cfg.Retention)
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
	ctx, cancel := a.detached()
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
