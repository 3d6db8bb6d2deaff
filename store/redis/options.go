package redis

import (
	"fmt"
	"time"

	"github.com/idemkey/idemkey/internal/option"
)

// DefaultCallTimeout is the time budget of one store call when
// WithCallTimeout is not given.
const DefaultCallTimeout = 300 * time.Millisecond

// The defaults of WithScan.
const (
	DefaultScanCount  = 1000
	DefaultScanSample = 10000
)

// Option configures a Store. New applies options in order (a later option
// overrides an earlier one of the same kind) and returns an error naming
// every invalid value and nil option; no option panics.
type Option func(*config) error

type config struct {
	callTimeout  time.Duration
	startTimeout time.Duration
	waitReplicas int
	waitTimeout  time.Duration
	evictionWarn bool
	// ctxTimeouts, when not nil, is what WithContextTimeouts said.
	ctxTimeouts  *bool
	autoPipeline bool
	keyPrefix    string
	scanCount    int64
	scanSample   int64
}

func newConfig(opts []Option) (config, error) {
	c := config{callTimeout: DefaultCallTimeout, startTimeout: DefaultStartTimeout, scanCount: DefaultScanCount, scanSample: DefaultScanSample}
	return c, option.Apply("idemkey: redis", &c, opts)
}

// WithCallTimeout sets the time budget of every store call (Claim, Complete,
// Release, Extend, and each step of Check): the call returns an error
// wrapping store.ErrUnavailable once d has passed (at most 5 ms later: the
// calls of a Store share one timer per 5 ms slot instead of one each),
// however many times go-redis retries and even when the server hangs. The
// caller's context applies instead when its deadline is sooner, so a
// caller that bounds a request's store calls with one deadline pays for no
// timer at all. A call does not start when its context is already done;
// once started, it ends at its answer or its budget. Default
// DefaultCallTimeout (300 ms); d must be positive.
//
// Set ContextTimeoutEnabled in the go-redis options: then go-redis itself
// stops at the deadline and closes the connection. Without it the store
// still returns on time, but the abandoned command keeps its connection
// until go-redis's own ReadTimeout, and may reach the server after the
// store reported it failed.
func WithCallTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("WithCallTimeout(%v): the budget must be positive", d)
		}
		c.callTimeout = d
		return nil
	}
}

// WithStartTimeout sets how long New and Check may take in all, when the
// context they are given has no deadline (New's has none): they then
// return an error naming the server and wrapping store.ErrUnavailable once
// d has passed. Each of their round trips is bounded by the call budget
// (WithCallTimeout) too. Default DefaultStartTimeout (5 s); d must be
// positive.
func WithStartTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("WithStartTimeout(%v): the budget must be positive", d)
		}
		c.startTimeout = d
		return nil
	}
}

// WithWaitReplicas turns on the durability mode: after a claim succeeds the
// store sends WAIT n timeout on the same connection, and when fewer than n
// replicas acknowledge the claim within timeout it releases the claim and
// Claim returns an error wrapping store.ErrUnavailable and ErrNotReplicated
// (the middleware answers 503 and the handler does not run). This keeps a
// failover from forgetting a claim whose handler is running, at the cost of
// a second round trip on each first run and of refusing every claim while
// fewer than n replicas are up. Off by default (n = 0: no WAIT).
//
// n must be at least 1 and timeout at least 1 ms (WAIT's 0, "forever", is
// not allowed). The WAIT has a budget of its own: the call budget plus
// timeout. WAIT counts the writes of one connection, so the claim and its
// WAIT run on a connection the store pins to the key's master: the mode
// needs a client that can pin one, which New checks. A *redis.Client
// (standalone or from NewFailoverClient) pins with Conn, a
// *redis.ClusterClient with MasterForKey; so does a wrapper that has either
// method, as one that embeds the client does.
//
// A claim answered Mine (resent after a lost reply) is waited for too, but
// the write happened on the connection that lost the reply, so that WAIT
// only shows that the replicas are connected and caught up with the pinned
// connection's earlier writes.
func WithWaitReplicas(n int, timeout time.Duration) Option {
	return func(c *config) error {
		if n < 1 || timeout < time.Millisecond {
			return fmt.Errorf("WithWaitReplicas(%d, %v): want at least 1 replica and a timeout of at least 1ms", n, timeout)
		}
		c.waitReplicas, c.waitTimeout = n, timeout
		return nil
	}
}

// WithEvictionWarning makes Check report a maxmemory-policy other than
// noeviction as a warning instead of an error: Check logs it at Warn level
// with log/slog's default logger, lists it in Report.Warnings and returns
// nil. Under such a policy Redis may evict claims, and an evicted claim
// lets a second request run the handler while the first still runs. By
// default Check returns an error wrapping ErrEvictionPolicy.
func WithEvictionWarning() Option {
	return func(c *config) error {
		c.evictionWarn = true
		return nil
	}
}

// WithContextTimeouts tells the store whether its client stops socket reads
// and writes at a context's deadline, as go-redis does when
// ContextTimeoutEnabled is set, for a client that New cannot ask.
//
// By default New asks the client: a client with an Options method that
// returns *redis.Options, *redis.ClusterOptions or *redis.RingOptions (the
// go-redis clients, and a wrapper that embeds one) reports its
// ContextTimeoutEnabled. Any other client (a wrapper that keeps the go-redis
// client in a field of its own) is taken not to stop at deadlines, and the
// store bounds each call itself: correct, but each call then costs a
// goroutine, and a command abandoned at the deadline may still reach the
// server (see the package documentation). Give WithContextTimeouts(true)
// for such a wrapper when the client under it has ContextTimeoutEnabled;
// WithContextTimeouts(false) makes the store bound calls itself whatever
// the client says.
func WithContextTimeouts(enabled bool) Option {
	return func(c *config) error {
		c.ctxTimeouts = &enabled
		return nil
	}
}

// WithAutoPipeline sends the store's commands through the client's
// automatic pipeliner (go-redis's AsyncAutoPipeline, which New asks the
// client for): the commands of concurrent requests go out together, in one
// write and one read per batch instead of one each, which saves both the
// service and Redis most of the system calls of a round trip. Off by
// default: see the package documentation ("Automatic pipelining") for what
// it costs and what changes. The client must support it (a *redis.Client,
// including a Sentinel failover client, or a *redis.ClusterClient; not a
// *redis.Ring), which New checks.
//
// go-redis marks automatic pipelining experimental: its API may change in a
// later go-redis release.
func WithAutoPipeline() Option {
	return func(c *config) error {
		c.autoPipeline = true
		return nil
	}
}

// MaxKeyPrefixLen is the longest prefix WithKeyPrefix accepts, in bytes.
const MaxKeyPrefixLen = 64

// WithKeyPrefix puts prefix in front of every Redis key the store reads or
// writes, so that services sharing one Redis database keep separate key
// spaces: with WithKeyPrefix("billing:") the key store.KeyName names
// "idem:v1:{<64 hex>}" is stored as "billing:idem:v1:{<64 hex>}". The
// prefix is used as it is: no separator is added, so end it with one
// (":"). Every command and script the store sends, and Check's probe, uses
// the prefixed name; give idemctl the same prefix (--redis-prefix) to find
// the keys, and an ACL user a pattern that covers it ("~billing:idem:*").
// Default "": keys are named as store.KeyName names them.
//
// A prefix is at most MaxKeyPrefixLen bytes of ASCII letters, digits and
// the characters ':', '.', '_', '-' and '/'. Braces are refused: the hash
// tag Redis Cluster places a key by must stay the one in the key's own
// name, "{<64 hex>}", so that a prefix never moves a key's slot. So are
// '*', '?', '[', ']' and '\', which SCAN and ACL key patterns would read
// as wildcards, spaces and control characters.
func WithKeyPrefix(prefix string) Option {
	return func(c *config) error {
		if err := ValidateKeyPrefix(prefix); err != nil {
			return fmt.Errorf("WithKeyPrefix(%q): %w", prefix, err)
		}
		c.keyPrefix = prefix
		return nil
	}
}

// ValidateKeyPrefix reports whether prefix is one WithKeyPrefix accepts,
// for tools that name the store's keys (idemctl's --redis-prefix). The
// empty prefix is valid.
func ValidateKeyPrefix(prefix string) error {
	if len(prefix) > MaxKeyPrefixLen {
		return fmt.Errorf("key prefix of %d bytes, want at most %d", len(prefix), MaxKeyPrefixLen)
	}
	for i := 0; i < len(prefix); i++ {
		switch b := prefix[i]; {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		case b == ':', b == '.', b == '_', b == '-', b == '/':
		case b == '{', b == '}':
			return fmt.Errorf("key prefix %q has a brace: it would change the Cluster hash tag of every key", prefix)
		default:
			return fmt.Errorf("key prefix %q has %q at byte %d: want ASCII letters, digits and \":._-/\"", prefix, b, i)
		}
	}
	return nil
}

// WithScan sets how Stats walks the keys: count is the COUNT each SCAN
// call asks for, and sample the most keys on each master whose memory it
// measures with MEMORY USAGE (0 measures none; when there are more keys,
// Stats estimates their memory from the mean). The store's requests never
// scan: this is for operators' tools. Default DefaultScanCount (1000) and
// DefaultScanSample (10000); count must be positive and sample not
// negative.
func WithScan(count, sample int64) Option {
	return func(c *config) error {
		if count <= 0 || sample < 0 {
			return fmt.Errorf("WithScan(%d, %d): the count must be positive and the sample not negative", count, sample)
		}
		c.scanCount, c.scanSample = count, sample
		return nil
	}
}
