package middleware

import (
	"context"
	"net/http"
	"time"

	"github.com/idemkey/idemkey/internal/storecall"
)

// Budgets: every store call has its own time budget (WithStoreTimeout),
// and the calls that settle a key run detached from the request's
// cancellation, so that a client that hangs up does not stop them
// (internal/storecall).

// detached returns a context for keeping or releasing: it keeps r's values
// but not its cancellation, so a client that hangs up does not stop the
// record from being kept. The store's own budget bounds the call.
func (m *Middleware) detached(r *http.Request) (context.Context, context.CancelFunc) {
	return storecall.Detached(r.Context(), m.cfg.StoreTimeout)
}

// detached is m.detached for the attempt's own settling calls, in the
// attempt's memory rather than an allocation of its own.
func (a *attempt) detached() (context.Context, context.CancelFunc) {
	a.unbound.Parent = a.r.Context()
	return a.h.m.budget(&a.unbound)
}

// budget adds WithStoreTimeout's bound to ctx, when one was set.
func (m *Middleware) budget(ctx context.Context) (context.Context, context.CancelFunc) {
	return storecall.Budget(ctx, m.cfg.StoreTimeout)
}

// releaseAbandoned frees, in the background, a claim whose reply was lost
// to a store failure, in case it landed. The handler never ran, so freeing
// it is always safe. At most maxAbandoned run at once: during an outage
// the rest are left to lapse at the end of their life. A failure other
// than the store still being down is reported, from the releasing
// goroutine.
func (m *Middleware) releaseAbandoned(r *http.Request, skey, token, digest string) {
	m.abandoned.Release(r.Context(), m.store, m.cfg.StoreTimeout, skey, token, func(err error, lat time.Duration) {
		m.emit(r, Event{Kind: EventStoreError, KeyDigest: digest, StoreLatency: lat, Err: err})
	})
}
