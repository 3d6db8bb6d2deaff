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
// finds its key in flight under res at now, never more than the claim's
// remaining life and at least 1:
//
//   - while the first request runs within what is usual for the route (up
//     to twice its estimate, and never past its deadline): when it is likely
//     done, the estimate less how long it has run; before the route has
//     finished a first run, 1 (poll soon);
//   - once it runs longer than that, it is stuck or its process died: the
//     key is settled by the end of the claim's life at the latest (its
//     owner finishes, or the claim lapses), so the hint is that life. A
//     client that polled every second would spend its attempts before the
//     claim of a dead instance lapsed.
func (h *handler) retryAfter(res store.Result, now time.Time) int {
	elapsed := h.route.Deadline + ClaimMargin - res.TTL // without ClaimedAt: assume the route's TTL
	if !res.ClaimedAt.IsZero() {
		elapsed = now.Sub(res.ClaimedAt)
	}
	est := h.runs.estimate()
	usual := h.route.Deadline
	if est > 0 {
		usual = min(usual, 2*est)
	}
	var left time.Duration
	switch {
	case elapsed >= usual:
		left = res.TTL
	case est > 0:
		left = min(est-elapsed, res.TTL)
	}
	return max(seconds(left), 1)
}

// seconds rounds d up to whole seconds.
func seconds(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int((d + time.Second - 1) / time.Second)
}
