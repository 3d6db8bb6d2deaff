package middleware

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkey/idemkey/internal/eventname"
)

// EventKind names a decision the middleware made.
type EventKind uint8

// The decisions the middleware reports.
const (
	// EventFirstAttempt: the key was claimed and the handler runs.
	EventFirstAttempt EventKind = iota + 1
	// EventReplay: a kept response was replayed.
	EventReplay
	// EventInFlight: the key is held by a request still running (409).
	EventInFlight
	// EventKeyReused: the key is held for a different request (422).
	EventKeyReused
	// EventKeyMissing: a route that requires a key got none (400).
	EventKeyMissing
	// EventKeyInvalid: the key header was malformed (400).
	EventKeyInvalid
	// EventRequestTooLarge: the body was over the limit (413).
	EventRequestTooLarge
	// EventKept: the handler's response was kept for replay.
	EventKept
	// EventReleased: the handler's response was not kept (a server error,
	// a panic, a hijacked connection); the key is free for a retry.
	EventReleased
	// EventOwnershipLost: the claim lapsed and another request took the
	// key before this one finished; its response was not kept (or, from
	// a heartbeat, will not be).
	EventOwnershipLost
	// EventStoreError: a store call failed. On a claim the request got 503
	// (or ran without idempotency under WithFailOpen); on keep or release
	// the claim is left to lapse; on a heartbeat the claim is extended
	// again soon.
	EventStoreError
	// EventBodyUnreadable: the request body could not be read in full, or
	// not within WithBodyTimeout (400).
	EventBodyUnreadable
	// EventStoreFull: the store refused a new key because it is full (Err
	// matches store.ErrFull), rather than drop a claim or a kept response
	// (503). The store is up: the answer is not an outage.
	EventStoreFull
	// EventScopeMissing: the scope function (WithScope) returned "" for
	// the request, which names no caller: a configuration error (500).
	EventScopeMissing
	// EventRouteInvalid: the route was built with an invalid RouteOption
	// (Err says which): a configuration error (500 route_invalid).
	EventRouteInvalid
)

var eventNames = [...]string{eventname.Invalid, eventname.FirstAttempt, eventname.Replay, eventname.InFlight,
	eventname.KeyReused, eventname.KeyMissing, eventname.KeyInvalid, eventname.RequestTooLarge, eventname.Kept,
	eventname.Released, eventname.OwnershipLost, eventname.StoreError, eventname.BodyUnreadable, eventname.StoreFull,
	eventname.ScopeMissing, eventname.RouteInvalid}

// eventLevels holds each kind's level by internal/eventname's rule, read
// once per event with no map or string compare.
var eventLevels = func() (l [len(eventNames)]slog.Level) {
	for k, name := range eventNames {
		l[k] = eventname.Level(name)
	}
	return l
}()

// String returns the event's name in snake case, for logs and metric labels.
func (k EventKind) String() string {
	if int(k) < len(eventNames) {
		return eventNames[k]
	}
	return eventNames[0]
}

// Event is one decision.
type Event struct {
	Kind EventKind
	// KeyDigest is the hex SHA-256 of the scope and key (the one in the
	// store key name); "" before a key was read. Never the key itself.
	KeyDigest string
	// Route is the pattern of the route that served the request
	// (http.Request.Pattern, as ServeMux and chi v5.2+ set it), else what
	// WithRouteName's function names, else "". Never the raw path.
	Route string
	// Status is the response status, when the event concerns a response.
	Status int
	// Size is the bytes of the record kept (EventKept) or replayed
	// (EventReplay): its body, header names and values.
	Size int
	// StoreLatency is how long the store call behind the event took, when
	// there was one.
	StoreLatency time.Duration
	// Err is the store's error for EventStoreError and EventOwnershipLost,
	// and the invalid option's for EventRouteInvalid.
	Err error
}

// An Observer receives every decision with the request it concerns (its
// context is there for adapters), on the request goroutine, except for a
// heartbeat's events (EventStoreError, EventOwnershipLost while the
// handler runs), which come from a timer's, and the EventStoreError of a
// background release of a claim whose reply was lost, which comes from
// that release's goroutine, possibly after the request has ended. An
// Observer must be safe for concurrent use.
type Observer func(r *http.Request, e Event)

// SlogObserver returns an Observer that logs each event to l: store errors,
// lost ownership, a full store, invalid routes and missing scopes (a
// service's misconfiguration) at Warn, refusals (409, 422, 400, 413) at
// Info, the rest at Debug. It logs the key digest, never the key or the
// body.
func SlogObserver(l *slog.Logger) Observer {
	return func(r *http.Request, e Event) { logEvent(l, r, e) }
}

// level is the level SlogObserver logs an event of kind k at.
func (k EventKind) level() slog.Level {
	if int(k) < len(eventLevels) {
		return eventLevels[k]
	}
	return slog.LevelDebug
}

func logEvent(l *slog.Logger, r *http.Request, e Event) {
	level := e.Kind.level()
	ctx := r.Context()
	if !l.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 9)
	attrs = append(attrs, slog.String("event", e.Kind.String()), slog.String("method", r.Method), slog.String("path", r.URL.Path))
	if e.Route != "" {
		attrs = append(attrs, slog.String("route", e.Route))
	}
	if e.KeyDigest != "" {
		attrs = append(attrs, slog.String("key_digest", e.KeyDigest))
	}
	if e.Status != 0 {
		attrs = append(attrs, slog.Int("status", e.Status))
	}
	if e.Size != 0 {
		attrs = append(attrs, slog.Int("size", e.Size))
	}
	if e.StoreLatency != 0 {
		attrs = append(attrs, slog.Duration("store_latency", e.StoreLatency))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("error", e.Err.Error()))
	}
	l.LogAttrs(context.WithoutCancel(ctx), level, "idemkey", attrs...)
}

// observed reports whether any observer receives events: what only an
// event reports (a record's size, a store call's latency) is not worked
// out for nobody.
func (m *Middleware) observed() bool { return len(m.cfg.observers) > 0 }

// since is time.Since(t) for an event's StoreLatency: 0 when no observer
// will read it, which spares reading the clock.
func (m *Middleware) since(t time.Time) time.Duration {
	if !m.observed() {
		return 0
	}
	return time.Since(t)
}

// emit reports e to the observers. With none set, an event an operator
// must see (the kinds SlogObserver logs at Warn: store errors, lost
// ownership, a refused or failed keep or release, a full store, an
// invalid route or a missing scope) goes to slog.Default() at Warn, so
// that nothing fails silently; the rest goes nowhere. An observer the
// service sets replaces that log.
func (m *Middleware) emit(r *http.Request, e Event) {
	if !m.observed() {
		if e.Kind.level() == slog.LevelWarn {
			e.Route = m.routeName(r)
			logEvent(slog.Default(), r, e)
		}
		return
	}
	e.Route = m.routeName(r)
	for _, o := range m.cfg.observers {
		o(r, e)
	}
}

// routeName names r's route for Event.Route.
func (m *Middleware) routeName(r *http.Request) string {
	if r.Pattern == "" && m.cfg.routeName != nil {
		return m.cfg.routeName(r)
	}
	return r.Pattern
}

// event returns an event about this attempt's key.
func (a *attempt) event(kind EventKind) Event {
	return Event{Kind: kind, KeyDigest: a.digest}
}

// emit reports ev; of an owner that claimed nothing, only failures.
func (a *attempt) emit(ev Event) {
	if !a.own.claimed() && ev.Kind != EventStoreError {
		return
	}
	a.h.m.emit(a.r, ev)
}
