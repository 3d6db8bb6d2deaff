// Package retryhint is the rule for how long a repeat that finds its key in
// flight is told to wait: the Retry-After of package middleware's 409 and
// the RetryInfo of idemgrpc's ABORTED. It estimates a route's (or a
// method's) first runs from those that ended in this process.
package retryhint

import (
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey/internal/keylife"
	"github.com/idemkey/idemkey/store"
)

// RunTimes is a route's running estimate of how long a first run takes,
// from the claim to the handler's return: an exponentially weighted moving
// average over the route's recent first runs in this process, weighing the
// newest 1/8. Its zero value has seen no run. It is safe for concurrent
// use.
type RunTimes struct {
	avg atomic.Int64 // nanoseconds; 0 until the first run ends
}

// Add counts a first run that took d (at least 1 ns).
func (t *RunTimes) Add(d time.Duration) {
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

// Estimate is the estimate: 0 until a first run has ended.
func (t *RunTimes) Estimate() time.Duration { return time.Duration(t.avg.Load()) }

// MaxOverdue is the longest hint for a first run that has run longer than
// usual for its route: the hints grow with how long it has run, up to
// this.
const MaxOverdue = 10 * time.Second

// RetryAfter is the hint, in whole seconds, for a repeat that finds its key
// in flight under res at now, never more than the claim's remaining life
// and at least 1. deadline is the route's deadline, from which the claim's
// age is worked out when the store does not say when it was made
// (res.ClaimedAt is zero): the claim is then taken to have lived deadline
// plus keylife.ClaimMargin less res.TTL.
//
//   - while the first run is within what is usual for the route (up to
//     twice the estimate, and never past its deadline): when it is likely
//     done, the estimate less how long it has run;
//   - before the route has finished a first run, or once the first run
//     lasts longer than usual (it is slow this time, stuck, or its process
//     died): half of how long it has run, at most MaxOverdue. A client
//     that follows the hints comes back after 1, 1, 1, 2, 3, 4, 6, 9, 10,
//     10, ... seconds: soon while the run may be about to finish, less
//     often the longer it lasts, and never later than 10 seconds after
//     the answer is there. The claim's whole remaining life is never the
//     hint: a client whose budget is shorter than that would give up on a
//     request that answers well within it.
func (t *RunTimes) RetryAfter(res store.Result, deadline time.Duration, now time.Time) int {
	elapsed := deadline + keylife.ClaimMargin - res.TTL
	if !res.ClaimedAt.IsZero() {
		elapsed = now.Sub(res.ClaimedAt)
	}
	elapsed = max(elapsed, 0)
	est := t.Estimate()
	var left time.Duration
	if est > 0 && elapsed < min(deadline, 2*est) {
		left = est - elapsed
	} else {
		left = min(elapsed/2, MaxOverdue)
	}
	return max(Seconds(min(left, res.TTL)), 1)
}

// Seconds rounds d up to whole seconds; 0 for d <= 0.
func Seconds(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int((d + time.Second - 1) / time.Second)
}
