package middleware

import (
	"context"
	"net/http"
	"time"

	"github.com/idemkey/idemkey/store"
)

// An owner is how a request that owns its key settles it: a store.Tx. A
// store.TxStore's claim hands one out, the handler's transaction; for a
// plain store the claim itself is seen as one (claimTx), so the flow has
// one path whatever the store.
type owner interface {
	store.Tx
	// atomic reports whether the record commits with the handler's own
	// writes: a failed Commit then undid them (or may have), so the
	// response must not go out, and Commit is not tried again.
	atomic() bool
	// done is called once the handler has returned: the claim is settled,
	// or left to lapse, and no longer held.
	done()
}

// claim makes one claim of the key in the store: in a transaction when the
// store runs handlers in one. When the answer is Claimed or Mine it
// returns the key's owner.
func (m *Middleware) claim(ctx context.Context, a *attempt) (store.Result, owner, error) {
	if m.tx != nil {
		res, tx, err := m.tx.ClaimTx(ctx, a.skey, a.claim)
		if err != nil || tx == nil {
			return res, nil, err
		}
		return res, a.ownTx(tx), nil
	}
	res, err := m.store.Claim(ctx, a.skey, a.claim)
	if err != nil || (res.State != store.Claimed && res.State != store.Mine) {
		return res, nil, err
	}
	// The claim's transaction lives in the attempt: no allocation of its
	// own.
	a.plain = claimTx{m: m, r: a.r, skey: a.skey, digest: a.digest, token: a.claim.Token, ttl: a.claim.TTL}
	c := &a.plain
	if m.ext != nil {
		m.beats.hold(m, c, a.start)
	}
	return res, c, nil
}

// txOwner is a store.TxStore's transaction.
type txOwner struct{ store.Tx }

// ownTx makes tx the attempt's owner, kept in the attempt: no allocation
// of its own.
func (a *attempt) ownTx(tx store.Tx) owner {
	a.tx = txOwner{tx}
	return &a.tx
}

func (*txOwner) atomic() bool { return true }
func (*txOwner) done()        {}

// claimTx is a plain store's claim seen as a transaction: the handler's
// context is unchanged, Commit completes the claim with the record, and
// Rollback releases it. While the handler runs, an Extender's claim is
// extended (Middleware.beats) until it is settled or the handler returns.
type claimTx struct {
	m      *Middleware
	r      *http.Request // for events
	skey   string
	digest string
	token  string
	ttl    time.Duration
}

func (c *claimTx) NewContext(ctx context.Context) context.Context { return ctx }

func (c *claimTx) Commit(ctx context.Context, rec *store.Record, retention time.Duration) error {
	err := c.m.store.Complete(ctx, c.skey, c.token, rec, retention)
	if err == nil || isNotOwner(err) {
		// Kept, or not ours to keep: either way, no longer held. A failed
		// keep holds the claim until the handler returns (it is tried
		// again then), and is left to lapse after.
		c.done()
	}
	return err
}

func (c *claimTx) Rollback(ctx context.Context) error {
	c.done()
	return c.m.store.Release(ctx, c.skey, c.token)
}

func (c *claimTx) atomic() bool { return false }

func (c *claimTx) done() {
	if c.m.ext != nil {
		c.m.beats.drop(c)
	}
}
