package idemgrpc

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey/store"
)

// runTimes is a method's running estimate of how long a first run takes,
// from the claim to the handler's return: an exponentially weighted moving
// average over the method's recent first runs in this process, weighing
// the newest 1/8. It feeds the RetryInfo of an in-flight answer, by the
// rules of package middleware's Retry-After.
type runTimes struct {
	avg atomic.Int64 // nanoseconds; 0 until the first run ends
}

func (s *Server) runTimes(method string) *runTimes {
	if t, ok := s.runs.Load(method); ok {
		return t.(*runTimes)
	}
	t, _ := s.runs.LoadOrStore(method, new(runTimes))
	return t.(*runTimes)
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

// maxOverdueHint is the longest hint for a first call that has run longer
// than usual for its method.
const maxOverdueHint = 10 * time.Second

// retryAfter is the hint, in whole seconds, for a repeat that finds its
// key in flight under res at now, never more than the claim's remaining
// life and at least 1: while the first call runs within what is usual for
// the method (up to twice its estimate, and never past its deadline), the
// estimate less how long it has run; before the method has finished a
// first run, or once the first call runs longer than usual, half of how
// long it has run, at most 10 seconds. deadline is the repeat's own
// deadline for the method, the assumed life of the claim when the store
// does not say when it was made.
func (t *runTimes) retryAfter(res store.Result, deadline time.Duration, now time.Time) int {
	elapsed := deadline + ClaimMargin - res.TTL
	if !res.ClaimedAt.IsZero() {
		elapsed = now.Sub(res.ClaimedAt)
	}
	elapsed = max(elapsed, 0)
	est := time.Duration(t.avg.Load())
	var left time.Duration
	if est > 0 && elapsed < min(deadline, 2*est) {
		left = est - elapsed
	} else {
		left = min(elapsed/2, maxOverdueHint)
	}
	return max(seconds(min(left, res.TTL)), 1)
}

// seconds rounds d up to whole seconds.
func seconds(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int((d + time.Second - 1) / time.Second)
}

// heartbeat extends a call's claim every third of its life while its
// handler runs, on a store.Extender, so that a handler that runs past its
// claim's life (it ignores its context) does not lose its key to a retry.
type heartbeat struct {
	mu      sync.Mutex
	t       *time.Timer
	stopped bool
}

func (s *Server) heartbeat(c *call) *heartbeat {
	hb := &heartbeat{}
	every := c.claim.TTL / 3
	var beat func()
	beat = func() {
		ctx, cancel := c.detached()
		err := s.ext.Extend(ctx, c.skey, c.claim.Token, c.claim.TTL)
		cancel()
		hb.mu.Lock()
		defer hb.mu.Unlock()
		if hb.stopped {
			// The handler returned while the extension was under way: the
			// claim is settled, and what the extension met says nothing.
			return
		}
		switch {
		case errors.Is(err, store.ErrNotOwner):
			c.emit(Event{Kind: EventOwnershipLost, Err: err})
			return
		case err != nil:
			c.emit(Event{Kind: EventStoreError, Err: err})
		}
		hb.t = time.AfterFunc(every, beat)
	}
	hb.mu.Lock()
	hb.t = time.AfterFunc(every, beat)
	hb.mu.Unlock()
	return hb
}

func (hb *heartbeat) stop() {
	hb.mu.Lock()
	hb.stopped = true
	hb.t.Stop()
	hb.mu.Unlock()
}
