package middleware

import (
	"context"
	"time"

	"github.com/idemkey/idemkey/store"
)

// The bounded wait (WithWait) of a repeat that finds its key in flight for
// its own request.

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
		if o.err != nil || o.res.State != store.InFlight || o.res.Fingerprint != a.Fingerprint() {
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
