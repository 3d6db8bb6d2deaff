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

// The scripts that change a key after its claim. Each touches KEYS[1] alone
// and runs with EVALSHA, falling back to EVAL when the server does not have
// it cached (a restart, a failover, a new cluster node), so nothing is
// loaded ahead. The claim itself is a plain SET ... NX GET.
var (
	//go:embed complete.lua
	completeSource string
	//go:embed release.lua
	releaseSource string
	//go:embed extend.lua
	extendSource string

	completeScript = newScript(completeSource)
	releaseScript  = newScript(releaseSource)
	extendScript   = newScript(extendSource)
)

// script is a Lua script and its SHA-1, as EVALSHA names it.
type script struct{ src, sha string }

func newScript(src string) script { return script{src: src, sha: goredis.NewScript(src).Hash()} }

// ErrNotReplicated reports that fewer replicas than WithWaitReplicas asks
// for acknowledged a claim in time. Claim returns it wrapped together with
// store.ErrUnavailable, after releasing the claim.
var ErrNotReplicated = errors.New("idemkey: redis: claim not acknowledged by enough replicas")

// Store keeps claims and records in Redis, one string key per idempotency
// key. It is safe for concurrent use. The client belongs to the caller, who
// closes it; Store has no Close.
type Store struct {
	client      goredis.UniversalClient
	ap          *goredis.AutoPipeliner // WithAutoPipeline: the client's shared, deferred face
	now         func() time.Time       // stamps claims; tests move it with the server's clock
	timeout     time.Duration
	ctxTimeouts bool // go-redis stops socket reads at the context's deadline
	wait        int
	waitTimeout time.Duration
	evictWarn   bool
	clock       *slotClock // the shared deadlines of this Store's calls
	prefix      string     // WithKeyPrefix
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
	var ap *goredis.AutoPipeliner
	if client != nil && cfg.autoPipeline {
		if ap, err = client.AsyncAutoPipeline(); err != nil {
			errs = append(errs, fmt.Errorf("idemkey: redis: WithAutoPipeline: the client cannot pipeline automatically: %w", err))
		}
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
		ap:          ap,
		now:         time.Now,
		timeout:     cfg.callTimeout,
		ctxTimeouts: ctxTimeouts,
		wait:        cfg.waitReplicas,
		waitTimeout: cfg.waitTimeout,
		evictWarn:   cfg.evictionWarn,
		clock:       newSlotClock(),
		prefix:      cfg.keyPrefix,
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
// is made): SET key claim PX ttl NX GET, which answers nil when it claimed
// the key and otherwise the value that holds it. Backend failures wrap
// store.ErrUnavailable; a value this version cannot read is ErrUnreadable.
// c.TTL is rounded up to whole milliseconds and must be positive; c.Token
// must be 1 to MaxTokenLen bytes.
//
// A server out of memory (maxmemory under noeviction) refuses every SET,
// one that would not write included: Claim then reads the key with GET, so
// that a key which holds a record or a claim is still answered, and a free
// key gets the OOM error.
func (s *Store) Claim(ctx context.Context, key string, c store.Claim) (store.Result, error) {
	if err := checkToken(c.Token); err != nil {
		return store.Result{}, err
	}
	ttl, err := millis("claim TTL", c.TTL)
	if err != nil {
		return store.Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.Result{}, unavailable("claim", err) // send nothing for a caller who has gone
	}
	key = s.name(key)
	var conn *goredis.Conn
	if s.wait > 0 {
		if conn, err = s.pin(ctx, key); err != nil {
			return store.Result{}, unavailable("claim", err)
		}
		defer conn.Close()
	}
	now := s.now()
	val := encodeInFlight(c.Token, c.Fingerprint, now, now.Add(time.Duration(ttl)*time.Millisecond))
	bctx := s.clock.budget(ctx, s.timeout)
	cmd := goredis.NewStringCmd(bctx, "set", key, val, "px", ttl, "nx", "get")
	err = s.exec(bctx, conn, cmd)
	if err != nil && err != goredis.Nil && goredis.HasErrorPrefix(err, "OOM") {
		get := goredis.NewStringCmd(bctx, "get", key)
		if gerr := s.exec(bctx, conn, get); gerr == nil {
			cmd, err = get, nil // the key holds a value: answer from it
		}
	}
	var res store.Result
	switch {
	case err == goredis.Nil:
		res = store.Result{State: store.Claimed, Fingerprint: c.Fingerprint}
	case err != nil:
		return store.Result{}, unavailable("claim", err)
	default:
		if res, err = s.held(bctx, conn, key, cmd.Val(), c.Token, now); err != nil {
			return store.Result{}, fmt.Errorf("idemkey: redis: claim: %w", err)
		}
	}
	if conn != nil && (res.State == store.Claimed || res.State == store.Mine) {
		if err := s.waitReplicas(ctx, conn, key, c.Token); err != nil {
			return store.Result{}, err
		}
	}
	return res, nil
}

// held reads the value a claim found on key: a record, the caller's own
// claim (a claim resent after its reply was lost finds what it wrote), or
// another request's claim. now is the caller's clock when it claimed.
func (s *Store) held(ctx context.Context, conn *goredis.Conn, key, v, token string, now time.Time) (store.Result, error) {
	if len(v) > 0 && v[0]%16 == kindRecord {
		rec, _, err := decodeRecord(v)
		if err != nil {
			return store.Result{}, err
		}
		return store.Result{State: store.Completed, Fingerprint: rec.Fingerprint, Record: rec}, nil
	}
	f, err := decodeInFlight(v)
	if err != nil {
		return store.Result{}, err
	}
	if f.token == token {
		return store.Result{State: store.Mine, Fingerprint: f.fingerprint}, nil
	}
	res := store.Result{State: store.InFlight, Fingerprint: f.fingerprint, ClaimedAt: f.created}
	if f.expires.IsZero() {
		// A version 1 claim does not carry its expiry: ask the server.
		cmd := goredis.NewIntCmd(ctx, "pttl", key)
		if err := s.exec(ctx, conn, cmd); err != nil {
			return store.Result{}, unavailable("claim", err)
		}
		res.TTL = time.Duration(max(cmd.Val(), 1)) * time.Millisecond
		return res, nil
	}
	// The claim's life as the claimer's clock sees it, in whole
	// milliseconds as PTTL would say: at least one (the key is there), at
	// most its whole life.
	ttl := (f.expires.Sub(now) + time.Millisecond - 1).Truncate(time.Millisecond)
	res.TTL = min(max(ttl, time.Millisecond), f.expires.Sub(f.created))
	return res, nil
}

// Complete replaces the claim held by token with rec, kept for retention
// (rounded up to whole milliseconds; must be positive), in one round trip.
// The record keeps token, so that a Complete resent after a lost reply finds
// its own record and returns nil without writing. It returns
// store.ErrNotOwner when token neither holds the claim nor kept the record,
// and an error wrapping store.ErrUnavailable when the backend fails: then
// the record may or may not have been kept. When Redis refuses the record
// for want of memory (maxmemory under noeviction) the claim is held for
// the retention instead, so that repeats answer 409 rather than run the
// request again, and the error says so.
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
	reply, err := s.run(ctx, completeScript, s.name(key), ownerPrefix(token), val, ms)
	if err == nil && reply == int64(2) {
		return unavailable("complete", errHeldInstead)
	}
	return ownerResult("complete", reply, err)
}

// errHeldInstead is the cause Complete reports when Redis refused the
// record and the claim was held for the retention in its place.
var errHeldInstead = errors.New("the server refused to store the record (out of memory?); the claim is held for the retention instead, so repeats answer 409 and never run again")

// Release deletes the claim held by token, in one round trip. It returns nil
// when the key holds nothing (a Release resent after a lost reply, or a
// claim that lapsed), store.ErrNotOwner when another token holds the key or
// it holds a record, and an error wrapping store.ErrUnavailable when the
// backend fails.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := checkToken(token); err != nil {
		return err
	}
	return s.release(ctx, s.name(key), token)
}

// release is Release of the Redis key name.
func (s *Store) release(ctx context.Context, name, token string) error {
	reply, err := s.run(ctx, releaseScript, name, ownerPrefix(token))
	return ownerResult("release", reply, err)
}

// name returns the Redis key of a store key: the key behind the prefix of
// WithKeyPrefix.
func (s *Store) name(key string) string {
	if s.prefix == "" {
		return key
	}
	return s.prefix + key
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
	expires := appendTime(nil, s.now().Add(time.Duration(ms)*time.Millisecond))
	reply, err := s.run(ctx, extendScript, s.name(key), ownerPrefix(token), ms, expires)
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

// processor sends a command: the client, or a connection pinned for WAIT.
type processor interface {
	Process(ctx context.Context, cmd goredis.Cmder) error
}

// run runs sc on key with args, within the call budget: EVALSHA, and EVAL
// when the server does not have the script cached.
func (s *Store) run(ctx context.Context, sc script, key string, args ...any) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // send nothing for a caller who has gone
	}
	ctx = s.clock.budget(ctx, s.timeout)
	cmd := evalCmd(ctx, "evalsha", sc.sha, key, args)
	err := s.exec(ctx, nil, cmd)
	if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd = evalCmd(ctx, "eval", sc.src, key, args)
		err = s.exec(ctx, nil, cmd)
	}
	if err != nil {
		return nil, err
	}
	return cmd.Val(), nil
}

// evalCmd returns the command that runs a script (name is "eval" or
// "evalsha") on key, which go-redis routes by key in a cluster.
func evalCmd(ctx context.Context, name, script, key string, args []any) *goredis.Cmd {
	a := make([]any, 0, 4+len(args))
	a = append(a, name, script, 1, key)
	a = append(a, args...)
	cmd := goredis.NewCmd(ctx, a...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// exec sends cmd, through conn when it is not nil (a connection pinned for
// WAIT), and returns its error once it is answered or ctx (a call's
// budget) is done, whichever comes first. After an error of ctx, cmd may
// still be in flight: do not read it.
func (s *Store) exec(ctx context.Context, conn *goredis.Conn, cmd goredis.Cmder) error {
	var p processor = s.client
	switch {
	case conn != nil:
		p = conn
	case s.ap != nil:
		// The pipeliner runs the command on its own context: wait for it
		// no longer than the budget.
		return s.ap.Submit(ctx, cmd).WaitContext(ctx)
	}
	if s.ctxTimeouts {
		p.Process(ctx, cmd)
		return cmd.Err()
	}
	_, err := bounded(ctx, func(ctx context.Context) (any, error) {
		p.Process(ctx, cmd)
		return nil, cmd.Err()
	})
	return err
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
// when too few replicas acknowledge it. key is the Redis key name, the
// prefix of WithKeyPrefix included.
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
	if rerr := s.release(context.WithoutCancel(ctx), key, token); rerr != nil && !errors.Is(rerr, store.ErrNotOwner) {
		err = errors.Join(err, rerr)
	}
	return unavailable("claim", err)
}
