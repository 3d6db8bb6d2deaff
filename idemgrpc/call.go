package idemgrpc

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/keyctx"
	"github.com/idemkey/idemkey/internal/storecall"
	"github.com/idemkey/idemkey/store"
)

// call is one unary call through the interceptor: with a key, one attempt
// at the operation the key names.
type call struct {
	s       *Server
	method  string
	ctx     context.Context
	req     any
	handler grpc.UnaryHandler

	key      idemkey.Key
	skey     string
	digest   string
	deadline time.Duration // the handler's: the shorter of the call's and the method's
	claim    store.Claim
	start    time.Time // when the claim was made
}

func (c *call) emit(e Event) {
	e.Method = c.method
	if e.KeyDigest == "" {
		e.KeyDigest = c.digest
	}
	if len(c.s.cfg.observers) == 0 {
		warnDefault(c.ctx, e)
		return
	}
	for _, o := range c.s.cfg.observers {
		o(c.ctx, e)
	}
}

// budget adds WithStoreTimeout's bound to ctx, when one was set.
func (s *Server) budget(ctx context.Context) (context.Context, context.CancelFunc) {
	return storecall.Budget(ctx, s.cfg.StoreTimeout)
}

// detached returns a context for keeping or releasing: the call's values
// without its cancellation, so that a client that hangs up or a deadline
// that passes does not stop the record from being kept.
func (c *call) detached() (context.Context, context.CancelFunc) {
	return storecall.Detached(c.ctx, c.s.cfg.StoreTimeout)
}

var unavailable = refusal(codes.Unavailable, "idempotency store unavailable", ReasonStoreUnavailable, time.Second)

// decide claims the key and replays, refuses, or runs the handler.
func (c *call) decide() (any, error) {
	s := c.s
	ctx, cancel := s.budget(c.ctx)
	c.start = time.Now()
	var res store.Result
	var tx store.Tx
	var err error
	if s.tx != nil {
		res, tx, err = s.tx.ClaimTx(ctx, c.skey, c.claim)
	} else {
		res, err = s.store.Claim(ctx, c.skey, c.claim)
	}
	cancel()
	lat := time.Since(c.start)
	if err != nil {
		c.emit(Event{Kind: EventStoreError, StoreLatency: lat, Err: err})
		if !errors.Is(err, store.ErrFull) {
			// The claim may have landed before the failure: free it if
			// so. The handler never ran, so freeing it is always safe.
			c.releaseAbandoned()
		}
		return nil, unavailable
	}
	switch res.State {
	case store.Claimed, store.Mine:
		var own owner
		if s.tx != nil {
			if tx == nil {
				c.emit(Event{Kind: EventStoreError, StoreLatency: lat, Err: errors.New("idemkey: idemgrpc: transactional store claimed without a transaction")})
				c.releaseAbandoned()
				return nil, unavailable
			}
			own = txOwner{tx}
		} else {
			own = &claimOwner{s: s, skey: c.skey, token: c.claim.Token}
		}
		c.emit(Event{Kind: EventFirstAttempt, StoreLatency: lat})
		return c.run(own)
	case store.Completed:
		if res.Record == nil {
			c.emit(Event{Kind: EventStoreError, StoreLatency: lat, Err: errors.New("idemkey: idemgrpc: store answered completed without a record")})
			return nil, unavailable
		}
		if res.Record.Fingerprint != c.claim.Fingerprint {
			c.emit(Event{Kind: EventKeyReused, StoreLatency: lat})
			return nil, reused
		}
		return c.replay(res.Record, lat)
	case store.InFlight:
		if res.Fingerprint != c.claim.Fingerprint {
			c.emit(Event{Kind: EventKeyReused, StoreLatency: lat})
			return nil, reused
		}
		c.emit(Event{Kind: EventInFlight, StoreLatency: lat})
		return nil, refusal(codes.Aborted, "a call with this idempotency key is in flight: retry after the delay in RetryInfo",
			ReasonInFlight, time.Duration(c.s.runTimes(c.method).RetryAfter(res, c.deadline, time.Now()))*time.Second)
	}
	c.emit(Event{Kind: EventStoreError, StoreLatency: lat, Err: errors.New("idemkey: idemgrpc: store answered an unknown claim state")})
	return nil, unavailable
}

var reused = refusal(codes.FailedPrecondition, "idempotency key reused with a different request", ReasonKeyReused, 0)

// replay answers with a kept record.
func (c *call) replay(rec *store.Record, lat time.Duration) (any, error) {
	a, err := replayOf(rec)
	if errors.Is(err, errOmitted) {
		c.emit(Event{Kind: EventReplay, Code: codes.OK, StoreLatency: lat})
		c.sendMetadata(a)
		return nil, refusal(codes.FailedPrecondition, "the call with this idempotency key succeeded; its response was too large to keep", ReasonResponseOmitted, 0)
	}
	if err != nil {
		c.emit(Event{Kind: EventStoreError, StoreLatency: lat, Err: err})
		return nil, status.Error(codes.Internal, "kept answer cannot be replayed")
	}
	c.emit(Event{Kind: EventReplay, Code: a.st.Code(), StoreLatency: lat})
	c.sendMetadata(a)
	if a.st.Code() != codes.OK {
		return nil, a.st.Err()
	}
	return a.resp, nil
}

// sendMetadata sets a replay's kept header, with idempotent-replayed, and
// its kept trailer, on the call.
func (c *call) sendMetadata(a *answer) {
	h := metadata.Join(a.header, metadata.Pairs(MetadataReplayed, "true"))
	// Errors here mean the call has no stream to set them on (a direct
	// call in a test), or the header went out already: neither changes
	// the answer.
	_ = grpc.SetHeader(c.ctx, h)
	if len(a.trailer) > 0 {
		_ = grpc.SetTrailer(c.ctx, a.trailer)
	}
}

// An owner settles a claimed key: a store.Tx. A store.TxStore's claim
// hands one out, the handler's transaction; a plain store's claim is seen
// as one (claimOwner).
type owner interface {
	store.Tx
	// atomic reports whether the record commits with the handler's own
	// writes: a failed Commit then undid them, or may have, so the answer
	// must not go out.
	atomic() bool
}

type txOwner struct{ store.Tx }

func (txOwner) atomic() bool { return true }

// claimOwner is a plain store's claim seen as a transaction.
type claimOwner struct {
	s     *Server
	skey  string
	token string
}

func (o *claimOwner) NewContext(ctx context.Context) context.Context { return ctx }
func (o *claimOwner) Commit(ctx context.Context, rec *store.Record, retention time.Duration) error {
	return o.s.store.Complete(ctx, o.skey, o.token, rec, retention)
}
func (o *claimOwner) Rollback(ctx context.Context) error {
	return o.s.store.Release(ctx, o.skey, o.token)
}
func (o *claimOwner) atomic() bool { return false }

// run runs the handler as the key's owner, then keeps or releases.
func (c *call) run(own owner) (any, error) {
	s := c.s
	ctx, cancel := c.handlerContext()
	defer cancel()
	ctx = own.NewContext(&keyctx.Carrier[idemkey.Key]{Context: ctx, Key: c.key})
	cap := capture(ctx)
	if cap != nil {
		ctx = grpc.NewContextWithServerTransportStream(ctx, cap)
	}
	if s.ext != nil {
		s.beats.Hold(c, c.start)
		defer s.beats.Drop(c)
	}

	returned, ended := false, false
	defer func() {
		if !returned && !ended {
			// A panic (or runtime.Goexit): free the key so that a retry
			// runs again, and let the panic go on.
			c.release(own, codes.Unknown)
		}
	}()
	resp, herr := c.handler(ctx, c.req)
	returned = true
	s.runTimes(c.method).Add(time.Since(c.start))

	st, ok := status.FromError(herr)
	if !ok {
		st = status.FromContextError(herr)
	}
	if !s.cfg.keep(st.Code()) {
		ended = true
		c.release(own, st.Code())
		return resp, herr
	}
	a := &answer{resp: resp, st: st}
	if cap != nil {
		a.header, a.trailer = cap.metadata()
	}
	rec, err := record(a, s.cfg.keepMetadata, s.cfg.maxResponse)
	if err != nil {
		// Not a message this package can keep (another codec's): the
		// answer goes out, and the key is freed.
		ended = true
		c.release(own, st.Code())
		return resp, herr
	}
	ended = true
	if !c.keep(own, rec, st.Code()) && own.atomic() {
		// The transaction did not commit: the answer must not go out.
		return nil, unavailable
	}
	return resp, herr
}

// handlerContext returns the context the handler runs under: the call's,
// bounded by the handler's deadline from the claim. A call whose own
// deadline comes first keeps its context, which spares a child context.
func (c *call) handlerContext() (context.Context, context.CancelFunc) {
	deadline := c.start.Add(c.deadline)
	if d, ok := c.ctx.Deadline(); ok && !d.After(deadline) {
		return c.ctx, func() {}
	}
	return context.WithDeadline(c.ctx, deadline)
}

// keep keeps rec as the key's record, and reports whether it was kept.
func (c *call) keep(own owner, rec *store.Record, code codes.Code) bool {
	ctx, cancel := c.detached()
	defer cancel()
	t := time.Now()
	rec.Fingerprint = c.claim.Fingerprint
	rec.CreatedAt, rec.CompletedAt = c.start, t
	err := own.Commit(ctx, rec, c.s.cfg.Retention)
	ev := Event{Kind: EventKept, Code: code, StoreLatency: time.Since(t)}
	switch {
	case err == nil:
	case errors.Is(err, store.ErrNotOwner):
		ev.Kind, ev.Err = EventOwnershipLost, err
	default:
		ev.Kind, ev.Err = EventStoreError, err
	}
	c.emit(ev)
	return err == nil
}

// release frees the key (rolls the transaction back) so that a retry runs
// again.
func (c *call) release(own owner, code codes.Code) {
	ctx, cancel := c.detached()
	defer cancel()
	t := time.Now()
	err := own.Rollback(ctx)
	ev := Event{Kind: EventReleased, Code: code, StoreLatency: time.Since(t)}
	switch {
	case errors.Is(err, store.ErrNotOwner):
		ev.Kind, ev.Err = EventOwnershipLost, err
	case err != nil:
		ev.Kind, ev.Err = EventStoreError, err
	}
	c.emit(ev)
}

// runKeyless runs a call that carries no key, on a method where the key is
// optional: with no idempotency at all, but on a transactional store
// inside a transaction of its own, so that the handler's code is the same
// with a key and without one. Its writes commit before the answer goes
// out (no record is kept), and roll back on a code that is released or a
// panic.
func (c *call) runKeyless() (any, error) {
	s := c.s
	if s.tx == nil {
		return c.handler(c.ctx, c.req)
	}
	ctx, cancel := s.budget(c.ctx)
	t := time.Now()
	tx, err := s.tx.Begin(ctx)
	cancel()
	if err != nil {
		c.emit(Event{Kind: EventStoreError, StoreLatency: time.Since(t), Err: err})
		return nil, unavailable
	}
	ended := false
	defer func() {
		if !ended {
			rctx, cancel := c.detached()
			defer cancel()
			_ = tx.Rollback(rctx)
		}
	}()
	resp, herr := c.handler(tx.NewContext(c.ctx), c.req)
	ended = true
	st, ok := status.FromError(herr)
	if !ok {
		st = status.FromContextError(herr)
	}
	dctx, dcancel := c.detached()
	defer dcancel()
	if !s.cfg.keep(st.Code()) {
		if err := tx.Rollback(dctx); err != nil {
			c.emit(Event{Kind: EventStoreError, Err: err})
		}
		return resp, herr
	}
	if err := tx.Commit(dctx, &store.Record{Status: httpStatus(st.Code())}, s.cfg.Retention); err != nil {
		c.emit(Event{Kind: EventStoreError, Err: err})
		return nil, unavailable
	}
	return resp, herr
}

// releaseAbandoned frees, in the background, a claim whose reply was lost
// to a store failure, in case it landed. At most maxAbandoned run at once:
// during an outage the rest are left to lapse at the end of their life. A
// failure other than the store still being down is reported, from the
// releasing goroutine.
func (c *call) releaseAbandoned() {
	c.s.abandoned.Release(c.ctx, c.s.store, c.s.cfg.StoreTimeout, c.skey, c.claim.Token, func(err error, lat time.Duration) {
		c.emit(Event{Kind: EventStoreError, StoreLatency: lat, Err: err})
	})
}

// captureStream is the handler's grpc.ServerTransportStream: it passes
// every header and trailer the handler sets on to the call's stream, and
// keeps a copy for the record.
type captureStream struct {
	grpc.ServerTransportStream
	mu              sync.Mutex
	header, trailer metadata.MD
}

// capture returns a capturing stream over ctx's, or nil when ctx has none.
func capture(ctx context.Context) *captureStream {
	ts := grpc.ServerTransportStreamFromContext(ctx)
	if ts == nil {
		return nil
	}
	return &captureStream{ServerTransportStream: ts}
}

func (c *captureStream) SetHeader(md metadata.MD) error {
	if err := c.ServerTransportStream.SetHeader(md); err != nil {
		return err
	}
	c.mu.Lock()
	c.header = metadata.Join(c.header, md)
	c.mu.Unlock()
	return nil
}

func (c *captureStream) SendHeader(md metadata.MD) error {
	if err := c.ServerTransportStream.SendHeader(md); err != nil {
		return err
	}
	c.mu.Lock()
	c.header = metadata.Join(c.header, md)
	c.mu.Unlock()
	return nil
}

func (c *captureStream) SetTrailer(md metadata.MD) error {
	if err := c.ServerTransportStream.SetTrailer(md); err != nil {
		return err
	}
	c.mu.Lock()
	c.trailer = metadata.Join(c.trailer, md)
	c.mu.Unlock()
	return nil
}

func (c *captureStream) metadata() (header, trailer metadata.MD) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.header, c.trailer
}

var _ grpc.ServerTransportStream = (*captureStream)(nil)
