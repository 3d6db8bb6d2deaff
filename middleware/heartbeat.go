package middleware

import (
	"errors"
	"sync"
	"time"

	"github.com/idemkey/idemkey/store"
)

// beats holds the claims a Middleware keeps alive while their handlers run:
// each is extended every third of its life, by a scan every beatScan that
// runs on one timer while any claim is held, and not at all otherwise.
// Holding a claim costs a map insert, not a timer or a goroutine.
type beats struct {
	mu      sync.Mutex
	due     map[*claimTx]time.Time // when each claim's next extension is due
	scan    *time.Timer            // made on first use; armed while due is not empty
	running bool
}

// beatScan is how often due extensions are looked for. A claim lives at
// least ClaimMargin (5 s), so a third of it plus beatScan still falls well
// inside its life.
const beatScan = time.Second

// hold starts keeping c's claim, made at start, alive.
func (b *beats) hold(m *Middleware, c *claimTx, start time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.due == nil {
		b.due = make(map[*claimTx]time.Time)
	}
	b.due[c] = start.Add(c.ttl / 3)
	switch {
	case b.running:
	case b.scan == nil:
		b.scan = time.AfterFunc(beatScan, func() { b.run(m) })
		b.running = true
	default:
		b.scan.Reset(beatScan)
		b.running = true
	}
}

// drop stops keeping c's claim alive: it was kept, released, or (when
// keeping failed) is left to lapse. An extension under way is ignored. It
// may be called more than once.
func (b *beats) drop(c *claimTx) {
	b.mu.Lock()
	delete(b.due, c)
	if len(b.due) == 0 && b.running {
		b.running = false
		b.scan.Stop()
	}
	b.mu.Unlock()
}

// run extends the claims that are due, and arms the next scan.
func (b *beats) run(m *Middleware) {
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
		// Not due again until this extension has answered.
		b.due[c] = now.Add(c.ttl)
		go b.extend(m, c)
	}
	b.scan.Reset(beatScan)
}

// extend lengthens c's claim to its whole life again. Its events are
// reported from the scanner's goroutines.
func (b *beats) extend(m *Middleware, c *claimTx) {
	ctx, cancel := m.detached(c.r)
	t := time.Now()
	err := m.ext.Extend(ctx, c.skey, c.token, c.ttl)
	cancel()
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.due[c]; !ok {
		// The claim was settled meanwhile: whatever Extend found says
		// nothing about the key.
		return
	}
	ev := Event{KeyDigest: c.digest, StoreLatency: time.Since(t), Err: err}
	switch {
	case errors.Is(err, store.ErrNotOwner):
		delete(b.due, c)
		ev.Kind = EventOwnershipLost
		m.emit(c.r, ev)
	case err != nil:
		// Try again soon: the claim has a third of its life left at least.
		b.due[c] = time.Now()
		ev.Kind = EventStoreError
		m.emit(c.r, ev)
	default:
		b.due[c] = time.Now().Add(c.ttl / 3)
	}
}
