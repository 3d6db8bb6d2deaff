package redis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unsafe"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
)

// Store keeps claims and records in Redis, one string key per idempotency
// key. It is safe for concurrent use. The client belongs to the caller, who
// closes it; Store has no Close.
type Store struct {
	client       goredis.UniversalClient
	ap           *goredis.AutoPipeliner // WithAutoPipeline: the client's shared, deferred face
	now          func() time.Time       // stamps claims; tests move it with the server's clock
	timeout      time.Duration
	startTimeout time.Duration // WithStartTimeout
	ctxTimeouts  bool          // go-redis stops socket reads at the context's deadline
	wait         int
	waitTimeout  time.Duration
	evictWarn    bool
	clock        *slotClock // the shared deadlines of this Store's calls
	prefix       string     // WithKeyPrefix
	scanCount    int64      // WithScan
	scanSample   int64
	hub          *hub       // the wake channel's subscription, for Wait
	dials        *dialWatch // the client's dials, for ErrUnreachable
}

var (
	_ store.Store    = (*Store)(nil)
	_ store.Extender = (*Store)(nil)
	_ store.Waiter   = (*Store)(nil)
)

// New is NewContext with context.Background(): its questions to the
// server are bounded by WithStartTimeout (default DefaultStartTimeout).
func New(client goredis.UniversalClient, opts ...Option) (*Store, error) {
	return NewContext(context.Background(), client, opts...)
}

// NewContext returns a Store on client: a *redis.Client (standalone, or
// from NewFailoverClient for Sentinel), a *redis.ClusterClient, or any
// other UniversalClient, such as an instrumentation wrapper. See the
// package documentation for the client options to use.
//
// It returns an error naming every problem it finds in its arguments: a
// nil client, each invalid or nil option, and WithWaitReplicas with a
// client that cannot pin a connection. Then it asks the server (every
// master of a cluster) whether the client's user may run every command the
// store will send, by running each on a probe key of its own (see Check;
// the probe deletes its key when done, and touches no other key), and refuses a user that may not with an error wrapping
// ErrPermission that names the command: a user that may claim but not
// keep would run every request's handler and keep nothing, so that each
// retry runs it again. A server older than Redis 7.0 is refused with
// ErrServerVersion. A server that cannot be reached is refused too, with
// an error that names it and wraps store.ErrUnavailable
// (store.ErrUnreachable when no connection could be made): the store
// cannot start without knowing what its user may do. A server out of
// memory cannot take the probe's writes: NewContext then logs at Warn
// level (log/slog's default logger) that the commands were not checked,
// and returns the Store.
//
// The questions run under ctx, bounded by WithStartTimeout (default
// DefaultStartTimeout) when ctx has no deadline, and each round trip by
// the call budget (WithCallTimeout). NewContext does not read the server's
// settings (eviction policy, persistence): Check does.
func NewContext(ctx context.Context, client goredis.UniversalClient, opts ...Option) (*Store, error) {
	st, err := build(client, opts)
	if err != nil {
		return nil, err
	}
	st.dials = watchDials(client)
	if err := st.start(ctx); err != nil {
		return nil, err
	}
	return st, nil
}

// build is NewContext without its questions to the server.
func build(client goredis.UniversalClient, opts []Option) (*Store, error) {
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
	st := &Store{
		client:       client,
		ap:           ap,
		now:          time.Now,
		timeout:      cfg.callTimeout,
		startTimeout: cfg.startTimeout,
		ctxTimeouts:  ctxTimeouts,
		wait:         cfg.waitReplicas,
		waitTimeout:  cfg.waitTimeout,
		evictWarn:    cfg.evictionWarn,
		clock:        newSlotClock(),
		prefix:       cfg.keyPrefix,
		scanCount:    cfg.scanCount,
		scanSample:   cfg.scanSample,
	}
	st.hub = newHub(client, cfg.keyPrefix+wakeChannel, cfg.callTimeout)
	return st, nil
}

// Claim claims key for c.Token with a life of c.TTL, or reports what holds
// it, in one round trip (two in the WithWaitReplicas mode, when the claim
// is made): SET key claim PX ttl NX GET, which answers nil when it claimed
// the key and otherwise the value that holds it (read as the protocol's
// bytes, see sendClaim). Backend failures wrap
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
	v, free, err := s.sendClaim(bctx, conn, key, val, ttl)
	if err != nil && goredis.HasErrorPrefix(err, "OOM") {
		get := goredis.NewStringCmd(bctx, "get", key)
		if gerr := s.exec(bctx, conn, get); gerr == nil {
			v, err = get.Val(), nil // the key holds a value: answer from it
		}
	}
	var res store.Result
	switch {
	case err != nil:
		return store.Result{}, unavailable("claim", err)
	case free:
		res = store.Result{State: store.Claimed, Fingerprint: c.Fingerprint}
	default:
		if res, err = s.held(bctx, conn, key, v, c.Token, now); err != nil {
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

// sendClaim sends the claim, SET key val PX ttl NX GET, and returns the
// value that held key, or free when the claim took it.
//
// A won claim answers nil, which go-redis reports as the error redis.Nil;
// and go-redis puts every error a command answers through its retry
// classifier, which costs a won claim some 20 allocations and 3 µs. So
// the claim goes as a RawCmd, whose reply go-redis hands over as the bytes
// of the protocol: nil, a bulk string (the value that holds the key), or
// an error reply, which go-redis did not see as one and so neither
// followed (MOVED, ASK) nor retried (LOADING, READONLY, TRYAGAIN). A SET
// that answers an error has not run: it is sent again, once, as go-redis's
// own StringCmd, which does all that and reports the error. A claim go-redis
// resends after a lost reply (either kind) finds the caller's token and
// answers Mine, as before.
func (s *Store) sendClaim(ctx context.Context, conn *goredis.Conn, key string, val []byte, ttl int64) (v string, free bool, err error) {
	raw := goredis.NewRawCmd(ctx, "set", key, val, "px", ttl, "nx", "get")
	if err := s.exec(ctx, conn, raw); err != nil {
		return "", false, err
	}
	if v, free, ok := bulkReply(raw.Val()); ok {
		return v, free, nil
	}
	cmd := goredis.NewStringCmd(ctx, "set", key, val, "px", ttl, "nx", "get")
	switch err := s.exec(ctx, conn, cmd); err {
	case nil:
		return cmd.Val(), false, nil
	case goredis.Nil:
		return "", true, nil
	default:
		return "", false, err
	}
}

// bulkReply reads a reply in the protocol's bytes (RESP2 or RESP3) that is
// nil (free) or a bulk string (v). It reports false for any other reply.
//
// v is read in place, without a copy: r is the reply of a RawCmd this
// store made for one claim, whose bytes go-redis hands over and nothing
// writes once it has (neither go-redis, which reads the next reply into
// another command, nor this store), so that a string over them never
// changes, as Go's strings must not. A record decoded from v keeps its
// header's names and values as parts of it.
func bulkReply(r []byte) (v string, free, ok bool) {
	switch {
	case len(r) == 3 && r[0] == '_': // RESP3 null
		return "", true, true
	case len(r) < 5 || r[0] != '$':
		return "", false, false
	case r[1] == '-': // RESP2 null bulk string, $-1
		return "", true, true
	}
	i := bytes.IndexByte(r, '\r')
	if i < 2 {
		return "", false, false
	}
	n, err := strconv.Atoi(string(r[1:i]))
	if err != nil || n < 0 || len(r) != i+2+n+2 {
		return "", false, false
	}
	if n == 0 {
		return "", false, true
	}
	return unsafe.String(&r[i+2], n), false, true
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
	reply, err := s.run(ctx, completeScript, s.name(key), ownerPrefix(token), val, ms, s.hub.arg)
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
	reply, err := s.run(ctx, releaseScript, name, ownerPrefix(token), s.hub.arg)
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

// millis returns d in whole milliseconds, rounded up.
func millis(what string, d time.Duration) (int64, error) {
	if d <= 0 {
		return 0, fmt.Errorf("idemkey: redis: %s %v, want > 0", what, d)
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond), nil
}
