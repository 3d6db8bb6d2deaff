package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
)

// wakeChannel is the pub/sub channel, behind the store's key prefix, on
// which the complete and release scripts publish the name of each key
// they kept or released while a repeat waited on it (mark.lua), and the
// delete script each key it deleted.
const wakeChannel = "idem:v1:settled"

// The subscription's timing: how long it may be quiet before it is asked
// for a PONG (and, quiet as long again, taken as dead and replaced), how
// long it stays subscribed with no waiter, and the pauses between attempts
// to subscribe again after a failure.
const (
	hubPing     = 3 * time.Second
	hubLinger   = time.Minute
	hubRetryMin = 50 * time.Millisecond
	hubRetryMax = time.Second
)

// lapseMargin is how long after a claim's expiry (on the claimer's clock)
// its waiters wake to claim again: lapsed claims publish nothing. The
// server started the claim's life when the claim reached it, a little
// after the claimer stamped it: a waiter woken too soon finds it still
// there, and polls.
const lapseMargin = 20 * time.Millisecond

// wakeRecheck bounds one Wait: a message that never comes (an instance of
// an earlier version, whose scripts publish nothing; a user who may
// subscribe but not publish; a message the cluster bus lost) costs the
// waiter at most this long before it claims again, as polling would.
const wakeRecheck = time.Second

// Wait implements store.Waiter: it returns true when the claim in flight
// for c's request on key has been kept or released, on any instance, or
// when its life has ended, or when ctx is done; the caller then claims
// again. It is woken by a message the complete, release and delete
// scripts publish when a waiter marked the claim, over one subscription
// the Store shares among all its waiters, and costs one script (mark.lua)
// after subscribing, which sees that the key is still in flight and marks
// it. It returns false at once (the caller then polls) when the
// subscription is down, or could not be made within the call budget, and
// when the claim has outlived the expiry it carries.
func (s *Store) Wait(ctx context.Context, key string, c store.Claim) (bool, error) {
	if ctx.Err() != nil {
		return true, nil
	}
	name := s.name(key)
	e, ok := s.hub.add(ctx, name)
	if !ok {
		return ctx.Err() != nil, nil
	}
	defer s.hub.remove(name, e)
	if ctx.Err() != nil {
		return true, nil // ended while the subscription was made
	}
	// Registered before the key is read: a publish after the read wakes e.
	life, err := s.inFlightLife(ctx, name, c)
	switch {
	case err != nil:
		if ctx.Err() != nil {
			return true, nil
		}
		return false, err
	case life == 0:
		return true, nil // settled already
	case life < 0:
		return false, nil // past its own expiry: poll it
	}
	t := time.NewTimer(min(life+lapseMargin, wakeRecheck))
	defer t.Stop()
	select {
	case <-e.ch:
	case <-ctx.Done():
	case <-t.C:
	}
	return true, nil
}

// inFlightLife reads name, marking a claim in flight there as waited for
// (mark.lua), so that its keep or release publishes on the wake channel,
// and returns the remaining life of the claim in flight there for c's
// request: 0 when the key holds no such claim (it
// was kept or released, or is held for another request now), and a
// negative duration when the claim has outlived the expiry it carries (an
// Extend whose expiry write was refused, or a claim held for the
// retention after its record was refused).
func (s *Store) inFlightLife(ctx context.Context, name string, c store.Claim) (time.Duration, error) {
	reply, err := s.run(ctx, markScript, name)
	if err == goredis.Nil {
		return 0, nil
	}
	if err != nil {
		return 0, unavailable("wait", err)
	}
	v, ok := reply.(string)
	if !ok {
		return 0, fmt.Errorf("idemkey: redis: wait: %w: reply %T", ErrUnreadable, reply)
	}
	if len(v) > 0 && v[0]%16 == kindRecord {
		return 0, nil
	}
	f, err := decodeInFlight(v)
	if err != nil {
		return 0, fmt.Errorf("idemkey: redis: wait: %w", err)
	}
	if f.token == c.Token || f.fingerprint != c.Fingerprint {
		return 0, nil
	}
	if f.expires.IsZero() {
		// A version 1 claim does not carry its expiry: ask the server.
		bctx := s.clock.budget(ctx, s.timeout)
		pttl := goredis.NewIntCmd(bctx, "pttl", name)
		if err := s.exec(bctx, nil, pttl); err != nil {
			return 0, unavailable("wait", err)
		}
		if pttl.Val() == -2 {
			return 0, nil // gone since the GET
		}
		if pttl.Val() < 0 {
			return -1, nil
		}
		return time.Duration(pttl.Val()) * time.Millisecond, nil
	}
	life := f.expires.Sub(s.now())
	if life <= 0 {
		return -1, nil
	}
	return life, nil
}

// hub is a Store's one subscription to its wake channel, fanned out to the
// waiters of each key. It subscribes on the first Wait, resubscribes after
// the connection fails (go-redis reconnects it), and ends after hubLinger
// with no waiter. Waiters register only while it is subscribed; every
// resubscription wakes them all, since messages published while it was
// down are lost.
type hub struct {
	client  goredis.UniversalClient
	channel string
	arg     any           // channel, as the scripts' argument (boxed once)
	budget  time.Duration // how long a Wait waits for the first subscription
	// off: the client cannot hold the subscription (a Ring subscribes on
	// one shard, and panics when it finds none up), so Wait answers false
	// and the middleware polls.
	off bool

	mu      sync.Mutex
	running bool          // the subscription's goroutine runs
	state   hubState      // starting, up (subscribed) or down
	ready   chan struct{} // closed when state leaves hubStarting
	keys    map[string]*waitEntry
	waiters int       // registered, over all keys
	idle    time.Time // when waiters last fell to 0
}

type hubState uint8

const (
	hubStarting hubState = iota // no attempt to subscribe has ended yet
	hubUp                       // subscribed
	hubDown                     // the last attempt failed; retrying
)

// waitEntry is the waiters of one key: ch is closed to wake them.
type waitEntry struct {
	ch chan struct{}
	n  int
}

func newHub(client goredis.UniversalClient, channel string, budget time.Duration) *hub {
	_, ring := client.(*goredis.Ring)
	return &hub{client: client, channel: channel, arg: channel, budget: budget, off: ring,
		ready: make(chan struct{}), keys: make(map[string]*waitEntry)}
}

// add registers a waiter on name once the hub is subscribed, starting the
// subscription if it is not running. It reports false when the hub is not
// subscribed and cannot be within the budget (or ctx).
func (h *hub) add(ctx context.Context, name string) (*waitEntry, bool) {
	if h.off {
		return nil, false
	}
	var timeout <-chan time.Time
	for {
		h.mu.Lock()
		if !h.running {
			h.running, h.idle = true, time.Now()
			go h.run()
		}
		switch h.state {
		case hubUp:
			e := h.keys[name]
			if e == nil {
				e = &waitEntry{ch: make(chan struct{})}
				h.keys[name] = e
			}
			e.n++
			h.waiters++
			h.mu.Unlock()
			return e, true
		case hubDown:
			h.mu.Unlock()
			return nil, false
		}
		ready := h.ready
		h.mu.Unlock()
		if timeout == nil {
			t := time.NewTimer(h.budget)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, false
		case <-timeout:
			return nil, false
		}
	}
}

// remove unregisters a waiter that add returned e for.
func (h *hub) remove(name string, e *waitEntry) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.keys[name] == e {
		if e.n--; e.n == 0 {
			delete(h.keys, name)
		}
	}
	if h.waiters--; h.waiters == 0 {
		h.idle = time.Now()
	}
}

// wake wakes the waiters of name.
func (h *hub) wake(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e := h.keys[name]; e != nil {
		close(e.ch)
		delete(h.keys, name)
	}
}

// setState moves the hub to st, and returns the state it left. Reaching
// hubUp wakes every waiter, who may have missed a message while the hub
// was down.
func (h *hub) setState(st hubState) (was hubState) {
	h.mu.Lock()
	defer h.mu.Unlock()
	was = h.state
	if st == hubUp {
		h.wakeAll()
	}
	if h.state == hubStarting && st != hubStarting {
		close(h.ready)
	}
	h.state = st
	return was
}

// refused marks a hub that is not subscribed down, after the server
// refused its SUBSCRIBE: Waits then answer false at once, and the
// subscription is tried again when the connection is made again (the next
// Wait after the hub ended).
func (h *hub) refused() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state == hubStarting {
		close(h.ready)
	}
	if h.state != hubUp {
		h.state = hubDown
	}
}

// stop reports whether the goroutine is to end: when no waiter is
// registered and none has been for hubLinger. The next Wait starts it
// again.
func (h *hub) stop() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiters > 0 || time.Since(h.idle) < hubLinger {
		return false
	}
	h.running = false
	if h.state != hubStarting {
		h.state, h.ready = hubStarting, make(chan struct{})
	}
	// Empty now: a new map gives back what a burst of waiters grew.
	h.keys = make(map[string]*waitEntry)
	return true
}

// closed ends the hub for good: its client is closed. The waiters wake
// (nothing can wake them any more), and every later Wait answers false
// at once, so that the caller polls (and fails on the closed client).
func (h *hub) closed() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wakeAll()
	if h.state == hubStarting {
		close(h.ready)
	}
	h.state = hubDown // and running stays true: nothing restarts it
}

// wakeAll wakes every waiter, whatever its key: each claims again to see
// where its key stands. h.mu is held.
func (h *hub) wakeAll() {
	for name, e := range h.keys {
		close(e.ch)
		delete(h.keys, name)
	}
}

// run holds the subscription until stop ends it.
func (h *hub) run() {
	ctx := context.Background()
	ps := h.client.Subscribe(ctx, h.channel)
	defer func() { ps.Close() }()
	quiet := 0 // pings unanswered in a row
	pause := hubRetryMin
	checked := time.Now() // when stop was last asked, while messages flow
	for {
		msg, err := ps.ReceiveTimeout(ctx, hubPing)
		if err != nil {
			var ne net.Error
			var re goredis.Error
			switch {
			case errors.As(err, &re):
				// The server refused a command on a live connection: the
				// SUBSCRIBE (a user without the channel's permission)
				// when not yet subscribed, else a PING.
				quiet = 0
				h.refused()
			case errors.Is(err, goredis.ErrClosed):
				h.closed()
				return
			case errors.As(err, &ne) && ne.Timeout():
				if h.stop() {
					return
				}
				if quiet++; quiet < 2 {
					ps.Ping(ctx)
					continue
				}
				// Quiet through a ping: the connection is dead without
				// having said so. Subscribe on a new one.
				ps.Close()
				ps = h.client.Subscribe(ctx, h.channel)
				quiet = 0
				h.setState(hubDown)
			default:
				// The connection failed, or the subscription met what it
				// cannot go on from: subscribe on a new connection. The
				// first attempt goes at once (a restarted server is often
				// back already, and waiters registered meanwhile wake only
				// when it succeeds); the next ones back off.
				ps.Close()
				ps = h.client.Subscribe(ctx, h.channel)
				if h.setState(hubDown) == hubUp {
					pause = hubRetryMin
					continue
				}
				if h.stop() {
					return
				}
				time.Sleep(pause)
				pause = min(2*pause, hubRetryMax)
			}
			continue
		}
		quiet = 0
		switch m := msg.(type) {
		case *goredis.Message:
			h.wake(m.Payload)
			// Every waited-for keep and release of the fleet comes
			// here (and every one of instances of an earlier release):
			// with messages flowing the receive never times out, so ask
			// stop as often as a quiet hub would.
			if time.Since(checked) >= hubPing {
				checked = time.Now()
				if h.stop() {
					return
				}
			}
		case *goredis.Subscription:
			if m.Kind == "subscribe" {
				h.setState(hubUp)
			}
		}
	}
}
