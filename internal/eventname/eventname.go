// Package eventname names the decisions that package middleware (on HTTP)
// and idemgrpc (on gRPC) report to their observers, and says at which level
// each is logged, so that the logs and metrics of both front doors read
// alike. Each front door numbers its own event kinds; these are their
// String values.
package eventname

import "log/slog"

// The names, in snake case, for logs and metric labels.
const (
	Invalid         = "invalid" // a kind that names no decision
	FirstAttempt    = "first_attempt"
	Replay          = "replay"
	InFlight        = "in_flight"
	KeyReused       = "key_reused"
	KeyMissing      = "key_missing"
	KeyInvalid      = "key_invalid"
	RequestTooLarge = "request_too_large"
	Kept            = "kept"
	Released        = "released"
	OwnershipLost   = "ownership_lost"
	StoreError      = "store_error"
	BodyUnreadable  = "body_unreadable"
	StoreFull       = "store_full"
	ScopeMissing    = "scope_missing"
	RouteInvalid    = "route_invalid"
)

// Level is the level a decision is logged at: slog.LevelWarn for what an
// operator must see (a store error, lost ownership, a full store, an
// invalid route, a missing scope: the last two a service's
// misconfiguration), which is logged even when no observer is set;
// slog.LevelInfo for a refusal of the caller's request (in flight, a
// reused, missing or invalid key, a body too large or unreadable);
// slog.LevelDebug for the rest, and for a name not listed here.
func Level(name string) slog.Level {
	switch name {
	case StoreError, OwnershipLost, StoreFull, RouteInvalid, ScopeMissing:
		return slog.LevelWarn
	case InFlight, KeyReused, KeyMissing, KeyInvalid, RequestTooLarge, BodyUnreadable:
		return slog.LevelInfo
	}
	return slog.LevelDebug
}
