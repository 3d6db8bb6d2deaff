package idemgrpc

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/option"
	"github.com/idemkey/idemkey/internal/outkey"
)

// Client defaults. Each option's doc comment says which one it replaces.
const (
	DefaultMaxAttempts = 4
	DefaultBackoffBase = 100 * time.Millisecond
	DefaultBackoffCap  = 2 * time.Second
)

// Client is the unary client interceptor: it gives each logical call one
// key and sends it on every attempt, and retries keyed calls that failed
// in a way a retry can mend. Build it with NewClient; it is safe for
// concurrent use.
type Client struct {
	cfg clientConfig
}

type clientConfig struct {
	maxAttempts    int
	base, max      time.Duration
	attemptTimeout time.Duration
	retryable      func(*status.Status) bool
	covers         func(fullMethod string) bool
	newKey         func() string
	fields         *keyFields
}

// A ClientOption configures a Client, with the policy of Option: applied
// in order, every invalid value and nil option reported by NewClient.
type ClientOption func(*clientConfig) error

// WithMaxAttempts sets how many attempts a keyed logical call makes at
// most, the first included. Default: DefaultMaxAttempts (4). 1 turns the
// interceptor's own retries off (keys are still sent, so grpc-go's
// service-config retries stay safe).
func WithMaxAttempts(n int) ClientOption {
	return func(c *clientConfig) error {
		if n < 1 {
			return fmt.Errorf("WithMaxAttempts(%d): at least 1", n)
		}
		c.maxAttempts = n
		return nil
	}
}

// WithBackoff sets the exponential backoff between attempts: full jitter
// over base doubled after each attempt, capped at limit. A RetryInfo detail
// in the answer replaces it for that wait. Default: DefaultBackoffBase
// (100 ms) and DefaultBackoffCap (2 s).
func WithBackoff(base, limit time.Duration) ClientOption {
	return func(c *clientConfig) error {
		if base <= 0 || limit < base {
			return fmt.Errorf("WithBackoff(%v, %v): want 0 < base <= limit", base, limit)
		}
		c.base, c.max = base, limit
		return nil
	}
}

// WithAttemptTimeout bounds each attempt by d, within the call's own
// deadline: an attempt whose reply never comes (a connection that went
// quiet) is given up and retried with the same key. Default: 0, each
// attempt bounded by the call's deadline alone.
func WithAttemptTimeout(d time.Duration) ClientOption {
	return func(c *clientConfig) error {
		if d < 0 {
			return fmt.Errorf("WithAttemptTimeout(%v): must not be negative", d)
		}
		c.attemptTimeout = d
		return nil
	}
}

// WithRetryable sets which answers of a keyed call are retried. Default:
// DefaultRetryable.
func WithRetryable(f func(*status.Status) bool) ClientOption {
	return func(c *clientConfig) error {
		if f == nil {
			return errors.New("WithRetryable(nil): the function must not be nil")
		}
		c.retryable = f
		return nil
	}
}

// WithClientMethods sets which methods get a key of their own when the
// caller gave none (a new random one per logical call, or one derived from
// the key of the call being served). Default: every method. Calls to
// other methods get a key only from WithKey or their own metadata, and
// without one are never retried by the interceptor.
func WithClientMethods(f func(fullMethod string) bool) ClientOption {
	return func(c *clientConfig) error {
		if f == nil {
			return errors.New("WithClientMethods(nil): the function must not be nil")
		}
		c.covers = f
		return nil
	}
}

// WithKeyGenerator sets how a new key is made. Default: crypto/rand.Text,
// 26 characters of base32 (130 random bits).
func WithKeyGenerator(f func() string) ClientOption {
	return func(c *clientConfig) error {
		if f == nil {
			return errors.New("WithKeyGenerator(nil): the function must not be nil")
		}
		c.newKey = f
		return nil
	}
}

// DefaultRetryable retries UNAVAILABLE (the connection failed or the
// server's store was down: nothing ran, or the key makes a rerun safe),
// ABORTED (an idemkey server's "in flight", waited out by its RetryInfo,
// or a conflict the handler reported and released) and RESOURCE_EXHAUSTED
// when it carries a RetryInfo. It never retries anything else: a kept
// answer of the first run is replayed the same however often it is asked.
func DefaultRetryable(st *status.Status) bool {
	switch st.Code() {
	case codes.Unavailable, codes.Aborted:
		return true
	case codes.ResourceExhausted:
		_, ok := retryDelay(st)
		return ok
	}
	return false
}

// NewClient returns the client interceptor configured by opts.
func NewClient(opts ...ClientOption) (*Client, error) {
	c := clientConfig{}
	if err := option.Apply("idemkey: idemgrpc", &c, opts); err != nil {
		return nil, err
	}
	if c.maxAttempts == 0 {
		c.maxAttempts = DefaultMaxAttempts
	}
	if c.base == 0 {
		c.base, c.max = DefaultBackoffBase, DefaultBackoffCap
	}
	if c.retryable == nil {
		c.retryable = DefaultRetryable
	}
	if c.covers == nil {
		c.covers = func(string) bool { return true }
	}
	if c.newKey == nil {
		c.newKey = rand.Text
	}
	c.fields = newKeyFields(DefaultKeyFields)
	return &Client{cfg: c}, nil
}

// WithKey returns a copy of ctx whose calls send key, on every attempt,
// whatever the method. Metadata the caller set itself wins over it. An
// invalid key (not 1 to 255 printable ASCII characters) fails the call
// with an error wrapping idemkey.ErrKeyInvalid, and nothing is sent. An
// empty key is the same as none. It is client.WithKey: a key given with
// either is sent on HTTP requests (through client.Transport) and gRPC
// calls made with ctx alike.
func WithKey(ctx context.Context, key string) context.Context {
	return outkey.WithKey(ctx, key)
}

// WithCallName returns a copy of ctx that names the calls made with it.
// While serving a call or request that carries an incoming key
// (idemkey.FromContext), they send the key derived from it with this
// name, idemkey.Key.Derive(name): the same on every retry of the incoming
// call, different for different names. Without a name, the derivation
// uses "grpc " and the full method name, so two calls to one method in
// one handler need names of their own. Without an incoming key the name
// has no effect. It is client.WithCallName: one name given with either
// names the HTTP request or the gRPC call made with ctx alike.
func WithCallName(ctx context.Context, name string) context.Context {
	return outkey.WithCallName(ctx, name)
}

// UnaryClientInterceptor returns the interceptor, for
// grpc.WithUnaryInterceptor or grpc.WithChainUnaryInterceptor. The key goes
// into the outgoing metadata once per logical call, so grpc-go's own
// retries (a service config's retryPolicy, transparent retries) resend the
// same key too.
func (c *Client) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return c.intercept
}

func (c *Client) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	key, set, err := c.keyOf(ctx, method, req)
	if err != nil {
		return err
	}
	if set {
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, key)
	}
	if key == "" {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	for attempt := 1; ; attempt++ {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if c.cfg.attemptTimeout > 0 {
			actx, cancel = context.WithTimeout(ctx, c.cfg.attemptTimeout)
		}
		err := invoker(actx, method, req, reply, cc, opts...)
		attemptTimedOut := actx.Err() != nil && ctx.Err() == nil
		cancel()
		if err == nil || attempt >= c.cfg.maxAttempts || ctx.Err() != nil {
			return err
		}
		st := status.Convert(err)
		if !(attemptTimedOut || c.cfg.retryable(st)) {
			return err
		}
		wait, ok := retryDelay(st)
		if !ok {
			wait = c.backoff(attempt)
		}
		if d, ok := ctx.Deadline(); ok && time.Until(d) < wait {
			// The wait would outlast the call: the answer stands.
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// keyOf picks the key of a logical call: the caller's own metadata entry
// (sent as it is), the request message's key field (it travels in the
// message), WithKey's, one derived from the incoming call's key, or a new
// one. set reports whether the interceptor must add it to the metadata.
func (c *Client) keyOf(ctx context.Context, method string, req any) (key string, set bool, err error) {
	if md, ok := metadata.FromOutgoingContext(ctx); ok {
		if vs := md.Get(MetadataKey); len(vs) > 0 {
			return vs[0], false, nil
		}
	}
	if k, _ := c.cfg.fields.read(req); k != "" {
		return k, false, nil
	}
	if k, err := outkey.Asked(ctx); err != nil || k != "" {
		if err != nil {
			return "", false, fmt.Errorf("idemkey: idemgrpc: %w", err)
		}
		return k, true, nil
	}
	if !c.cfg.covers(method) {
		return "", false, nil
	}
	if in, hasIn := idemkey.FromContext(ctx); hasIn {
		return in.Derive("grpc " + method), true, nil
	}
	k := c.cfg.newKey()
	if !idemkey.ValidKey(k) {
		return "", false, fmt.Errorf("idemkey: idemgrpc: key from the key generator: %w", idemkey.ErrKeyInvalid)
	}
	return k, true, nil
}

// backoff is the wait after the attempt-th attempt: full jitter over
// base·2^(attempt-1), capped.
func (c *Client) backoff(attempt int) time.Duration {
	d := c.cfg.base << min(attempt-1, 20)
	if d <= 0 || d > c.cfg.max {
		d = c.cfg.max
	}
	return time.Duration(mrand.Int64N(int64(d)) + 1)
}

// retryDelay returns the wait a RetryInfo detail of st asks for.
func retryDelay(st *status.Status) (time.Duration, bool) {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return max(ri.GetRetryDelay().AsDuration(), 0), true
		}
	}
	return 0, false
}
