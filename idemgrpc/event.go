package idemgrpc

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/idemkey/idemkey/internal/eventname"
)

// EventKind names a decision the interceptor made. The names (String) are
// those package middleware gives the same decisions on HTTP, so that logs
// and metrics of both front doors read alike.
type EventKind uint8

// The decisions the interceptor reports.
const (
	// EventFirstAttempt: the key was claimed and the handler runs.
	EventFirstAttempt EventKind = iota + 1
	// EventReplay: a kept answer was replayed.
	EventReplay
	// EventInFlight: the key is held by a call still running (ABORTED).
	EventInFlight
	// EventKeyReused: the key is held for a different request
	// (FAILED_PRECONDITION).
	EventKeyReused
	// EventKeyMissing: a method that requires a key got none
	// (INVALID_ARGUMENT).
	EventKeyMissing
	// EventKeyInvalid: the key was malformed, or metadata and the request
	// field carried two different keys (INVALID_ARGUMENT).
	EventKeyInvalid
	// EventKept: the handler's answer was kept for replay.
	EventKept
	// EventReleased: the handler's answer was not kept (a code that is
	// released, a panic); the key is free for a retry.
	EventReleased
	// EventOwnershipLost: the claim lapsed and another call took the key
	// before this one finished; its answer was not kept.
	EventOwnershipLost
	// EventStoreError: a store call failed. On a claim the call got
	// UNAVAILABLE; on keep or release the claim is left to lapse.
	EventStoreError
	// EventScopeMissing: the scope function returned "" (INTERNAL).
	EventScopeMissing
)

var eventNames = [...]string{eventname.Invalid, eventname.FirstAttempt, eventname.Replay, eventname.InFlight,
	eventname.KeyReused, eventname.KeyMissing, eventname.KeyInvalid, eventname.Kept, eventname.Released,
	eventname.OwnershipLost, eventname.StoreError, eventname.ScopeMissing}

// String returns the event's name in snake case, for logs and metric
// labels.
func (k EventKind) String() string {
	if int(k) < len(eventNames) {
		return eventNames[k]
	}
	return eventNames[0]
}

// Event is one decision.
type Event struct {
	Kind EventKind
	// Method is the call's full method name.
	Method string
	// KeyDigest is the hex SHA-256 of the scope and key (the one in the
	// store key name); "" before a key was read. Never the key itself.
	KeyDigest string
	// Code is the answer's status code, when the event concerns an
	// answer.
	Code codes.Code
	// StoreLatency is how long the store call behind the event took, when
	// there was one.
	StoreLatency time.Duration
	// Err is the store's error for EventStoreError and
	// EventOwnershipLost.
	Err error
}

// An Observer receives every decision with the call's context, on the
// call's goroutine, except for the EventStoreError of a claim's extension
// (from a timer's goroutine) and of a background release of a claim whose
// reply was lost. An Observer must be safe for concurrent use.
type Observer func(ctx context.Context, e Event)

// SlogObserver returns an Observer that logs each event to l: store
// errors, lost ownership and missing scopes at Warn, refusals (in flight,
// reused, missing, invalid) at Info, the rest at Debug. It logs the key
// digest, never the key or the message.
func SlogObserver(l *slog.Logger) Observer {
	return func(ctx context.Context, e Event) {
		level := eventname.Level(e.Kind.String())
		if !l.Enabled(ctx, level) {
			return
		}
		attrs := make([]slog.Attr, 0, 6)
		attrs = append(attrs, slog.String("event", e.Kind.String()), slog.String("method", e.Method))
		if e.KeyDigest != "" {
			attrs = append(attrs, slog.String("key_digest", e.KeyDigest))
		}
		if e.Kind == EventKept || e.Kind == EventReleased || e.Kind == EventReplay {
			attrs = append(attrs, slog.String("code", e.Code.String()))
		}
		if e.StoreLatency != 0 {
			attrs = append(attrs, slog.Duration("store_latency", e.StoreLatency))
		}
		if e.Err != nil {
			attrs = append(attrs, slog.String("error", e.Err.Error()))
		}
		l.LogAttrs(context.WithoutCancel(ctx), level, "idemkey", attrs...)
	}
}

// warnDefault is the observer when none is set: what an operator must
// see goes to slog.Default at Warn, so nothing fails silently.
func warnDefault(ctx context.Context, e Event) {
	if eventname.Level(e.Kind.String()) == slog.LevelWarn {
		SlogObserver(slog.Default())(ctx, e)
	}
}
