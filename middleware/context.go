package middleware

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/keyctx"
)

// handlerCtx is the context a claimed request's handler runs under: the
// request's, bounded by the route's deadline from the claim, and carrying
// the request's key (idemkey.FromContext), in one allocation.
//
// The bound is made only when something needs it: a timer and a child of
// the request's context cost a handler that never asks for Done (most do
// not, unless they wait on I/O) four allocations and the timer's start and
// stop. Until then the context answers from the request's context and the
// clock, as the bounded context would: Deadline is the route's deadline;
// Err is nil while the request's context is live, the deadline is ahead
// and the handler has not returned. The first call to Done, or any call
// once that no longer holds, makes the bounded context
// (context.WithDeadline of the request's), and from then on every call is
// answered by it, so that Done, Err, Value and context.Cause agree with
// one another as for any context the standard library makes. When the
// handler returns with the bound not made, end makes it if the request's
// context has ended or the deadline has passed (so that it reports which),
// and otherwise makes, the first time it is asked for, a context cancelled
// with context.Canceled, as the bound cancelled at that moment would be.
// One difference remains: when both the request's context ended and the
// deadline passed before anything looked, Err reports the request's
// context's error, whichever came first.
//
// It holds nothing else of the request, so that a context a handler hands
// on to work that outlives the request keeps no more alive than before.
type handlerCtx struct {
	parent   context.Context
	key      idemkey.Key
	hasKey   bool
	deadline time.Time

	made   atomic.Bool // bounded and cancel are set
	ended  atomic.Bool // the handler returned
	mu     sync.Mutex  // makes the bounded context once
	bound  context.Context
	cancel context.CancelFunc
}

// newHandlerCtx returns the context the attempt's handler runs under, and
// the handlerCtx to end when the handler returns (nil: none). A request whose
// context already ends by the route's deadline keeps its own deadline (and
// its cancellation): no bounded context is ever made for it, and it is
// cancelled when net/http cancels the request's, once the middleware has
// returned.
func (a *attempt) newHandlerCtx() (context.Context, *handlerCtx) {
	parent := a.r.Context()
	deadline := a.start.Add(a.h.route.Deadline)
	if d, ok := parent.Deadline(); ok && !d.After(deadline) {
		if a.skey == "" {
			return parent, nil
		}
		return &keyctx.Carrier[idemkey.Key]{Context: parent, Key: a.key}, nil
	}
	c := &handlerCtx{parent: parent, key: a.key, hasKey: a.skey != "", deadline: deadline}
	return c, c
}

func (c *handlerCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *handlerCtx) Done() <-chan struct{} { return c.bounded().Done() }

func (c *handlerCtx) Err() error {
	if c.made.Load() || c.over() {
		return c.bounded().Err()
	}
	return nil
}

func (c *handlerCtx) Value(k any) any {
	if c.hasKey && k == (keyctx.Key{}) {
		return &c.key
	}
	// The request's context's end needs no check here: until the bound is
	// made, what the parent answers (context.Cause among it) is what the
	// bound would answer.
	if c.made.Load() || c.ended.Load() || !time.Now().Before(c.deadline) {
		return c.bounded().Value(k)
	}
	return c.parent.Value(k)
}

// over reports whether the bounded context, were it made now, would be
// done.
func (c *handlerCtx) over() bool {
	return c.ended.Load() || c.parent.Err() != nil || !time.Now().Before(c.deadline)
}

// bounded returns the bounded context, made the first time.
func (c *handlerCtx) bounded() context.Context {
	if c.made.Load() {
		return c.bound
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.made.Load() {
		if c.ended.Load() {
			// Cancelled when the handler returned, with nothing else over
			// then (see end): what the request's context did after does
			// not reach it.
			c.bound, c.cancel = context.WithCancel(context.WithoutCancel(c.parent))
			c.cancel()
		} else {
			c.bound, c.cancel = context.WithDeadline(c.parent, c.deadline)
		}
		c.made.Store(true)
	}
	return c.bound
}

// end cancels the context: the handler has returned. It does nothing to
// a nil c.
func (c *handlerCtx) end() {
	if c == nil {
		return
	}
	if !c.made.Load() && (c.parent.Err() != nil || !time.Now().Before(c.deadline)) {
		// Over before it ended: the bound says how.
		c.bounded()
	}
	c.mu.Lock()
	c.ended.Store(true)
	made := c.made.Load()
	c.mu.Unlock()
	if made {
		c.cancel()
	}
}
