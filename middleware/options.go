package middleware

import (
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"time"

	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/scope"
)

// Defaults. Each option's doc comment says which one it replaces.
const (
	DefaultHeader          = "Idempotency-Key"
	DefaultDeadline        = 30 * time.Second
	DefaultRetention       = 24 * time.Hour
	DefaultMaxRequestBody  = 1 << 20
	DefaultMaxResponseBody = 1 << 20

	// ClaimMargin is added to a route's deadline to give a claim's life: a
	// request that never finishes lets go of its key this long after its
	// deadline.
	ClaimMargin = 5 * time.Second
)

// An Option configures a Middleware. Options are applied in order by New,
// then defaults fill what no option set; New reports invalid values.
type Option func(*config)

type config struct {
	header          string
	methods         map[string]bool
	scope           scope.Func
	fingerprint     fingerprint.Func
	deadline        time.Duration
	retention       time.Duration
	maxRequestBody  int64
	maxResponseBody int
	storeTimeout    time.Duration
	wait            time.Duration
	keep            func(status int) bool
	keepHeader      func(name string) bool
	observer        Observer
	errorWriter     ErrorWriter
	failOpen        bool
	cacheSize       int
	cacheTTL        time.Duration
	// defaultFingerprint: fingerprint is fingerprint.Default (no
	// WithFingerprint), a function of what rawDigest covers.
	defaultFingerprint bool

	errs []error
}

// WithHeader sets the name of the request header that carries the key.
// Default: "Idempotency-Key".
func WithHeader(name string) Option {
	return func(c *config) {
		if name == "" {
			c.errs = append(c.errs, errors.New("header name is empty"))
			return
		}
		c.header = textproto.CanonicalMIMEHeaderKey(name)
	}
}

// WithMethods sets the request methods that are covered; requests with any
// other method pass straight through and touch no store. Default: POST, PUT,
// PATCH and DELETE. Safe methods (GET, HEAD, OPTIONS, TRACE) are refused.
func WithMethods(methods ...string) Option {
	return func(c *config) {
		if len(methods) == 0 {
			c.errs = append(c.errs, errors.New("no methods given"))
			return
		}
		c.methods = make(map[string]bool, len(methods))
		for _, m := range methods {
			switch m {
			case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, "":
				c.errs = append(c.errs, fmt.Errorf("method %q cannot be covered", m))
			}
			c.methods[m] = true
		}
	}
}

// WithScope sets how the caller's scope (the namespace its keys live in) is
// found. Default: scope.Principal, the caller id that the service's
// authentication middleware stored with scope.NewContext, or
// scope.Anonymous. Never derive a scope from spoofable input; see package
// scope.
func WithScope(f scope.Func) Option {
	return func(c *config) {
		if f == nil {
			c.errs = append(c.errs, errors.New("nil scope function"))
		}
		c.scope = f
	}
}

// WithFingerprint replaces the request fingerprint. Default:
// fingerprint.Default, which covers the method, escaped path, canonical
// query, media type and canonical body. fingerprint.New selects fields.
// The body slice f is given is reused after the request: f must not keep it.
func WithFingerprint(f fingerprint.Func) Option {
	return func(c *config) {
		if f == nil {
			c.errs = append(c.errs, errors.New("nil fingerprint function"))
		}
		c.fingerprint = f
	}
}

// WithDeadline sets the deadline of routes that do not set their own: the
// handler's context ends this long after the claim, and the claim lapses
// ClaimMargin later. Default: 30 seconds.
func WithDeadline(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, fmt.Errorf("deadline %v is not positive", d))
		}
		c.deadline = d
	}
}

// WithRetention sets how long a kept response is replayed. Default: 24
// hours.
func WithRetention(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, fmt.Errorf("retention %v is not positive", d))
		}
		c.retention = d
	}
}

// WithMaxRequestBody sets how many bytes of request body are read and
// fingerprinted; a larger body is refused with 413 request_too_large before
// any store call. Default: 1 MiB.
func WithMaxRequestBody(n int64) Option {
	return func(c *config) {
		if n <= 0 {
			c.errs = append(c.errs, fmt.Errorf("max request body %d is not positive", n))
		}
		c.maxRequestBody = n
	}
}

// WithMaxResponseBody sets how many bytes of response body are held and
// kept. A handler that writes more switches to streaming, and its record
// keeps the status and headers but omits the body. Default (and 0): 1 MiB.
func WithMaxResponseBody(n int) Option {
	return func(c *config) {
		if n < 0 {
			c.errs = append(c.errs, fmt.Errorf("max response body %d is negative", n))
		}
		c.maxResponseBody = n
	}
}

// WithStoreTimeout bounds each store call (claim, keep, release) by d, on
// top of the store's own budget; a claim that runs out of time answers 503
// unavailable. Stores that do I/O bound their calls themselves (store/redis:
// WithCallTimeout, 300 ms by default), so this is for stores that do not.
// Default: 0, the store's own budget alone.
func WithStoreTimeout(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.errs = append(c.errs, fmt.Errorf("store timeout %v is negative", d))
		}
		c.storeTimeout = d
	}
}

// WithWait makes a repeat that finds its key in flight wait up to d for the
// first request's answer, polling the store, instead of answering 409 at
// once. When the first request finishes, the repeat replays its answer; when
// it was released (5xx, panic), the repeat runs the handler itself. Default:
// 0, no wait.
func WithWait(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.errs = append(c.errs, fmt.Errorf("wait %v is negative", d))
		}
		c.wait = d
	}
}

// WithKeep sets which response statuses are kept and replayed; a response
// that is not kept releases the key, so a retry runs the handler again.
// Default: 200 to 499 (successes, redirects and client errors are kept;
// server errors are not).
func WithKeep(keep func(status int) bool) Option {
	return func(c *config) {
		if keep == nil {
			c.errs = append(c.errs, errors.New("nil keep function"))
		}
		c.keep = keep
	}
}

// WithKeepHeader sets which response headers are kept and replayed, by
// canonical name. Default: DefaultKeepHeader.
func WithKeepHeader(keep func(name string) bool) Option {
	return func(c *config) {
		if keep == nil {
			c.errs = append(c.errs, errors.New("nil keep-header function"))
		}
		c.keepHeader = keep
	}
}

// WithObserver sets the function every decision is reported to. Default:
// none. It runs on the request goroutine: keep it fast.
func WithObserver(o Observer) Option {
	return func(c *config) { c.observer = o }
}

// WithErrorWriter replaces the writer of the middleware's own error
// responses. Default: WriteProblem, RFC 9457 problem+json.
func WithErrorWriter(w ErrorWriter) Option {
	return func(c *config) {
		if w == nil {
			c.errs = append(c.errs, errors.New("nil error writer"))
		}
		c.errorWriter = w
	}
}

// WithFailOpen makes a request whose claim fails because the store is out
// of reach (an error matching store.ErrUnavailable) run its handler without
// idempotency instead of answering 503. A retry of such a request may then
// run twice. Other claim errors still answer 503. Default: off, fail closed.
func WithFailOpen() Option {
	return func(c *config) { c.failOpen = true }
}

// WithLocalCache keeps up to size completed records in process memory for
// up to ttl (never past a record's retention), so that replays of them make
// no store round trip. Completed records never change, so instances that
// each cache them stay correct; a record deleted from the store by hand
// goes on being replayed from caches until their entries lapse. Default:
// off.
func WithLocalCache(size int, ttl time.Duration) Option {
	return func(c *config) {
		if size <= 0 || ttl <= 0 {
			c.errs = append(c.errs, fmt.Errorf("local cache size %d and ttl %v must be positive", size, ttl))
		}
		c.cacheSize, c.cacheTTL = size, ttl
	}
}

func defaultKeep(status int) bool { return status >= 200 && status < 500 }

func newConfig(opts []Option) (*config, error) {
	c := &config{}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("idemkey: middleware: nil option")
		}
		o(c)
	}
	if len(c.errs) > 0 {
		return nil, fmt.Errorf("idemkey: middleware: %w", errors.Join(c.errs...))
	}
	if c.header == "" {
		c.header = DefaultHeader
	}
	if c.methods == nil {
		c.methods = map[string]bool{http.MethodPost: true, http.MethodPut: true, http.MethodPatch: true, http.MethodDelete: true}
	}
	if c.scope == nil {
		c.scope = scope.Principal
	}
	if c.fingerprint == nil {
		c.fingerprint = fingerprint.Default
		c.defaultFingerprint = true
	}
	if c.deadline == 0 {
		c.deadline = DefaultDeadline
	}
	if c.retention == 0 {
		c.retention = DefaultRetention
	}
	if c.maxRequestBody == 0 {
		c.maxRequestBody = DefaultMaxRequestBody
	}
	if c.maxResponseBody == 0 {
		c.maxResponseBody = DefaultMaxResponseBody
	}
	if c.keep == nil {
		c.keep = defaultKeep
	}
	if c.keepHeader == nil {
		c.keepHeader = DefaultKeepHeader
	}
	if c.errorWriter == nil {
		c.errorWriter = WriteProblem
	}
	return c, nil
}
