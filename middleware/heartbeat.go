package middleware

import (
	"context"
	"errors"
	"time"

	"github.com/idemkey/idemkey/store"
)

// A plain claim is kept alive while its handler runs by the Middleware's
// heartbeat.Beats (internal/heartbeat): these are what the beats ask of it.

// Extension names the claim for its extensions.
func (c *claimTx) Extension() (skey, token string, ttl time.Duration) {
	return c.skey, c.token, c.ttl
}

// Detached is the context an extension runs under.
func (c *claimTx) Detached() (context.Context, context.CancelFunc) { return c.m.detached(c.r) }

// Failed reports a failed extension, from the beats' goroutine.
func (c *claimTx) Failed(err error, lat time.Duration) {
	ev := Event{Kind: EventStoreError, KeyDigest: c.digest, StoreLatency: lat, Err: err}
	if errors.Is(err, store.ErrNotOwner) {
		ev.Kind = EventOwnershipLost
	}
	c.m.emit(c.r, ev)
}
