package idemgrpc

import (
	"context"
	"errors"
	"time"

	"github.com/idemkey/idemkey/store"
)

// A call's claim on a store.Extender is kept alive while its handler runs
// by the Server's heartbeat.Beats (internal/heartbeat), extended every
// third of its life: these are what the beats ask of it.

// Extension names the claim for its extensions.
func (c *call) Extension() (skey, token string, ttl time.Duration) {
	return c.skey, c.claim.Token, c.claim.TTL
}

// Detached is the context an extension runs under.
func (c *call) Detached() (context.Context, context.CancelFunc) { return c.detached() }

// Failed reports a failed extension, from the beats' goroutine.
func (c *call) Failed(err error, lat time.Duration) {
	ev := Event{Kind: EventStoreError, StoreLatency: lat, Err: err}
	if errors.Is(err, store.ErrNotOwner) {
		ev.Kind = EventOwnershipLost
	}
	c.emit(ev)
}
