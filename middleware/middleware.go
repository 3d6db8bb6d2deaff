// Package middleware makes retried HTTP mutations safe: a request that
// carries an Idempotency-Key runs its handler once, and every repeat gets the
// first answer.
//
// For each covered request (POST, PUT, PATCH, DELETE by default) it reads
// the key, finds the caller's scope, reads and fingerprints the body, and
// claims the key in the store in one call. Then:
//
//   - claimed: the handler runs with a deadline; its response is kept (2xx,
//     3xx and 4xx but the transient 408, 409, 425 and 429) and then sent,
//     or the key is released (5xx, panic, transient 4xx) so a retry runs
//     again;
//   - completed with the same fingerprint: the kept response is replayed
//     with Idempotent-Replayed: true;
//   - in flight with the same fingerprint: 409 conflict with Retry-After, a
//     hint of when the first request is likely done;
//   - held for a different request: 422 idempotency_key_reused;
//   - the store failed or is full: 503 unavailable with Retry-After, and the
//     handler does not run.
//
// Errors the middleware writes itself are RFC 9457 problem+json
// (idemkey.Problem) with a machine-readable code (the Code constants here
// and in package idemkey). Every decision is reported to the
// observers (WithObserver) as an Event; with none set, the failures an
// operator must see go to slog.Default() at Warn, so none is silent.
//
// In package code the import is usually given a name, since chi's own
// middleware package has the same one:
//
//	import idem "github.com/idemkey/idemkey/middleware"
//
// # Ordering
//
// Put the middleware after authentication (the scope needs the caller's
// identity), after request-size limits and request-id middleware (chi's
// RequestID), inside compression and CORS (so that it keeps and replays the
// uncompressed response, and preflights never reach it), and inside any
// timeout wrapper: an http.TimeoutHandler or chi's Timeout outside it
// answers 503 while the handler still runs, and the record is kept all the
// same. Use the route deadline (Deadline) instead of a timeout wrapper
// inside it. A recoverer (chi's Recoverer) may sit either side: the
// middleware releases the key on a panic and lets the panic go on.
//
// # Request ids
//
// Every response the middleware answers for a covered request with a key
// (a first run, a replay or a refusal) carries X-Request-Id: the one the
// service's request-id middleware already set on the response, else the
// request's own X-Request-Id (when it is 1 to 200 visible ASCII
// characters), else a new random UUID (WithoutNewRequestID turns that
// last one off). A replay carries the repeat's id, never the first
// request's.
//
// # Streamed responses
//
// A response goes out only after it is kept. A handler that flushes, or
// writes more than the capture limit (WithMaxResponseBody), starts
// streaming: at that moment the record is kept with its status and headers
// and the body omitted, then the response goes out. A repeat gets the
// status and headers with an empty body and Idempotent-Body-Omitted: true,
// and never runs the handler again, however long the stream lasts. A
// streamed status that is not kept (a 5xx) holds the key until the handler
// returns, then releases it.
//
// # Windows
//
// While a handler runs, or its response streams, no other request runs its
// key: when the store is a store.Extender the claim is extended every
// third of its life until the handler returns, so a slow handler or a
// client that stops reading never lets it lapse. With a store that cannot
// extend, a handler that outlives its claim (the route's deadline plus
// ClaimMargin) loses the key to a retry (EventOwnershipLost).
//
// If the store fails while the response is being kept, the client still
// gets the response, the failure is reported as EventStoreError, and the
// claim is left to lapse: a repeat within the claim's life gets 409, and
// after it the handler can run again. A store.TxStore (store/postgres) has
// no such window: the record commits with the handler's own writes.
//
// # Fingerprints and raw digests
//
// With the default fingerprint, a request's fingerprint is computed when
// it is first needed, and its raw digest (a SHA-256 of its bytes as sent,
// several times cheaper than the canonical form) at once. The record keeps
// both (store.Record.RawDigest), so a repeat whose bytes equal the first
// request's is known by its raw digest and replayed without building its
// canonical form; one whose bytes differ (reordered JSON, a different
// request) is compared by its fingerprint, and so is every repeat of a
// record kept without a raw digest. The claim is where the fingerprint is
// needed otherwise: a claim on a free key stores it, so that a repeat
// that finds the key in flight can be told apart (422 for a different
// request, 409 for the same one), and a repeat that finds it in flight
// computes its own to compare. A store that sends the claim to a server in
// one command needs it before it knows whether the key is free, and gets
// it; a store.LazyClaimer (the memory store) asks for it only to write a
// claim, so a replay from it costs one raw digest. A service's own
// fingerprint (WithFingerprint) is computed before every claim, and no raw
// digest is kept: equal bytes need not mean an equal fingerprint of its.
//
// # Transactional stores
//
// With a store.TxStore the handler runs inside a transaction of the
// store's database, which it gets from its context (the store's package
// says how) and writes through. A kept response's record is written in
// that transaction and committed before the response is sent; a response
// that is not kept, or a panic, rolls it back. A failed or ambiguous commit
// answers 503: a retry then replays if the commit happened, or runs again
// if it did not. On such a route the start of a stream is the commit: the
// record, with the body omitted, commits with the handler's writes before
// the first byte goes out; the handler must not write to the database
// after it flushes.
package middleware

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/describe"
	"github.com/idemkey/idemkey/internal/heartbeat"
	"github.com/idemkey/idemkey/internal/retryhint"
	"github.com/idemkey/idemkey/internal/storecall"
	"github.com/idemkey/idemkey/store"
)

// Middleware is the idempotency layer. Build it once with New and use
// Handler, Required or Optional per route; it is safe for concurrent use.
type Middleware struct {
	store store.Store
	ext   store.Extender // store as an Extender, when it is one
	tx    store.TxStore  // store as a TxStore, when it is one
	// waiter is the store as a Waiter, when it is one.
	waiter store.Waiter
	lazy   store.LazyClaimer // store as a LazyClaimer, when it is one
	cfg    *config
	cache  *replayCache // nil unless WithLocalCache
	// abandoned bounds the background releases of claims whose reply was
	// lost to a store failure.
	abandoned *storecall.Abandoned
	beats     heartbeat.Beats // plain claims held while their handlers run
}

// maxAbandoned is how many releases of failed claims may run in the
// background at once; during an outage the rest are left to lapse.
const maxAbandoned = 16

// New returns a Middleware that keeps its claims and records in st. It
// returns an error for a nil store, for invalid options (see Option), and
// for WithFailOpen with a store.TxStore.
func New(st store.Store, opts ...Option) (*Middleware, error) {
	if st == nil {
		return nil, errors.New("idemkey: middleware: nil store")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	m := &Middleware{store: st, cfg: cfg, abandoned: storecall.NewAbandoned(maxAbandoned)}
	m.ext, _ = st.(store.Extender)
	m.beats.Ext = m.ext
	m.tx, _ = st.(store.TxStore)
	m.waiter, _ = st.(store.Waiter)
	m.lazy, _ = st.(store.LazyClaimer)
	if cfg.failOpen && m.tx != nil {
		return nil, fmt.Errorf("idemkey: middleware: WithFailOpen with a transactional store (%T): its handlers never run without their transaction", st)
	}
	if cfg.cacheSize > 0 {
		m.cache = newReplayCache(cfg.cacheSize, cfg.cacheTTL)
	}
	return m, nil
}

// routeConfig is the idempotency configuration of one route, as
// Required and Optional build it; package openapi reads it through
// internal/describe.
type routeConfig struct {
	// Required: a covered request without a key gets 400
	// idempotency_key_missing. Otherwise it runs without idempotency.
	Required bool
	// Deadline bounds the handler's context; the claim lives Deadline plus
	// ClaimMargin.
	Deadline time.Duration
}

// A RouteOption configures one route: give it to Required or Optional.
// Deadline makes one. An invalid option (a deadline that is not positive)
// never panics: the route built with it answers every covered request 500
// route_invalid without running the handler or touching the store, and
// reports EventRouteInvalid with the option's error, so the mistake shows
// on the first request and in the logs, and no request runs unprotected.
// Required and Optional keep the shape chi's With and plain nesting take.
type RouteOption struct {
	apply func(*routeConfig) error
}

// Deadline sets the route's deadline: the handler's context ends d after
// the claim, and the claim lives d plus ClaimMargin. It replaces the
// default of WithDeadline for this route. A d that is not positive makes
// the option invalid (see RouteOption).
func Deadline(d time.Duration) RouteOption {
	return RouteOption{apply: func(r *routeConfig) error {
		if d <= 0 {
			return fmt.Errorf("idemkey: middleware: Deadline(%v): the deadline must be positive", d)
		}
		r.Deadline = d
		return nil
	}}
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
	rt := routeConfig{Required: required, Deadline: m.cfg.Deadline}
	var errs []error
	for i, o := range opts {
		if o.apply == nil {
			errs = append(errs, fmt.Errorf("idemkey: middleware: route option %d is the zero RouteOption", i+1))
			continue
		}
		if err := o.apply(&rt); err != nil {
			errs = append(errs, err)
		}
	}
	err := errors.Join(errs...)
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic("idemkey: middleware: nil handler")
		}
		return &handler{m: m, route: rt, invalid: err, next: next}
	}
}

// routeOf returns the configuration of a handler that m made with Handler,
// Required or Optional, the error of its invalid options, and whether h is
// one. A handler made by another Middleware is not m's: each describes its
// own routes (with its own header name).
func (m *Middleware) routeOf(h http.Handler) (routeConfig, error, bool) {
	if h, ok := h.(*handler); ok && h.m == m {
		return h.route, h.invalid, true
	}
	return routeConfig{}, nil, false
}

func init() {
	describe.Of = func(v any) (describe.Middleware, bool) {
		m, ok := v.(*Middleware)
		if !ok || m == nil {
			return describe.Middleware{}, false
		}
		return describe.Middleware{
			Header: m.cfg.header,
			Covers: m.cfg.covers,
			RouteOf: func(h http.Handler) (describe.Route, bool) {
				rt, err, ok := m.routeOf(h)
				return describe.Route{Required: rt.Required, Deadline: rt.Deadline, Err: err}, ok
			},
		}, true
	}
	describe.Problems = func() []idemkey.Problem {
		codes := problemCodes()
		ps := make([]idemkey.Problem, len(codes))
		for i, c := range codes {
			ps[i] = problems[c]
		}
		return ps
	}
}

// handler is one route: the middleware and route configuration around the
// next handler, with the route's running estimate of how long a first run
// takes (for Retry-After hints).
type handler struct {
	m       *Middleware
	route   routeConfig
	invalid error // of the route's invalid options: every covered request gets 500
	next    http.Handler
	runs    retryhint.RunTimes
}
