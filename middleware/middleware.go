// Package middleware makes retried HTTP mutations safe: a request that
// carries an Idempotency-Key runs its handler once, and every repeat gets the
// first answer.
//
// For each covered request (POST, PUT, PATCH, DELETE by default) it reads
// the key, finds the caller's scope, reads and fingerprints the body, and
// claims the key in the store in one call. Then:
//
//   - claimed: the handler runs with a deadline; its response is kept (2xx,
//     3xx, 4xx) and then sent, or the key is released (5xx, panic) so a
//     retry runs again;
//   - completed with the same fingerprint: the kept response is replayed
//     with Idempotent-Replayed: true, under the repeat's own X-Request-Id;
//   - in flight with the same fingerprint: 409 conflict with Retry-After;
//   - held for a different request: 422 idempotency_key_reused;
//   - the store failed: 503 unavailable with Retry-After, and the handler
//     does not run.
//
// Errors the middleware writes itself are RFC 9457 problem+json with a
// machine-readable code; see Problems.
//
// # Ordering
//
// Put the middleware after authentication (the scope needs the caller's
// identity), after request-size limits, inside compression and CORS (so
// that it keeps and replays the uncompressed response, and preflights never
// reach it), and inside any timeout wrapper: an http.TimeoutHandler outside
// it answers 503 while the handler still runs, and the record is kept all
// the same. Use the route deadline (Deadline) instead of a timeout wrapper
// inside it.
//
// # Windows
//
// A response that is streamed (the handler flushes, or writes more than the
// capture limit) goes out before it is kept: a retry that arrives in between
// gets 409. If the store fails while the response is being kept, the client
// still gets the response, the failure is reported as EventStoreError, and
// the claim is left to lapse: a repeat within the claim's life (the route's
// deadline plus ClaimMargin) gets 409, and after it the handler can run
// again.
package middleware

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/scope"
	"github.com/idemkey/idemkey/store"
)

// Middleware is the idempotency layer. Build it once with New and use
// Handler, Required or Optional per route; it is safe for concurrent use.
type Middleware struct {
	store store.Store
	cfg   *config
	cache *replayCache // nil unless WithLocalCache
}

// New returns a Middleware that keeps its claims and records in st.
// Options are applied in order; an invalid option value is an error.
func New(st store.Store, opts ...Option) (*Middleware, error) {
	if st == nil {
		return nil, errors.New("idemkey: middleware: nil store")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	m := &Middleware{store: st, cfg: cfg}
	if cfg.cacheSize > 0 {
		m.cache = newReplayCache(cfg.cacheSize, cfg.cacheTTL)
	}
	return m, nil
}

// Route is the idempotency configuration of one route.
type Route struct {
	// Required: a covered request without a key gets 400
	// idempotency_key_missing. Otherwise it runs without idempotency.
	Required bool
	// Deadline bounds the handler's context; the claim lives Deadline plus
	// ClaimMargin.
	Deadline time.Duration
}

// A RouteOption configures one route.
type RouteOption func(*Route)

// Deadline sets the route's deadline. It panics if d is not positive.
func Deadline(d time.Duration) RouteOption {
	if d <= 0 {
		panic("idemkey: middleware: route deadline must be positive")
	}
	return func(r *Route) { r.Deadline = d }
}

// Handler wraps next with the default route: key optional, the deadline
// from WithDeadline. It has the shape chi's Use and plain nesting expect.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return m.route(false, nil)(next)
}

// Required returns middleware for routes that require a key, for chi's With
// or plain nesting: m.Required()(handler).
func (m *Middleware) Required(opts ...RouteOption) func(http.Handler) http.Handler {
	return m.route(true, opts)
}

// Optional returns middleware for routes where a key is optional: a
// request without one runs the handler with no idempotency at all.
func (m *Middleware) Optional(opts ...RouteOption) func(http.Handler) http.Handler {
	return m.route(false, opts)
}

func (m *Middleware) route(required bool, opts []RouteOption) func(http.Handler) http.Handler {
	rt := Route{Required: required, Deadline: m.cfg.deadline}
	for _, o := range opts {
		o(&rt)
	}
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic("idemkey: middleware: nil handler")
		}
		return &handler{m: m, route: rt, next: next}
	}
}

// RouteOf returns the idempotency configuration of a handler made by
// Handler, Required or Optional, and whether h is one; for documentation
// such as OpenAPI output.
func RouteOf(h http.Handler) (Route, bool) {
	if h, ok := h.(*handler); ok {
		return h.route, true
	}
	return Route{}, false
}

// Covers reports whether requests with method are covered.
func (m *Middleware) Covers(method string) bool { return m.cfg.methods[method] }

// HeaderName returns the canonical name of the key header.
func (m *Middleware) HeaderName() string { return m.cfg.header }

type handler struct {
	m     *Middleware
	route Route
	next  http.Handler
}

// ServeHTTP runs the flow of one request.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := h.m
	if !m.cfg.methods[r.Method] {
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
		m.refuse(w, r, EventKeyMissing, Event{}, CodeKeyMissing, 0)
		return
	default:
		m.refuse(w, r, EventKeyInvalid, Event{}, CodeKeyInvalid, 0)
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
	body, err := readBody(r, m.cfg.maxRequestBody, buf)
	if err != nil {
		if errors.Is(err, errTooLarge) {
			m.refuse(w, r, EventRequestTooLarge, Event{KeyDigest: digest}, CodeRequestTooLarge, 0)
		} else {
			m.refuse(w, r, 0, Event{KeyDigest: digest}, CodeBodyUnreadable, 0)
		}
		return
	}
	if m.cache != nil {
		if rec, raw, hasRaw := m.cache.lookup(skey); rec != nil {
			m.cached(w, r, skey, rec, raw, hasRaw, body, Event{KeyDigest: digest})
			return
		}
	}
	fp := m.cfg.fingerprint(r, body)

	c := call{h: h, w: w, r: r, body: body, skey: skey, digest: digest,
		key:   idemkey.Key{Scope: sc, Value: key},
		claim: store.Claim{Token: rand.Text(), Fingerprint: fp, TTL: h.route.Deadline + ClaimMargin},
	}
	c.decide(m.claim(r, &c))
}

// call is one claimed-or-refused request on its way through the flow.
type call struct {
	h      *handler
	w      http.ResponseWriter
	r      *http.Request
	body   []byte
	skey   string
	digest string
	key    idemkey.Key
	claim  store.Claim
	start  time.Time // when the claim was made
}

type claimOutcome struct {
	res store.Result
	err error
}

func (m *Middleware) claim(r *http.Request, c *call) claimOutcome {
	ctx, cancel := m.budget(r.Context())
	defer cancel()
	c.start = time.Now()
	res, err := m.store.Claim(ctx, c.skey, c.claim)
	return claimOutcome{res, err}
}

func (c *call) decide(o claimOutcome) {
	m := c.h.m
	ev := Event{KeyDigest: c.digest, StoreLatency: time.Since(c.start)}
	if o.err != nil {
		failed := ev
		failed.Kind, failed.Err = EventStoreError, o.err
		m.emit(c.r, failed)
		// The claim may have landed before the failure; free it if so.
		go m.releaseAbandoned(c.skey, c.claim.Token)
		if m.cfg.failOpen && errors.Is(o.err, store.ErrUnavailable) {
			// The store is out of reach: run without idempotency, on the
			// body already read. Any other error (a value the store could
			// not read may be a kept response) still answers 503.
			r := new(http.Request)
			*r = *c.r
			in := new(bodyReader)
			in.Reset(c.body)
			// As in run: the body's buffer goes back to the pool when
			// ServeHTTP returns, so a late read finds EOF.
			defer in.Reset(nil)
			r.Body, r.GetBody = in, nil
			c.h.next.ServeHTTP(c.w, r)
			return
		}
		m.refuse(c.w, c.r, 0, ev, CodeUnavailable, 1)
		return
	}
	res := o.res
	switch res.State {
	case store.Claimed, store.Mine:
		c.run()
	case store.Completed:
		if res.Record == nil {
			m.emit(c.r, Event{Kind: EventStoreError, KeyDigest: c.digest, Err: errors.New("idemkey: middleware: store answered completed without a record")})
			m.refuse(c.w, c.r, 0, ev, CodeUnavailable, 1)
			return
		}
		if m.cache != nil {
			m.cache.put(c.skey, res.Record, m.cfg.retention)
		}
		m.completed(c.w, c.r, res.Record, c.claim.Fingerprint, ev)
	case store.InFlight:
		if res.Fingerprint != c.claim.Fingerprint {
			m.refuse(c.w, c.r, EventKeyReused, ev, CodeKeyReused, 0)
			return
		}
		if m.cfg.wait > 0 {
			if o, ok := c.wait(); ok {
				c.decide(o)
				return
			}
		}
		m.refuse(c.w, c.r, EventInFlight, ev, CodeConflict, retryAfter(res.TTL))
	default:
		m.emit(c.r, Event{Kind: EventStoreError, KeyDigest: c.digest, Err: errors.New("idemkey: middleware: store answered an unknown claim state")})
		m.refuse(c.w, c.r, 0, ev, CodeUnavailable, 1)
	}
}

// wait polls the store until the key is no longer in flight for this
// request's fingerprint or the wait budget is spent. It reports false when the budget ran out with the key
// still in flight.
func (c *call) wait() (claimOutcome, bool) {
	m := c.h.m
	deadline := time.Now().Add(m.cfg.wait)
	pause := 10 * time.Millisecond
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return claimOutcome{}, false
		}
		t := time.NewTimer(min(pause, left))
		select {
		case <-c.r.Context().Done():
			t.Stop()
			return claimOutcome{}, false
		case <-t.C:
		}
		pause = min(2*pause, 250*time.Millisecond)
		o := m.claim(c.r, c)
		if o.err != nil || o.res.State != store.InFlight || o.res.Fingerprint != c.claim.Fingerprint {
			// Decided: including a key now held for a different request,
			// which is 422 however long one waits.
			return o, true
		}
	}
}

// run runs the handler as the key's owner, then keeps or releases.
func (c *call) run() {
	m := c.h.m
	m.emit(c.r, Event{Kind: EventFirstAttempt, KeyDigest: c.digest, StoreLatency: time.Since(c.start)})

	cw, w := newCapture(c.w, m.cfg.maxResponseBody, m.cfg.keepHeader)
	// The handler's context: the request's with the route's deadline, as
	// context.WithTimeout would make it (see runContext).
	cw.ctx.init(c.r.Context(), time.Now().Add(c.h.route.Deadline))
	defer cw.ctx.stop()
	cw.in.Reset(c.body)
	r := c.r.WithContext(idemkey.NewContext(&cw.ctx, c.key))
	r.Body = &cw.in
	r.GetBody = nil

	returned := false
	defer func() {
		// The body's buffer goes back to the pool when ServeHTTP returns:
		// a read after the handler returned (which net/http forbids) finds
		// EOF, never another request's body.
		cw.in.Reset(nil)
		if !returned {
			// A panic (http.ErrAbortHandler included) or runtime.Goexit:
			// free the key so a retry runs again, and let the panic go on.
			m.release(c.r, c.skey, c.claim.Token, c.digest, 0)
		}
	}()
	c.h.next.ServeHTTP(w, r)
	returned = true

	if cw.status == 0 && !cw.hijacked {
		cw.WriteHeader(http.StatusOK)
	}
	if cw.hijacked || !m.cfg.keep(cw.status) {
		m.release(c.r, c.skey, c.claim.Token, c.digest, cw.status)
		cw.finish()
		return
	}
	rec := &store.Record{
		Status:      cw.status,
		Header:      cw.kept,
		Body:        cw.body,
		BodyOmitted: cw.overflow,
		Fingerprint: c.claim.Fingerprint,
		CreatedAt:   c.start,
		CompletedAt: time.Now(),
	}
	ctx, cancel := m.detached(c.r)
	t := time.Now()
	err := m.store.Complete(ctx, c.skey, c.claim.Token, rec, m.cfg.retention)
	cancel()
	switch {
	case err == nil:
		if m.cache != nil {
			m.cache.put(c.skey, rec, m.cfg.retention)
		}
		m.emit(c.r, Event{Kind: EventKept, KeyDigest: c.digest, Status: cw.status, StoreLatency: time.Since(t)})
	case errors.Is(err, store.ErrNotOwner):
		m.emit(c.r, Event{Kind: EventOwnershipLost, KeyDigest: c.digest, Status: cw.status, StoreLatency: time.Since(t), Err: err})
	default:
		m.emit(c.r, Event{Kind: EventStoreError, KeyDigest: c.digest, Status: cw.status, StoreLatency: time.Since(t), Err: err})
	}
	cw.finish()
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

func (m *Middleware) release(r *http.Request, skey, token, digest string, status int) {
	ctx, cancel := m.detached(r)
	defer cancel()
	t := time.Now()
	err := m.store.Release(ctx, skey, token)
	e := Event{Kind: EventReleased, KeyDigest: digest, Status: status, StoreLatency: time.Since(t)}
	switch {
	case errors.Is(err, store.ErrNotOwner):
		e.Kind, e.Err = EventOwnershipLost, err
	case err != nil:
		e.Kind, e.Err = EventStoreError, err
	}
	m.emit(r, e)
}

// releaseAbandoned frees a claim whose reply was lost to a store failure,
// in case it landed. The handler never ran, so freeing it is always safe.
func (m *Middleware) releaseAbandoned(skey, token string) {
	ctx, cancel := m.budget(context.Background())
	defer cancel()
	m.store.Release(ctx, skey, token)
}

// cached answers a request whose key's kept response is in the local
// cache, as completed does. With the default fingerprint, a repeat whose
// rawDigest equals one already found to match the record has the same
// fingerprint, so the fingerprint (which canonicalises the body and costs
// several times the digest) is computed only for a repeat whose bytes
// differ from those seen before.
func (m *Middleware) cached(w http.ResponseWriter, r *http.Request, skey string, rec *store.Record, raw [32]byte, hasRaw bool, body []byte, ev Event) {
	if !m.cfg.defaultFingerprint {
		m.completed(w, r, rec, m.cfg.fingerprint(r, body), ev)
		return
	}
	d := rawDigest(r, body)
	if hasRaw && d == raw {
		m.replay(w, r, rec, ev)
		return
	}
	fp := m.cfg.fingerprint(r, body)
	if fp == rec.Fingerprint {
		m.cache.learn(skey, rec, d)
	}
	m.completed(w, r, rec, fp, ev)
}

// completed answers a request whose key holds a kept response: the replay
// when the fingerprints match, 422 when they do not.
func (m *Middleware) completed(w http.ResponseWriter, r *http.Request, rec *store.Record, fp [32]byte, ev Event) {
	if rec.Fingerprint != fp {
		m.refuse(w, r, EventKeyReused, ev, CodeKeyReused, 0)
		return
	}
	m.replay(w, r, rec, ev)
}

// replay writes a kept response, under the repeat's own request id.
func (m *Middleware) replay(w http.ResponseWriter, r *http.Request, rec *store.Record, ev Event) {
	ev.Kind, ev.Status = EventReplay, rec.Status
	m.emit(r, ev)
	h := w.Header()
	n := 0
	for _, v := range rec.Header {
		n += len(v)
	}
	// One array holds the kept values and the four the replay may add.
	values := make([]string, n+4)
	for k, v := range rec.Header {
		n := copy(values, v)
		h[k] = values[:n:n]
		values = values[n:]
	}
	// set is h.Set for a canonical name, with the value slot taken from
	// values.
	set := func(name, v string) {
		values[0] = v
		h[name] = values[:1:1]
		values = values[1:]
	}
	set(HeaderReplayed, "true")
	if h.Get(HeaderRequestID) == "" {
		set(HeaderRequestID, requestID(r))
	}
	if rec.BodyOmitted {
		set(HeaderBodyOmitted, "true")
	}
	if bodyAllowed(rec.Status) {
		set("Content-Length", strconv.Itoa(len(rec.Body)))
	}
	w.WriteHeader(rec.Status)
	if len(rec.Body) > 0 && bodyAllowed(rec.Status) {
		w.Write(rec.Body)
	}
}

// requestID returns the repeat's own request id: the incoming X-Request-Id
// when it is a sane token, or a new UUID.
func requestID(r *http.Request) string {
	id := r.Header.Get(HeaderRequestID)
	if id == "" || len(id) > 200 {
		return newRequestID()
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return newRequestID()
		}
	}
	return id
}

// newRequestID returns a random (version 4) UUID, as uuid.NewString does,
// in one allocation instead of two.
func newRequestID() string {
	var u uuid.UUID
	// crypto/rand.Read never fails: it crashes the program instead.
	rand.Read(u[:])
	u[6] = (u[6] & 0x0f) | 0x40 // version 4
	u[8] = (u[8] & 0x3f) | 0x80 // variant 10
	return u.String()
}

// refuse writes one of the middleware's problems and reports it as kind
// (when not 0), with what ev already says (the key digest, the store call's
// latency).
func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, kind EventKind, ev Event, code string, retryAfter int) {
	p := Problems[code]
	p.RetryAfter = retryAfter
	if kind != 0 {
		ev.Kind, ev.Status = kind, p.Status
		m.emit(r, ev)
	}
	m.cfg.errorWriter(w, r, p)
}

func (m *Middleware) emit(r *http.Request, e Event) {
	if m.cfg.observer != nil {
		m.cfg.observer(r, e)
	}
}

// retryAfter turns a claim's remaining life into whole seconds, at least 1.
func retryAfter(ttl time.Duration) int {
	s := int((ttl + time.Second - 1) / time.Second)
	return max(s, 1)
}

var errTooLarge = errors.New("idemkey: middleware: request body too large")

// readBody reads r's body in full, up to limit bytes, into buf's array
// when it is large enough.
func readBody(r *http.Request, limit int64, buf *bodyBuffer) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, errTooLarge
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	size := int64(512)
	if r.ContentLength >= 0 {
		size = r.ContentLength + 1 // room to see EOF without growing
	}
	size = min(size, limit+1)
	if int64(cap(buf.b)) < size && size <= maxPooledBody {
		buf.b = make([]byte, 0, max(size, minPooledBody))
	}
	if int64(cap(buf.b)) < size {
		// Too large to pool: a buffer of its own.
		buf.b = make([]byte, 0, size)
		buf.own = true
	}
	b, err := readInto(r.Body, buf.b[:0], limit)
	if cap(b) <= maxPooledBody {
		buf.b = b[:0] // keep what append may have grown, for the next request
	}
	return b, err
}

// readInto reads all of body into buf, up to limit bytes.
func readInto(body io.Reader, buf []byte, limit int64) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return nil, errTooLarge
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				return nil, errTooLarge
			}
			return nil, err
		}
	}
}

// Request bodies are read into buffers from a pool: a first run, a replay
// and a refusal alike read the whole body, and the buffer is free again
// once the response is written. Buffers of up to maxPooledBody bytes are
// pooled; a larger body gets a buffer of its own.
const (
	minPooledBody = 4 << 10
	maxPooledBody = 64 << 10
)

// bodyBuffer is one pooled request body buffer. own marks a buffer too
// large to go back to the pool.
type bodyBuffer struct {
	b   []byte
	own bool
}

var bodyPool = sync.Pool{New: func() any { return new(bodyBuffer) }}

func getBodyBuffer() *bodyBuffer { return bodyPool.Get().(*bodyBuffer) }

func putBodyBuffer(buf *bodyBuffer) {
	if buf.own {
		buf.b, buf.own = nil, false
	}
	bodyPool.Put(buf)
}

// bodyReader gives the handler the body that was read, as the request's
// Body.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }
