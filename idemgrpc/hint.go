package idemgrpc

import (
	"errors"
	"sync"
	"time"

	"github.com/idemkey/idemkey/internal/retryhint"
	"github.com/idemkey/idemkey/store"
)

// runTimes is the method's running estimate of how long a first run takes,
// which feeds the RetryInfo of an in-flight answer by the rule of
// package middleware's Retry-After (internal/retryhint).
func (s *Server) runTimes(method string) *retryhint.RunTimes {
	if t, ok := s.runs.Load(method); ok {
		return t.(*retryhint.RunTimes)
	}
	t, _ := s.runs.LoadOrStore(method, new(retryhint.RunTimes))
	return t.(*retryhint.RunTimes)
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
