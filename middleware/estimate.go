package middleware

import (
	"time"

	"github.com/idemkey/idemkey/store"
)

// retryAfter is the Retry-After hint, in whole seconds, of a 409 for a
// repeat that finds its key in flight under res at now: the rule of
// internal/retryhint over the route's recent first runs and its deadline.
//
// A claim whose owner died is settled only when its life ends (the route's
// deadline plus ClaimMargin): until then every repeat gets 409, with hints
// that grow with the claim's age, up to 10 seconds.
func (h *handler) retryAfter(res store.Result, now time.Time) int {
	return h.runs.RetryAfter(res, h.route.Deadline, now)
}
