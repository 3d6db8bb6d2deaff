package redis

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Every store call has a time budget (WithCallTimeout). A context.WithTimeout
// per call would cost a timer, its heap operations and three allocations on
// every call. Instead a call runs under:
//
//   - the caller's context itself, when its deadline comes no later than
//     the budget's end: a caller that bounds all its store calls with one
//     deadline pays nothing more;
//   - otherwise a budgetCtx: the budget's deadline, which go-redis puts on
//     the socket (ContextTimeoutEnabled), and a Done channel shared by every
//     call whose budget ends in the same slot of slotWidth, closed by one
//     timer per slot and Store. Done closes at most slotWidth after the
//     deadline; go-redis waits on it only for a pooled connection and
//     between retries, and the store when it bounds a call itself.
//
// A budgetCtx carries the caller's values but not its cancellation: the
// store checks the caller's context when a call starts, and a call under
// way then ends at its answer or at its budget, well under a second.
//
// Each Store has a slotClock of its own, never one for the whole process.
// Inside a testing/synctest bubble, channels and timers belong to the
// bubble that made them, time is the bubble's own, and every bubble starts
// at the same instant: a slot shared by the process would be handed to a
// call in another bubble (a fatal error when that call waits on it), or
// outlive its bubble, whose timer then never fires. A Store made in a
// bubble keeps its slots there. A call that reads an earlier time than the
// one its Store was made at runs on another clock than the Store's (a
// bubble using a Store made outside it): it gets a Done of its own, closed
// by a timer on its own clock, and never a shared slot.

// slotWidth is the granularity of the shared deadlines.
const slotWidth = 5 * time.Millisecond

// slot is one shared deadline: done closes when the slot ends.
type slot struct {
	n    int64 // the slot ends at n*slotWidth, in Unix nanoseconds
	done chan struct{}
}

// ended reports whether the slot's timer has fired. A slot whose number
// comes round again after the wall clock stepped back has: a new one is
// made then.
func (s *slot) ended() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// slotClock hands out the slot that ends at or after a given time.
type slotClock struct {
	made  time.Time            // when the Store was made, on the clock it was made on
	last  atomic.Pointer[slot] // the slot handed out last: the usual answer
	mu    sync.Mutex
	slots map[int64]*slot // slots not yet ended
}

// newSlotClock returns the slot clock of a new Store.
func newSlotClock() *slotClock { return &slotClock{made: time.Now()} }

// after returns the slot that ends at the first slot boundary at or after t.
func (c *slotClock) after(t time.Time) *slot {
	n := (t.UnixNano() + int64(slotWidth) - 1) / int64(slotWidth)
	if s := c.last.Load(); s != nil && s.n == n && !s.ended() {
		return s
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.slots[n]
	if s == nil {
		if c.slots == nil {
			c.slots = make(map[int64]*slot)
		}
		s = &slot{n: n, done: make(chan struct{})}
		c.slots[n] = s
		time.AfterFunc(time.Until(time.Unix(0, n*int64(slotWidth))), func() {
			c.mu.Lock()
			delete(c.slots, n)
			c.mu.Unlock()
			close(s.done)
		})
	}
	c.last.Store(s)
	return s
}

// budgetCtx is the context of a store call: the caller's values, the
// budget's deadline, and a shared Done.
type budgetCtx struct {
	values   context.Context
	deadline time.Time
	done     chan struct{}
}

func (c *budgetCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *budgetCtx) Done() <-chan struct{}       { return c.done }
func (c *budgetCtx) Value(key any) any           { return c.values.Value(key) }

func (c *budgetCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// budget returns the context a call with budget d runs under (see above).
// The caller has checked that ctx is not done.
func (c *slotClock) budget(ctx context.Context, d time.Duration) context.Context {
	now := time.Now()
	end := now.Add(d)
	if dl, ok := ctx.Deadline(); ok && !dl.After(end) {
		return ctx
	}
	if now.Before(c.made) {
		// Another clock than the Store's (see above): a timer of its own.
		done := make(chan struct{})
		time.AfterFunc(d, func() { close(done) })
		return &budgetCtx{values: ctx, deadline: end, done: done}
	}
	return &budgetCtx{values: ctx, deadline: end, done: c.after(end).done}
}
