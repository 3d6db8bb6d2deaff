// Package heartbeat keeps claims alive while their handlers run, on a
// store.Extender, for package middleware on HTTP and idemgrpc on gRPC:
// each claim is extended to its whole life again every third of it, so
// that a handler that runs past its claim's life (it ignores its context)
// does not lose its key to a retry.
package heartbeat

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idemkey/idemkey/store"
)

// A Claim is a claim held while its handler runs.
type Claim interface {
	// Extension names the claim: its store key, its token and its whole
	// life, to which each extension lengthens it.
	Extension() (skey, token string, ttl time.Duration)
	// Detached returns the context an extension runs under: the
	// request's values without its cancellation, with the store call's
	// budget.
	Detached() (context.Context, context.CancelFunc)
	// Failed reports an extension that failed while the claim was held,
	// with how long the store call took: err matches store.ErrNotOwner
	// when the claim was lost (it is not extended again), else the
	// extension is tried again soon. It is called from a goroutine of
	// the Beats, with the Beats' lock held: it must not call Hold or Drop.
	Failed(err error, latency time.Duration)
}

// Beats holds the claims kept alive: each is extended every third of its
// life, by a scan every Scan that runs on one timer while any claim is
// held, and not at all otherwise. Holding a claim costs a map insert, not
// a timer or a goroutine. Set Ext before the first Hold; the zero Beats
// holds nothing. It is safe for concurrent use.
type Beats struct {
	// Ext extends the claims.
	Ext store.Extender

	mu      sync.Mutex
	due     map[Claim]time.Time // when each claim's next extension is due
	scan    *time.Timer         // made on first use; armed while due is not empty
	running bool
}

// Scan is how often due extensions are looked for. A claim lives at least
// its claim margin (5 s), so a third of it plus Scan still falls well
// inside its life.
const Scan = time.Second

// Hold starts keeping c's claim, made at start, alive.
func (b *Beats) Hold(c Claim, start time.Time) {
	_, _, ttl := c.Extension()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.due == nil {
		b.due = make(map[Claim]time.Time)
	}
	b.due[c] = start.Add(ttl / 3)
	switch {
	case b.running:
	case b.scan == nil:
		b.scan = time.AfterFunc(Scan, b.run)
		b.running = true
	default:
		b.scan.Reset(Scan)
		b.running = true
	}
}

// Drop stops keeping c's claim alive: it was kept, released, or (when
// keeping failed) is left to lapse. An extension under way is ignored. It
// may be called more than once, and for a claim never held.
func (b *Beats) Drop(c Claim) {
	b.mu.Lock()
	delete(b.due, c)
	if len(b.due) == 0 && b.running {
		b.running = false
		b.scan.Stop()
	}
	b.mu.Unlock()
}

// run extends the claims that are due, and arms the next scan.
func (b *Beats) run() {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.running {
		return // stopped as it fired
	}
	for c, due := range b.due {
		if now.Before(due) {
			continue
		}
		_, _, ttl := c.Extension()
		// Not due again until this extension has answered.
		b.due[c] = now.Add(ttl)
		go b.extend(c)
	}
	b.scan.Reset(Scan)
}

// extend lengthens c's claim to its whole life again.
func (b *Beats) extend(c Claim) {
	skey, token, ttl := c.Extension()
	ctx, cancel := c.Detached()
	t := time.Now()
	err := b.Ext.Extend(ctx, skey, token, ttl)
	cancel()
	lat := time.Since(t)
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.due[c]; !ok {
		// The claim was settled meanwhile: whatever Extend found says
		// nothing about the key.
		return
	}
	switch {
	case errors.Is(err, store.ErrNotOwner):
		delete(b.due, c)
		c.Failed(err, lat)
	case err != nil:
		// Try again soon: the claim has a third of its life left at least.
		b.due[c] = time.Now()
		c.Failed(err, lat)
	default:
		b.due[c] = time.Now().Add(ttl / 3)
	}
}
