package middleware

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// runContext is the context a claimed request's handler runs with: the
// request's context with the route's deadline, as context.WithDeadline
// makes it, and it behaves as that context does in every respect.
//
// What it saves is the making: WithDeadline starts a timer and registers
// with the request's context at once, which costs more than the rest of
// the middleware's own work on a replay. runContext makes that context
// only when something needs it: Done, a context derived from it (which
// calls Done), context.Cause, or Err once the deadline has passed or the
// request's context has ended. A handler that never waits on its context
// never pays for it; one that does pays what WithDeadline costs.
type runContext struct {
	parent   context.Context
	deadline time.Time

	made    atomic.Pointer[madeContext]
	mu      sync.Mutex // guards making and stopped
	stopped bool       // stop was called before anything made the context
}

type madeContext struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// init sets the context up as context.WithDeadline(parent, deadline).
func (c *runContext) init(parent context.Context, deadline time.Time) {
	c.parent, c.deadline = parent, deadline
}

// real returns the context c stands for, making it on first use.
func (c *runContext) real() context.Context {
	if m := c.made.Load(); m != nil {
		return m.ctx
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.made.Load(); m != nil {
		return m.ctx
	}
	m := new(madeContext)
	if c.stopped {
		// stop found the context neither expired nor ended by its parent:
		// WithDeadline's context would have been canceled then, and
		// nothing that happens to the parent afterwards changes it.
		m.ctx, m.cancel = context.WithCancel(context.WithoutCancel(c.parent))
		m.cancel()
	} else {
		m.ctx, m.cancel = context.WithDeadline(c.parent, c.deadline)
	}
	c.made.Store(m)
	return m.ctx
}

// stop is the context's cancel function: the handler has returned.
func (c *runContext) stop() {
	if m := c.made.Load(); m != nil {
		m.cancel()
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.made.Load(); m != nil {
		m.cancel()
		return
	}
	if c.parent.Err() != nil || !time.Now().Before(c.deadline) {
		// It ended before it was stopped: make it, so that it tells how
		// (DeadlineExceeded, or the parent's error and cause).
		m := new(madeContext)
		m.ctx, m.cancel = context.WithDeadline(c.parent, c.deadline)
		m.cancel()
		c.made.Store(m)
		return
	}
	c.stopped = true
}

// Deadline returns the route's deadline, or the parent's when it is sooner.
func (c *runContext) Deadline() (time.Time, bool) {
	if d, ok := c.parent.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

// Done returns the channel that is closed when the deadline passes, the
// parent is done or the handler has returned.
func (c *runContext) Done() <-chan struct{} { return c.real().Done() }

// Err returns nil while the context lives, and then why it ended.
func (c *runContext) Err() error {
	if m := c.made.Load(); m != nil {
		return m.ctx.Err()
	}
	c.mu.Lock()
	stopped := c.stopped
	c.mu.Unlock()
	if stopped || c.parent.Err() != nil || !time.Now().Before(c.deadline) {
		return c.real().Err()
	}
	return nil
}

// Value returns the parent's value for key. The context package keeps its
// own state under keys of type *int (context.Cause and derived contexts
// look it up): for those the made context answers, as WithDeadline's would.
func (c *runContext) Value(key any) any {
	if m := c.made.Load(); m != nil {
		return m.ctx.Value(key)
	}
	if _, ok := key.(*int); ok {
		return c.real().Value(key)
	}
	return c.parent.Value(key)
}

// String describes the context for debugging, as the context package's
// own contexts do.
func (c *runContext) String() string {
	return "idemkey route deadline " + c.deadline.String()
}
