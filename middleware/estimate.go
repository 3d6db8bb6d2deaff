package middleware

import (
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey/store"
)

// runTimes is a route's running estimate of how long a first run takes,
// from the claim to the handler's return: an exponentially weighted moving
// average over the route's recent first runs in this process, weighing the
// newest 1/8. It feeds the Retry-After hint of a 409.
type runTimes struct {
	avg atomic.Int64 // nanoseconds; 0 until the first run ends
}

func (t *runTimes) add(d time.Duration) {
	d = max(d, 1)
	for {
		old := t.avg.Load()
		next := int64(d)
		if old != 0 {
			next = old + (int64(d)-old)/8
		}
		if t.avg.CompareAndSwap(old, next) {
			return
		}
	}
}

func (t *runTimes) estimate() time.Duration { return time.Duration(t.avg.Load()) }

// retryAfter is the Retry-After hint, in whole seconds, for a repeat that
// finds its key in flight under res at now: when the first request is
// likely done (the route's estimate less how long it has run), at least 1,
// and never more than the claim's remaining life. Before the route has
// finished a first run it answers 1: poll soon.
func (h *handler) retryAfter(res store.Result, now time.Time) int {
	left := h.runs.estimate()
	if left > 0 {
		elapsed := h.route.Deadline + ClaimMargin - res.TTL // without ClaimedAt: assume the route's TTL
		if !res.ClaimedAt.IsZero() {
			elapsed = now.Sub(res.ClaimedAt)
		}
		left -= max(elapsed, 0)
	}
	left = min(left, res.TTL)
	return max(seconds(left), 1)
}

// seconds rounds d up to whole seconds.
func seconds(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int((d + time.Second - 1) / time.Second)
}
