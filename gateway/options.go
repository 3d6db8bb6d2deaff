package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/headername"
)

// The defaults New applies. Each option's doc comment says which it replaces.
const (
	// DefaultMaxAttempts is the most attempts one request makes, the first
	// included. Each upstream gets at most one of them, so a gateway over
	// fewer upstreams makes fewer.
	DefaultMaxAttempts = 3
	// DefaultCoolOff is how long an upstream whose attempt failed is passed
	// over while others are healthy.
	DefaultCoolOff = 10 * time.Second
	// DefaultMaxRequestBody is how many bytes of a request body are held in
	// memory so it can be sent to another upstream: 1 MiB, the middleware's
	// own default limit.
	DefaultMaxRequestBody = 1 << 20
	// DefaultMaxIdleConnsPerHost is the idle connections the default
	// transport keeps to each upstream.
	DefaultMaxIdleConnsPerHost = 64
)

// An Option configures a Gateway made by New. Options are applied in order,
// a later one overriding an earlier one of the same kind; New reports every
// invalid value, and every nil option, in one error and returns no Gateway.
type Option func(*config) error

type config struct {
	transport   *http.Transport
	maxAttempts int
	coolOff     time.Duration
	bodyLimit   int64
	header      string
	honoured    func(*http.Request) bool
	observer    func(Failure)
}

func defaultConfig() config {
	return config{
		maxAttempts: DefaultMaxAttempts,
		coolOff:     DefaultCoolOff,
		bodyLimit:   DefaultMaxRequestBody,
		header:      idemkey.Header,
		honoured:    mutation,
	}
}

// defaultTransport is http.DefaultTransport's settings without a proxy from
// the environment (a gateway talks to its own upstreams) and with more idle
// connections per upstream.
func defaultTransport() *http.Transport {
	var t *http.Transport
	if d, ok := http.DefaultTransport.(*http.Transport); ok {
		t = d.Clone()
	} else {
		t = &http.Transport{}
	}
	t.Proxy = nil
	t.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
	return t
}

func mutation(r *http.Request) bool { return idemkey.Mutation(r.Method) }

// WithTransport sets the http.Transport that makes each attempt. The
// default is a clone of http.DefaultTransport without an environment proxy
// and with DefaultMaxIdleConnsPerHost (64) idle connections per upstream. A
// nil t is an error.
//
// It is an *http.Transport, not any RoundTripper, because the gateway
// learns whether an attempt may have reached its upstream from the
// httptrace GotConn hook, which http.Transport calls once it has a
// connection and before it writes a byte: an attempt that failed before
// that (refused, unresolvable, dial timeout, TLS handshake) sent nothing.
// A RoundTripper that did not call the hook would make every attempt look
// unsent, and an unkeyed mutation whose reply was lost could run twice.
//
// Timeouts of one attempt belong to the transport, for example
// ResponseHeaderTimeout: an attempt that times out there has been sent,
// and is failed over like a lost reply (a keyed mutation then usually gets
// 409 from the next upstream while the first still runs). Set it above the
// slowest route's deadline, or leave it unset.
func WithTransport(t *http.Transport) Option {
	return func(c *config) error {
		if t == nil {
			return errors.New("WithTransport(nil): the transport must not be nil")
		}
		c.transport = t
		return nil
	}
}

// WithMaxAttempts sets the most attempts one request makes, the first
// included; each upstream gets at most one, so a request makes at most
// min(n, number of upstreams). The default is DefaultMaxAttempts, 3. 1
// turns failover off; less than 1 is an error.
func WithMaxAttempts(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("WithMaxAttempts(%d): want at least 1", n)
		}
		c.maxAttempts = n
		return nil
	}
}

// WithCoolOff sets how long an upstream whose attempt failed without a
// response is passed over (passive health): healthy upstreams are tried
// first, and one cooling off only when every healthy one has been tried
// for the request. Any response ends the cool-off. The default is
// DefaultCoolOff, 10 seconds. Zero turns passive health off (every upstream
// stays in the round-robin); negative is an error.
func WithCoolOff(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("WithCoolOff(%v): the cool-off must not be negative", d)
		}
		c.coolOff = d
		return nil
	}
}

// WithMaxRequestBody sets how many bytes of a request body the gateway holds in
// memory so that it can send the body to another upstream. A request with
// a longer body is sent once, to one upstream, whatever its method and key:
// the body is streamed and cannot be sent again. The default is
// DefaultMaxRequestBody, 1 MiB. Zero means never hold a body (only requests
// without one fail over); negative is an error.
func WithMaxRequestBody(n int64) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("WithMaxRequestBody(%d): the limit must not be negative", n)
		}
		c.bodyLimit = n
		return nil
	}
}

// WithHeader sets the name of the header that carries the key, which must
// be the one the upstreams read. The default is idemkey.Header,
// "Idempotency-Key". The name must be a valid header field name.
func WithHeader(name string) Option {
	return func(c *config) error {
		if !headername.Valid(name) {
			return fmt.Errorf("WithHeader(%q): not a valid header name", name)
		}
		c.header = http.CanonicalHeaderKey(name)
		return nil
	}
}

// WithCovered sets which requests with a valid key the upstreams cover:
// run once per key (as the middleware's covered requests are), and so may
// be sent again after a lost reply. The default covers POST, PUT, PATCH
// and DELETE (idemkey.Mutation), the methods the
// middleware covers by default, on every path. Give a narrower function
// when some routes are not behind the middleware, or a wider one when the
// middleware covers more methods (middleware.WithMethods): a keyed request
// it reports false for is treated as unkeyed. It must be safe for
// concurrent use and must not read the body. A nil fn is an error.
func WithCovered(fn func(r *http.Request) bool) Option {
	return func(c *config) error {
		if fn == nil {
			return errors.New("WithCovered(nil): the function must not be nil")
		}
		c.honoured = fn
		return nil
	}
}

// WithObserver sets a function called for every attempt that ended without
// a response, after the gateway has decided what to do next (see Failure),
// for logs and metrics. It runs on the request's goroutine and must be safe
// for concurrent use. By default there is none. A nil fn is an error.
func WithObserver(fn func(Failure)) Option {
	return func(c *config) error {
		if fn == nil {
			return errors.New("WithObserver(nil): the function must not be nil")
		}
		c.observer = fn
		return nil
	}
}
