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
//     done, the estimate less how long it has run;
//   - before the route has finished a first run, or once the first request
//     runs longer than usual (it is slow this time, stuck, or its process
//     died): half of how long it has run, at most 10 seconds. A client
//     that follows the hints comes back after 1, 1, 1, 2, 3, 4, 6, 9, 10,
//     10, ... seconds: soon while the run may be about to finish, less
//     often the longer it lasts, and never later than 10 seconds after
//     the answer is there. The claim's whole remaining life is never the
//     hint: a client whose budget is shorter than that would give up on a
//     request that answers well within it.
//
// A claim whose owner died is settled only when its life ends (the route's
// deadline plus ClaimMargin): until then every repeat gets 409, with hints
// that grow as above.
func (h *handler) retryAfter(res store.Result, now time.Time) int {
	elapsed := h.route.Deadline + ClaimMargin - res.TTL // without ClaimedAt: assume the route's TTL
	if !res.ClaimedAt.IsZero() {
		elapsed = now.Sub(res.ClaimedAt)
	}
	elapsed = max(elapsed, 0)
	est := h.runs.estimate()
	var left time.Duration
	if est > 0 && elapsed < min(h.route.Deadline, 2*est) {
		left = est - elapsed
	} else {
		left = min(elapsed/2, maxOverdueHint)
	}
	return max(seconds(min(left, res.TTL)), 1)
}

// maxOverdueHint is the longest Retry-After hint of a 409 for a first
// request that has run longer than usual for its route (see
// Middleware.Handler): the hints grow with how long it has run, up to this.
const maxOverdueHint = 10 * time.Second

// seconds rounds d up to whole seconds.
func seconds(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int((d + time.Second - 1) / time.Second)
}
