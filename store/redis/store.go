package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
)

// The scripts that change a key. Each touches KEYS[1] alone and runs with
// EVALSHA, falling back to EVAL when the server does not have it cached (a
// restart, a failover, a new cluster node), so nothing is loaded ahead.
var (
	//go:embed claim.lua
	claimSource string
	//go:embed complete.lua
	completeSource string
	//go:embed release.lua
	releaseSource string
	//go:embed extend.lua
	extendSource string

	claimScript    = goredis.NewScript(claimSource)
	completeScript = goredis.NewScript(completeSource)
	releaseScript  = goredis.NewScript(releaseSource)
	extendScript   = goredis.NewScript(extendSource)
)

// ErrNotReplicated reports that fewer replicas than WithWaitReplicas asks
// for acknowledged a claim in time. Claim returns it wrapped together with
// store.ErrUnavailable, after releasing the claim.
var ErrNotReplicated = errors.New("idemkey: redis: claim not acknowledged by enough replicas")

// Store keeps claims and records in Redis, one string key per idempotency
// key. It is safe for concurrent use. The client belongs to the caller, who
// closes it; Store has no Close.
type Store struct {
	client      goredis.UniversalClient
	timeout     time.Duration
	ctxTimeouts bool // go-redis stops socket reads at the context's deadline
	wait        int
	waitTimeout time.Duration
	evictWarn   bool
}

var (
	_ store.Store    = (*Store)(nil)
	_ store.Extender = (*Store)(nil)
)

// New returns a Store on client: a *redis.Client (standalone, or from
// NewFailoverClient for Sentinel), a *redis.ClusterClient, or any other
// UniversalClient, such as an instrumentation wrapper. See the package
// documentation for the client options to use. It returns an error naming
// every problem it finds: a nil client, each invalid or nil option, and
// WithWaitReplicas with a client that cannot pin a connection.
func New(client goredis.UniversalClient, opts ...Option) (*Store, error) {
	cfg, err := newConfig(opts)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	if client == nil {
		errs = append(errs, errors.New("idemkey: redis: nil client"))
	} else if cfg.waitReplicas > 0 && !canPin(client) {
		errs = append(errs, fmt.Errorf("idemkey: redis: WithWaitReplicas needs a client that can pin a connection (Conn or MasterForKey), not %T", client))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	ctxTimeouts := contextTimeouts(client)
	if cfg.ctxTimeouts != nil {
		ctxTimeouts = *cfg.ctxTimeouts
	}
	return &Store{
		client:      client,
		timeout:     cfg.callTimeout,
		ctxTimeouts: ctxTimeouts,
		wait:        cfg.waitReplicas,
		waitTimeout: cfg.waitTimeout,
		evictWarn:   cfg.evictionWarn,
	}, nil
}

// contextTimeouts reports whether client says it stops socket reads and
// writes at a context's deadline, through the Options method of the
// go-redis clients (which a wrapper that embeds one has too). A client
// that does not say is taken not to.
func contextTimeouts(client goredis.UniversalClient) bool {
	switch c := client.(type) {
	case clientOptions:
		return c.Options().ContextTimeoutEnabled
	case clusterOptions:
		return c.Options().ContextTimeoutEnabled
	case ringOptions:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// The go-redis clients' Options methods, which tell ContextTimeoutEnabled.
type (
	clientOptions  interface{ Options() *goredis.Options }
	clusterOptions interface {
		Options() *goredis.ClusterOptions
	}
	ringOptions interface{ Options() *goredis.RingOptions }
)

// Clients that can give a connection of their own to the master of a key.
type (
	connPinner interface{ Conn() *goredis.Conn }
	nodePinner interface {
		MasterForKey(ctx context.Context, key string) (*goredis.Client, error)
	}
)

func canPin(client goredis.UniversalClient) bool {
	switch client.(type) {
	case connPinner, nodePinner:
		return true
	}
	return false
}

// Claim claims key for c.Token with a life of c.TTL, or reports what holds
// it, in one round trip (two in the WithWaitReplicas mode, when the claim
// is made). Backend failures wrap store.ErrUnavailable; a value this
// version cannot read is ErrUnreadable. c.TTL is rounded up to whole
// milliseconds and must be positive; c.Token must be 1 to MaxTokenLen bytes.
func (s *Store) Claim(ctx context.Context, key string, c store.Claim) (store.Result, error) {
	if err := checkToken(c.Token); err != nil {
		return store.Result{}, err
	}
	ttl, err := millis("claim TTL", c.TTL)
	if err != nil {
		return store.Result{}, err
	}
	val := encodeInFlight(c.Token, c.Fingerprint, time.Now())
	var sc goredis.Scripter = s.client
	var conn *goredis.Conn
	if s.wait > 0 {
		if conn, err = s.pin(ctx, key); err != nil {
			return store.Result{}, unavailable("claim", err)
		}
		defer conn.Close()
		sc = conn
	}
	reply, err := s.run(ctx, s.timeout, sc, claimScript, key, val, 2+len(c.Token), ttl)
	if err != nil {
		return store.Result{}, unavailable("claim", err)
	}
	res, err := claimResult(reply, c)
	if err != nil {
		return store.Result{}, fmt.Errorf("idemkey: redis: claim: %w", err)
	}
	if conn != nil && (res.State == store.Claimed || res.State == store.Mine) {
		if err := s.waitReplicas(ctx, conn, key, c.Token); err != nil {
			return store.Result{}, err
		}
	}
	return res, nil
}

// claimResult reads the claim script's reply.
func claimResult(reply any, c store.Claim) (store.Result, error) {
	switch r := reply.(type) {
	case int64:
		switch r {
		case 1:
			return store.Result{State: store.Claimed, Fingerprint: c.Fingerprint}, nil
		case 2:
			return store.Result{State: store.Mine, Fingerprint: c.Fingerprint}, nil
		}
	case string:
		rec, _, err := decodeRecord(r)
		if err != nil {
			return store.Result{}, err
		}
		return store.Result{State: store.Completed, Fingerprint: rec.Fingerprint, Record: rec}, nil
	case []any:
		if len(r) != 2 {
			break
		}
		pttl, ok1 := r[0].(int64)
		v, ok2 := r[1].(string)
		if !ok1 || !ok2 {
			break
		}
		f, err := decodeInFlight(v)
		if err != nil {
			return store.Result{}, err
		}
		return store.Result{
			State:       store.InFlight,
			Fingerprint: f.fingerprint,
			TTL:         time.Duration(max(pttl, 0)) * time.Millisecond,
			ClaimedAt:   f.created,
		}, nil
	}
	return store.Result{}, fmt.Errorf("%w: claim reply %T %v", ErrUnreadable, reply, reply)
}

// Complete replaces the claim held by token with rec, kept for retention
// (rounded up to whole milliseconds; must be positive), in one round trip.
// The record keeps token, so that a Complete resent after a lost reply finds
// its own record and returns nil without writing. It returns
// store.ErrNotOwner when token neither holds the claim nor kept the record,
// and an error wrapping store.ErrUnavailable when the backend fails: then
// the record may or may not have been kept.
func (s *Store) Complete(ctx context.Context, key, token string, rec *store.Record, retention time.Duration) error {
	if err := checkToken(token); err != nil {
		return err
	}
	if rec == nil {
		return errors.New("idemkey: redis: complete: nil record")
	}
	ms, err := millis("retention", retention)
	if err != nil {
		return err
	}
	val, err := encodeRecord(rec, token)
	if err != nil {
		return err
	}
	reply, err := s.run(ctx, s.timeout, s.client, completeScript, key, ownerPrefix(token), val, ms)
	return ownerResult("complete", reply, err)
}

// Release deletes the claim held by token, in one round trip. It returns nil
// when the key holds nothing (a Release resent after a lost reply, or a
// claim that lapsed), store.ErrNotOwner when another token holds the key or
// it holds a record, and an error wrapping store.ErrUnavailable when the
// backend fails.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := checkToken(token); err != nil {
		return err
	}
	reply, err := s.run(ctx, s.timeout, s.client, releaseScript, key, ownerPrefix(token))
	return ownerResult("release", reply, err)
}

// Extend sets the remaining life of the claim held by token to ttl (rounded
// up to whole milliseconds; must be positive), in one round trip. It
// returns store.ErrNotOwner when token does not hold the claim, and an
// error wrapping store.ErrUnavailable when the backend fails.
func (s *Store) Extend(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := checkToken(token); err != nil {
		return err
	}
	ms, err := millis("claim TTL", ttl)
	if err != nil {
		return err
	}
	reply, err := s.run(ctx, s.timeout, s.client, extendScript, key, ownerPrefix(token), ms)
	return ownerResult("extend", reply, err)
}

func ownerResult(op string, reply any, err error) error {
	if err != nil {
		return unavailable(op, err)
	}
	switch reply {
	case int64(1):
		return nil
	case int64(0):
		return store.ErrNotOwner
	}
	return fmt.Errorf("idemkey: redis: %s: %w: reply %T %v", op, ErrUnreadable, reply, reply)
}

// unavailable wraps a backend failure so that errors.Is finds both
// store.ErrUnavailable and the cause.
func unavailable(op string, err error) error {
	return fmt.Errorf("idemkey: redis: %s: %w: %w", op, store.ErrUnavailable, err)
}

// millis returns d in whole milliseconds, rounded up.
func millis(what string, d time.Duration) (int64, error) {
	if d <= 0 {
		return 0, fmt.Errorf("idemkey: redis: %s %v, want > 0", what, d)
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond), nil
}

// run runs script on key within budget d.
func (s *Store) run(ctx context.Context, d time.Duration, sc goredis.Scripter, script *goredis.Script, key string, args ...any) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // send nothing for a caller who has gone
	}
	ctx = clock.budget(ctx, d)
	keys := []string{key}
	if s.ctxTimeouts {
		return script.Run(ctx, sc, keys, args...).Result()
	}
	return bounded(ctx, func(ctx context.Context) (any, error) {
		return script.Run(ctx, sc, keys, args...).Result()
	})
}

// bounded runs f and returns its answer, or ctx's error as soon as ctx is
// done, for clients that would otherwise block on a socket past the
// deadline. An abandoned f finishes in the background.
func bounded(ctx context.Context, f func(context.Context) (any, error)) (any, error) {
	type answer struct {
		v   any
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		v, err := f(ctx)
		ch <- answer{v, err}
	}()
	select {
	case a := <-ch:
		return a.v, a.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// pin returns a connection of its own to the master that holds key, so
// that WAIT follows the claim on the connection that wrote it.
func (s *Store) pin(ctx context.Context, key string) (*goredis.Conn, error) {
	switch c := s.client.(type) {
	case connPinner:
		return c.Conn(), nil
	case nodePinner:
		ctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		return node.Conn(), nil
	}
	return nil, fmt.Errorf("cannot pin a connection on %T", s.client)
}

// waitReplicas sends WAIT after a claim on conn and releases the claim
// when too few replicas acknowledge it.
func (s *Store) waitReplicas(ctx context.Context, conn *goredis.Conn, key, token string) error {
	wctx, cancel := context.WithTimeout(ctx, s.timeout+s.waitTimeout)
	defer cancel()
	wait := func(ctx context.Context) (any, error) {
		return conn.Wait(ctx, s.wait, s.waitTimeout).Result()
	}
	var v any
	var err error
	if s.ctxTimeouts {
		v, err = wait(wctx)
	} else {
		v, err = bounded(wctx, wait)
	}
	n, _ := v.(int64)
	if err == nil && n >= int64(s.wait) {
		return nil
	}
	if err == nil {
		err = fmt.Errorf("%w: %d of %d replicas within %v", ErrNotReplicated, n, s.wait, s.waitTimeout)
	}
	// The claim is not safe to act on: let the next request have the key.
	// Release through the pool, not conn, which may be broken. If the
	// release fails too, the claim lapses at the end of its life.
	if rerr := s.Release(context.WithoutCancel(ctx), key, token); rerr != nil && !errors.Is(rerr, store.ErrNotOwner) {
		err = errors.Join(err, rerr)
	}
	return unavailable("claim", err)
}
