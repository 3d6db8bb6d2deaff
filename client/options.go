package client

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/headername"
)

// The defaults New applies. Each option's doc comment says which it replaces.
const (
	// DefaultMaxAttempts is the most attempts one logical request makes,
	// the first included (409s with a Retry-After aside: see
	// DefaultInFlightWait).
	DefaultMaxAttempts = 4
	// DefaultBackoffBase is the ceiling of the first wait between attempts.
	DefaultBackoffBase = 100 * time.Millisecond
	// DefaultBackoffCap is the largest ceiling any wait between attempts
	// grows to.
	DefaultBackoffCap = 5 * time.Second
	// DefaultRetryAfterLimit is the longest Retry-After the transport waits
	// for.
	DefaultRetryAfterLimit = time.Minute
	// DefaultInFlightWait is how long the transport keeps retrying while
	// the server answers that the first request with the key is still
	// running: one minute, longer than the life of a claim under the
	// middleware's default deadline (30 s plus 5 s).
	DefaultInFlightWait = time.Minute
	// DefaultMaxRequestBody is how many bytes of a request body without
	// GetBody are held in memory so it can be sent again: 1 MiB.
	DefaultMaxRequestBody = 1 << 20
)

// An Option configures a Transport made by New. Options are applied in
// order, a later one overriding an earlier one of the same kind; New reports
// every invalid value, and every nil option, in one error and returns no
// Transport.
type Option func(*config) error

type config struct {
	base            http.RoundTripper
	header          string
	maxAttempts     int
	backoffBase     time.Duration
	backoffCap      time.Duration
	retryAfterLimit time.Duration
	inFlightWait    time.Duration
	newKey          func() string
	policy          RetryPolicy
	bodyLimit       int64
	autoKey         bool
}

func defaultConfig() config {
	return config{
		base:            http.DefaultTransport,
		header:          idemkey.Header,
		maxAttempts:     DefaultMaxAttempts,
		backoffBase:     DefaultBackoffBase,
		backoffCap:      DefaultBackoffCap,
		retryAfterLimit: DefaultRetryAfterLimit,
		inFlightWait:    DefaultInFlightWait,
		newKey:          uuid.NewString,
		policy:          DefaultRetryPolicy,
		bodyLimit:       DefaultMaxRequestBody,
		autoKey:         true,
	}
}

func errorf(format string, args ...any) error {
	return fmt.Errorf("idemkey: client: "+format, args...)
}

// WithBase sets the RoundTripper that makes each attempt. The default is
// http.DefaultTransport. A nil rt is an error.
//
// Timeouts of a single attempt belong to the base, for example
// http.Transport.ResponseHeaderTimeout: an attempt that times out there is a
// transport error and is retried like one, while the request's own context
// bounds the whole logical request.
//
// net/http's Transport resends on its own, after a kept-alive connection
// breaks, any request with an Idempotency-Key or X-Idempotency-Key header,
// whatever its value. A mutation the Transport (this package's) sends
// without a key, but with such a header (a blank key, another header's
// name), goes out without GetBody and, when the base is an
// *http.Transport, on a copy of it that keeps no connection alive, so that
// it reaches the server once. Another RoundTripper is trusted not to
// resend a bodiless request of that kind by itself.
func WithBase(rt http.RoundTripper) Option {
	return func(c *config) error {
		if rt == nil {
			return errors.New("WithBase(nil): the RoundTripper must not be nil")
		}
		c.base = rt
		return nil
	}
}

// WithHeader sets the name of the header that carries the key. The default
// is idemkey.Header, "Idempotency-Key". The name must be a valid header field
// name; it is canonicalised with http.CanonicalHeaderKey.
func WithHeader(name string) Option {
	return func(c *config) error {
		if !headername.Valid(name) {
			return fmt.Errorf("WithHeader(%q): not a valid header name", name)
		}
		c.header = http.CanonicalHeaderKey(name)
		return nil
	}
}

// WithMaxAttempts sets the most attempts one logical request makes, the first
// included, not counting those answered 409 with a Retry-After, which the
// in-flight wait bounds instead (see WithInFlightWait). The default is
// DefaultMaxAttempts, 4. 1 turns retries off, those included; less than 1
// is an error.
func WithMaxAttempts(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("WithMaxAttempts(%d): want at least 1", n)
		}
		c.maxAttempts = n
		return nil
	}
}

// WithBackoff sets the exponential backoff between attempts: the wait before
// attempt n+1 is a random duration between zero and min(cap, base × 2^(n-1)).
// The defaults are DefaultBackoffBase, 100ms, and DefaultBackoffCap, 5s. base
// must be positive and cap at least base.
func WithBackoff(base, cap time.Duration) Option {
	return func(c *config) error {
		if base <= 0 {
			return fmt.Errorf("WithBackoff(%v, %v): the base must be positive", base, cap)
		}
		if cap < base {
			return fmt.Errorf("WithBackoff(%v, %v): the cap must not be less than the base", base, cap)
		}
		c.backoffBase, c.backoffCap = base, cap
		return nil
	}
}

// WithRetryAfterLimit sets the longest Retry-After the transport waits for.
// A retryable response that asks for a longer wait goes back to the caller
// as it is. The default is DefaultRetryAfterLimit, one minute. Zero means
// any response with a positive Retry-After is returned without a retry;
// negative is an error. The request's context deadline bounds every wait
// regardless.
func WithRetryAfterLimit(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("WithRetryAfterLimit(%v): the limit must not be negative", d)
		}
		c.retryAfterLimit = d
		return nil
	}
}

// WithInFlightWait sets how long, from the first attempt, the transport
// keeps retrying a request whose attempts are answered 409 with a
// Retry-After: the server saying that the first request with the key is
// still running. Such answers do not count against the attempts of
// WithMaxAttempts; the retries stop when the answer is something else,
// when this time is up, or at the context's deadline. A Retry-After that
// would end past this time is cut short for one last attempt. The default
// is DefaultInFlightWait, one minute, which covers the life of a claim
// under the idemkey middleware's default deadline (30 s, plus 5 s): the
// time during which the claim of a request whose server died answers 409.
// Zero makes such answers count against the attempts like any other;
// negative is an error.
func WithInFlightWait(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("WithInFlightWait(%v): the wait must not be negative", d)
		}
		c.inFlightWait = d
		return nil
	}
}

// WithKeyGenerator sets the function that makes a fresh key for a mutation
// the caller did not key. The default is uuid.NewString (a random version 4
// UUID). It must be safe for concurrent use and return keys that
// idemkey.ValidKey accepts; any other key fails the request with an error
// wrapping idemkey.ErrKeyInvalid before anything is sent. A nil fn is an error.
func WithKeyGenerator(fn func() string) Option {
	return func(c *config) error {
		if fn == nil {
			return errors.New("WithKeyGenerator(nil): the function must not be nil")
		}
		c.newKey = fn
		return nil
	}
}

// WithoutAutoKey turns the automatic keys off: a POST, PUT, PATCH or DELETE
// gets a key only when the caller asked for one, with a header, WithKey, or
// WithCallName while serving a keyed request. A mutation without a key is
// sent once and never retried. Use it for services that do not honour the
// key header. By default automatic keys are on.
func WithoutAutoKey() Option {
	return func(c *config) error {
		c.autoKey = false
		return nil
	}
}

// WithRetryPolicy replaces the decision whether a finished attempt is
// retried. The default is DefaultRetryPolicy. The policy is consulted only
// when a retry is possible at all: never for a mutation without a key, never
// once the request's context is done, the attempts are used up or the body
// cannot be sent again. It may read the response's status and headers but
// must not read or close its body. A nil p is an error.
func WithRetryPolicy(p RetryPolicy) Option {
	return func(c *config) error {
		if p == nil {
			return errors.New("WithRetryPolicy(nil): the policy must not be nil")
		}
		c.policy = p
		return nil
	}
}

// WithMaxRequestBody sets how many bytes of a request body without GetBody
// the transport holds in memory so that it can send the body again. A longer
// body is streamed once and the request is not retried. Bodies with GetBody
// (those made by http.NewRequest from a bytes.Buffer, bytes.Reader or
// strings.Reader) are never buffered. The default is
// DefaultMaxRequestBody, 1 MiB. Zero means never buffer; negative is an
// error.
func WithMaxRequestBody(n int64) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("WithMaxRequestBody(%d): the limit must not be negative", n)
		}
		c.bodyLimit = n
		return nil
	}
}
