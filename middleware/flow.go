package middleware

import (
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/scope"
	"github.com/idemkey/idemkey/store"
)

// The flow of one request: read the key, the scope and the body; claim the
// key; then replay, refuse, or run the handler as the key's owner and keep
// or release what it answered.

// ServeHTTP runs the flow of one request.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := h.m
	if !m.cfg.covers(r.Method) {
		h.next.ServeHTTP(w, r)
		return
	}
	key, err := idemkey.ParseKey(r.Header[m.cfg.header])
	switch err {
	case nil:
	case idemkey.ErrKeyMissing:
		if !h.route.Required {
			h.next.ServeHTTP(w, r)
			return
		}
		m.refuse(w, r, Event{Kind: EventKeyMissing}, CodeKeyMissing, 0)
		return
	default:
		m.refuse(w, r, Event{Kind: EventKeyInvalid}, CodeKeyInvalid, 0)
		return
	}

	sc := m.cfg.scope(r)
	if sc == "" {
		sc = scope.Anonymous
	}
	skey := store.KeyName(sc, key)
	digest := store.DigestOf(skey)

	buf := getBodyBuffer()
	defer putBodyBuffer(buf)
	body, err := m.readBody(w, r, buf)
	if err != nil {
		if errors.Is(err, errTooLarge) {
			m.refuse(w, r, Event{Kind: EventRequestTooLarge, KeyDigest: digest}, CodeRequestTooLarge, 0)
		} else {
			m.refuse(w, r, Event{Kind: EventBodyUnreadable, KeyDigest: digest}, CodeBodyUnreadable, 0)
		}
		return
	}
	if m.cache != nil {
		if rec, raw, hasRaw := m.cache.lookup(skey); rec != nil {
			m.cached(w, r, skey, rec, raw, hasRaw, body, Event{KeyDigest: digest})
			return
		}
	}

	a := &attempt{h: h, w: w, r: r, body: body, skey: skey, digest: digest,
		key:   idemkey.Key{Scope: sc, Value: key},
		claim: store.Claim{Token: rand.Text(), Fingerprint: m.cfg.fingerprint(r, body), TTL: h.route.Deadline + ClaimMargin},
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
	start  time.Time // when the claim was made

	// While the attempt owns the key:
	tx    store.Tx // the handler's transaction, with a store.TxStore
	held  bool     // the claim is kept alive while the handler runs (Middleware.beats)
	ended bool     // the record was kept, or the claim released
	// sawInFlight: this request found its key running for its own request
	// (and waits on it): a store failure then never fails open.
	sawInFlight bool
}

type claimOutcome struct {
	res store.Result
	tx  store.Tx
	err error
}

// claimKey makes one claim of the key: in a transaction when the store runs
// handlers in one.
func (a *attempt) claimKey() claimOutcome {
	m := a.h.m
	ctx, cancel := m.budget(a.r.Context())
	defer cancel()
	a.start = time.Now()
	if m.tx != nil {
		res, tx, err := m.tx.ClaimTx(ctx, a.skey, a.claim)
		return claimOutcome{res, tx, err}
	}
	res, err := m.store.Claim(ctx, a.skey, a.claim)
	return claimOutcome{res: res, err: err}
}

// event returns an event about this attempt's key.
func (a *attempt) event(kind EventKind) Event {
	return Event{Kind: kind, KeyDigest: a.digest}
}

func (a *attempt) decide(o claimOutcome) {
	m := a.h.m
	ev := a.event(0)
	ev.StoreLatency = time.Since(a.start)
	if o.err != nil {
		ev.Kind, ev.Err = EventStoreError, o.err
		if errors.Is(o.err, store.ErrFull) {
			// The store refused a new key rather than drop a kept one:
			// nothing landed, and nothing runs (not even fail-open: the
			// store is up).
			ev.Kind = EventStoreFull
			m.refuse(a.w, a.r, ev, CodeUnavailable, 1)
			return
		}
		// The claim may have landed before the failure; free it if so.
		m.releaseAbandoned(a.r, a.skey, a.claim.Token, a.digest)
		if m.cfg.failOpen && errors.Is(o.err, store.ErrUnavailable) &&
			a.r.Context().Err() == nil && !a.sawInFlight {
			// The store is out of reach: run without idempotency, on the
			// body already read. Any other error (a value the store could
			// not read may be a kept response) still answers 503; so does
			// a failure under a caller that has gone (its retry would run
			// again), and one met while waiting on a first request this
			// one saw running.
			m.emit(a.r, ev)
			a.runOpen()
			return
		}
		m.refuse(a.w, a.r, ev, CodeUnavailable, 1)
		return
	}
	res := o.res
	switch res.State {
	case store.Claimed, store.Mine:
		if m.tx != nil && o.tx == nil {
			ev.Kind, ev.Err = EventStoreError, errors.New("idemkey: middleware: transactional store claimed without a transaction")
			m.releaseAbandoned(a.r, a.skey, a.claim.Token, a.digest)
			m.refuse(a.w, a.r, ev, CodeUnavailable, 1)
			return
		}
		a.tx = o.tx
		a.run()
	case store.Completed:
		if res.Record == nil {
			ev.Kind, ev.Err = EventStoreError, errors.New("idemkey: middleware: store answered completed without a record")
			m.refuse(a.w, a.r, ev, CodeUnavailable, 1)
			return
		}
		if m.cache != nil {
			m.cache.put(a.skey, res.Record, m.cfg.retention)
		}
		m.completed(a.w, a.r, res.Record, a.claim.Fingerprint, ev)
	case store.InFlight:
		if res.Fingerprint != a.claim.Fingerprint {
			ev.Kind = EventKeyReused
			m.refuse(a.w, a.r, ev, CodeKeyReused, 0)
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
		m.refuse(a.w, a.r, ev, CodeConflict, a.h.retryAfter(res, time.Now()))
	default:
		ev.Kind, ev.Err = EventStoreError, errors.New("idemkey: middleware: store answered an unknown claim state")
		m.refuse(a.w, a.r, ev, CodeUnavailable, 1)
	}
}

// wait polls the store until the key is no longer in flight for this
// request's fingerprint or the wait budget is spent. It reports false when
// the budget ran out with the key still in flight.
func (a *attempt) wait() (claimOutcome, bool) {
	deadline := time.Now().Add(a.h.m.cfg.wait)
	pause := 10 * time.Millisecond
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return claimOutcome{}, false
		}
		t := time.NewTimer(min(pause, left))
		select {
		case <-a.r.Context().Done():
			t.Stop()
			return claimOutcome{}, false
		case <-t.C:
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

// run runs the handler as the key's owner, then keeps or releases.
func (a *attempt) run() {
	m := a.h.m
	ev := a.event(EventFirstAttempt)
	ev.StoreLatency = time.Since(a.start)
	m.emit(a.r, ev)
	if m.ext != nil && a.tx == nil {
		a.held = true
		m.beats.hold(m, a)
		// Once the handler has returned, the claim is kept, released, or
		// (when keeping failed) left to lapse: never held any longer.
		defer a.end()
	}

	cw, w := newCapture(a.w, m.cfg.maxResponseBody, m.cfg.keepHeader, a)
	m.setRequestID(a.w, a.r, &cw.request)
	ctx, cancel := context.WithDeadline(a.r.Context(), a.start.Add(a.h.route.Deadline))
	defer cancel()
	ctx = idemkey.NewContext(ctx, a.key)
	if a.tx != nil {
		ctx = a.tx.NewContext(ctx)
	}
	cw.in.Reset(a.body)
	r := a.r.WithContext(ctx)
	r.Body, r.GetBody = &cw.in, nil

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
	a.h.runs.add(time.Since(a.start))

	if cw.status == 0 && !cw.hijacked {
		cw.WriteHeader(http.StatusOK)
	}
	if !a.ended {
		if cw.hijacked || !m.cfg.keep(cw.status) {
			a.release(cw.status)
		} else if !a.keep(cw.record(false)) && a.tx != nil {
			// The transaction did not commit: the response must not go
			// out. Nothing was sent yet.
			cw.replace()
			m.refuse(a.w, a.r, a.event(0), CodeUnavailable, 1)
		}
	}
	cw.finish()
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
	if a.keep(cw.record(true)) || a.tx == nil {
		// Without a transaction, a failed keep leaves the claim held (and
		// extended) until the handler returns, when it is tried again.
		return true
	}
	cw.replace()
	a.h.m.refuse(a.w, a.r, a.event(0), CodeUnavailable, 1)
	return false
}

// keep keeps rec as the key's record, and reports whether it was kept: by
// committing the handler's transaction, or by completing the claim.
func (a *attempt) keep(rec *store.Record) bool {
	m := a.h.m
	rec.Fingerprint = a.claim.Fingerprint
	rec.CreatedAt, rec.CompletedAt = a.start, time.Now()
	ctx, cancel := m.detached(a.r)
	defer cancel()
	t := time.Now()
	var err error
	if a.tx != nil {
		err = a.tx.Commit(ctx, rec, m.cfg.retention)
		a.ended = true // committed or not, the transaction is over
	} else {
		err = m.store.Complete(ctx, a.skey, a.claim.Token, rec, m.cfg.retention)
	}
	ev := a.event(EventKept)
	ev.Status, ev.StoreLatency = rec.Status, time.Since(t)
	switch {
	case err == nil:
		a.end()
		if m.cache != nil {
			m.cache.put(a.skey, rec, m.cfg.retention)
		}
		ev.Size = recordSize(rec)
	case errors.Is(err, store.ErrNotOwner):
		ev.Kind, ev.Err = EventOwnershipLost, err
		a.end()
	default:
		ev.Kind, ev.Err = EventStoreError, err
	}
	m.emit(a.r, ev)
	return err == nil
}

// release frees the key (rolls the transaction back) so that a retry runs
// again.
func (a *attempt) release(status int) {
	m := a.h.m
	ctx, cancel := m.detached(a.r)
	defer cancel()
	t := time.Now()
	var err error
	if a.tx != nil {
		err = a.tx.Rollback(ctx)
	} else {
		err = m.store.Release(ctx, a.skey, a.claim.Token)
	}
	a.end()
	ev := a.event(EventReleased)
	ev.Status, ev.StoreLatency = status, time.Since(t)
	switch {
	case errors.Is(err, store.ErrNotOwner):
		ev.Kind, ev.Err = EventOwnershipLost, err
	case err != nil:
		ev.Kind, ev.Err = EventStoreError, err
	}
	m.emit(a.r, ev)
}

// end marks the claim as settled (kept or released) and stops holding it.
func (a *attempt) end() {
	a.ended = true
	if a.held {
		a.held = false
		a.h.m.beats.drop(a)
	}
}

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
// than the store still being down is reported.
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
		if err != nil && !errors.Is(err, store.ErrUnavailable) && !errors.Is(err, store.ErrNotOwner) {
			m.emit(r, Event{Kind: EventStoreError, KeyDigest: digest, StoreLatency: time.Since(t), Err: err})
		}
	}()
}

// beats holds the claims a Middleware keeps alive while their handlers run:
// each is extended every third of its life, by a scan every beatScan that
// runs on one timer while any claim is held, and not at all otherwise.
// Holding a claim costs a map insert, not a timer or a goroutine.
type beats struct {
	mu      sync.Mutex
	due     map[*attempt]time.Time // when each claim's next extension is due
	scan    *time.Timer            // made on first use; armed while due is not empty
	running bool
}

// beatScan is how often due extensions are looked for. A claim lives at
// least ClaimMargin (5 s), so a third of it plus beatScan still falls well
// inside its life.
const beatScan = time.Second

// hold starts keeping a's claim alive.
func (b *beats) hold(m *Middleware, a *attempt) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.due == nil {
		b.due = make(map[*attempt]time.Time)
	}
	b.due[a] = a.start.Add(a.claim.TTL / 3)
	switch {
	case b.running:
	case b.scan == nil:
		b.scan = time.AfterFunc(beatScan, func() { b.run(m) })
		b.running = true
	default:
		b.scan.Reset(beatScan)
		b.running = true
	}
}

// drop stops keeping a's claim alive: it was kept, released, or (when
// keeping failed) is left to lapse. An extension under way is ignored.
func (b *beats) drop(a *attempt) {
	b.mu.Lock()
	delete(b.due, a)
	if len(b.due) == 0 && b.running {
		b.running = false
		b.scan.Stop()
	}
	b.mu.Unlock()
}

// run extends the claims that are due, and arms the next scan.
func (b *beats) run(m *Middleware) {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.running {
		return // stopped as it fired
	}
	for a, due := range b.due {
		if now.Before(due) {
			continue
		}
		// Not due again until this extension has answered.
		b.due[a] = now.Add(a.claim.TTL)
		go b.extend(m, a)
	}
	b.scan.Reset(beatScan)
}

// extend lengthens a's claim to its whole life again. Its events are
// reported from the scanner's goroutines.
func (b *beats) extend(m *Middleware, a *attempt) {
	ctx, cancel := m.detached(a.r)
	t := time.Now()
	err := m.ext.Extend(ctx, a.skey, a.claim.Token, a.claim.TTL)
	cancel()
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.due[a]; !ok {
		// The claim was settled meanwhile: whatever Extend found says
		// nothing about the key.
		return
	}
	switch {
	case errors.Is(err, store.ErrNotOwner):
		delete(b.due, a)
		ev := a.event(EventOwnershipLost)
		ev.StoreLatency, ev.Err = time.Since(t), err
		m.emit(a.r, ev)
	case err != nil:
		// Try again soon: the claim has a third of its life left at least.
		b.due[a] = time.Now()
		ev := a.event(EventStoreError)
		ev.StoreLatency, ev.Err = time.Since(t), err
		m.emit(a.r, ev)
	default:
		b.due[a] = time.Now().Add(a.claim.TTL / 3)
	}
}

// refuse writes one of the middleware's problems and reports ev (when its
// Kind is set), with the problem's status.
func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, ev Event, code string, retryAfter int) {
	p := problems[code]
	p.RetryAfter = retryAfter
	if ev.Kind != 0 {
		if ev.Status == 0 {
			ev.Status = p.Status
		}
		m.emit(r, ev)
	}
	m.setRequestID(w, r, nil)
	m.cfg.errorWriter(w, r, p)
}

func (m *Middleware) emit(r *http.Request, e Event) {
	if len(m.cfg.observers) == 0 {
		return
	}
	e.Route = r.Pattern
	if e.Route == "" && m.cfg.routeName != nil {
		e.Route = m.cfg.routeName(r)
	}
	for _, o := range m.cfg.observers {
		o(r, e)
	}
}
