package middleware

import (
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/internal/headername"
	"github.com/idemkey/idemkey/internal/keylife"
	"github.com/idemkey/idemkey/internal/option"
	"github.com/idemkey/idemkey/scope"
)

// Defaults, each given in the doc comment of the option that replaces it.
const (
	defaultMaxRequestBody  = 1 << 20
	defaultMaxResponseBody = 1 << 20
	defaultBodyTimeout     = 30 * time.Second

	// ClaimMargin is added to a route's deadline to give a claim's life: a
	// request that never finishes lets go of its key this long after its
	// deadline. 5 seconds, as idemgrpc's.
	ClaimMargin = keylife.ClaimMargin
)

// An Option configures a Middleware. New applies options in order (a later
// option of a kind overrides an earlier one, except WithObserver, which
// adds), fills in the defaults of what no option set, and returns an error
// naming every invalid value and nil option. No option panics.
type Option func(*config) error

type config struct {
	keylife.Lives   // the deadline, retention and store timeout
	header          string
	covers          func(method string) bool
	scope           scope.Func
	fingerprint     fingerprint.Func
	maxRequestBody  int64
	maxResponseBody int
	bodyTimeout     time.Duration
	wait            time.Duration
	keep            func(status int) bool
	keepHeader      func(name string) bool
	observers       []Observer
	routeName       func(*http.Request) string
	errorWriter     ErrorWriter
	failOpen        bool
	noNewRequestID  bool
	cacheSize       int
	cacheTTL        time.Duration
	// defaultFingerprint: fingerprint is fingerprint.Default (no
	// WithFingerprint), whose inputs the raw digest (internal/rawdigest) covers.
	defaultFingerprint bool
}

// WithHeader sets the name of the request header that carries the key.
// Default: "Idempotency-Key".
func WithHeader(name string) Option {
	return func(c *config) error {
		if !headername.Valid(name) {
			return fmt.Errorf("WithHeader(%q): not a valid header name", name)
		}
		c.header = textproto.CanonicalMIMEHeaderKey(name)
		return nil
	}
}

// WithMethods sets the request methods that are covered; requests with any
// other method pass straight through and touch no store. Default: POST, PUT,
// PATCH and DELETE (idemkey.Mutation). Safe methods (GET, HEAD, OPTIONS,
// TRACE) are refused.
func WithMethods(methods ...string) Option {
	return func(c *config) error {
		if len(methods) == 0 {
			return errors.New("WithMethods(): no methods given")
		}
		set := make(map[string]bool, len(methods))
		for _, m := range methods {
			if m == "" || idemkey.Safe(m) {
				return fmt.Errorf("WithMethods(%s): %q cannot be covered (empty, or a safe method)", quoted(methods), m)
			}
			set[m] = true
		}
		c.covers = func(m string) bool { return set[m] }
		return nil
	}
}

// WithScope sets how the caller's scope (the namespace its keys live in) is
// found. Default: scope.Principal, the caller id that the service's
// authentication middleware stored with scope.NewContext, or
// scope.Anonymous. Never derive a scope from spoofable input; see package
// scope. f must name a scope for every request (scope.Anonymous for a
// caller who is not signed in): a request for which it returns "" is
// answered 500 scope_missing and reported as EventScopeMissing.
func WithScope(f scope.Func) Option {
	return func(c *config) error {
		if f == nil {
			return errors.New("WithScope(nil): the function must not be nil")
		}
		c.scope = f
		return nil
	}
}

// WithFingerprint replaces the request fingerprint. Default:
// fingerprint.Default, which covers the method, escaped path, canonical
// query, media type, content encoding and canonical body. fingerprint.New
// selects fields. The body slice f is given is reused after the request: f
// must not keep it.
func WithFingerprint(f fingerprint.Func) Option {
	return func(c *config) error {
		if f == nil {
			return errors.New("WithFingerprint(nil): the function must not be nil")
		}
		c.fingerprint = f
		return nil
	}
}

// WithDeadline sets the deadline of routes that do not set their own: the
// handler's context ends this long after the claim, and the claim lapses
// ClaimMargin later (unless the store can extend it: see Windows in the
// package documentation). Default: 30 seconds.
func WithDeadline(d time.Duration) Option {
	return func(c *config) error {
		return c.SetDeadline(d)
	}
}

// WithRetention sets how long a kept response is replayed. Default: 24
// hours.
func WithRetention(d time.Duration) Option {
	return func(c *config) error {
		return c.SetRetention(d)
	}
}

// WithMaxRequestBody sets how many bytes of request body are read and
// fingerprinted; a larger body is refused with 413 request_too_large before
// any store call. The buffer grows as bytes arrive, whatever Content-Length
// declares. Default: 1 MiB.
func WithMaxRequestBody(n int64) Option {
	return func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("WithMaxRequestBody(%d): the limit must be positive", n)
		}
		c.maxRequestBody = n
		return nil
	}
}

// WithBodyTimeout bounds how long the middleware waits for a covered
// request's body, from the moment it starts reading it: a body that has not
// arrived in full by then is refused with 400 request_body_unreadable and
// no store call. It sets the connection's read deadline through
// http.ResponseController (HTTP/1 and HTTP/2 servers support it; where the
// writer does not, only the server's own timeouts apply) and clears it once
// the body is read. The server's ReadTimeout, when shorter, still ends the
// read first; this bound is for servers that leave ReadTimeout unset or
// long. Default: 30 seconds.
func WithBodyTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("WithBodyTimeout(%v): the timeout must be positive", d)
		}
		c.bodyTimeout = d
		return nil
	}
}

// WithMaxResponseBody sets how many bytes of response body are held and
// kept. A handler that writes more switches to streaming, and its record
// keeps the status and headers but omits the body. Default (and 0): 1 MiB.
func WithMaxResponseBody(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("WithMaxResponseBody(%d): the limit must not be negative", n)
		}
		c.maxResponseBody = n
		return nil
	}
}

// WithStoreTimeout bounds each store call (claim, keep, release) by d, on
// top of the store's own budget; a claim that runs out of time answers 503
// unavailable. Stores that do I/O bound their calls themselves (store/redis:
// WithCallTimeout, 300 ms by default), so this is for stores that do not.
// Default: 0, the store's own budget alone.
func WithStoreTimeout(d time.Duration) Option {
	return func(c *config) error {
		return c.SetStoreTimeout(d)
	}
}

// WithWait makes a repeat that finds its key in flight wait up to d for the
// first request's answer, polling the store, instead of answering 409 at
// once. When the first request finishes, the repeat replays its answer; when
// it was released (5xx, panic), the repeat runs the handler itself. Default:
// 0, no wait.
func WithWait(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("WithWait(%v): the wait must not be negative", d)
		}
		c.wait = d
		return nil
	}
}

// WithKeep sets which response statuses are kept and replayed; a response
// that is not kept releases the key, so a retry runs the handler again.
// Default: DefaultKeep.
func WithKeep(keep func(status int) bool) Option {
	return func(c *config) error {
		if keep == nil {
			return errors.New("WithKeep(nil): the function must not be nil")
		}
		c.keep = keep
		return nil
	}
}

// DefaultKeep is the default of WithKeep. It keeps 2xx, 3xx and 4xx
// responses, except the transient 408 Request Timeout, 409 Conflict, 425
// Too Early and 429 Too Many Requests, which say "try again later" and are
// released as 5xx responses are: keeping them would make every retry with
// the key fail for the whole retention. This is Stripe's rule (a request
// that fails validation is kept; one that could succeed on a retry is not),
// with the transient client errors added.
func DefaultKeep(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status >= 200 && status < 500
}

// WithKeepHeader sets which response headers are kept and replayed, by
// canonical name. Default: DefaultKeepHeader.
func WithKeepHeader(keep func(name string) bool) Option {
	return func(c *config) error {
		if keep == nil {
			return errors.New("WithKeepHeader(nil): the function must not be nil")
		}
		c.keepHeader = keep
		return nil
	}
}

// WithObserver adds o to the observers every decision is reported to, in
// the order they were given: give it once per observer (a log, metrics, a
// trace). Default: none, and then the events an operator must see (store
// errors, lost ownership, a full store, an invalid route, a missing scope)
// are logged to slog.Default() at Warn with the key's digest, never the
// key; any observer replaces that log (SlogObserver logs them as it did).
// Observers run on the request goroutine, except for the events of a
// claim's heartbeat (a timer's goroutine) and the store error of a
// background release of a claim whose reply was lost (that release's
// goroutine, possibly after the request has ended): keep them fast and
// safe for concurrent use.
func WithObserver(o Observer) Option {
	return func(c *config) error {
		if o == nil {
			return errors.New("WithObserver(nil): the observer must not be nil")
		}
		c.observers = append(c.observers, o)
		return nil
	}
}

// WithRouteName sets the function that names, for Event.Route, the route of
// a request whose Pattern is empty (a router that does not set it, or
// middleware that runs before the router matched). It must return a value
// from a small fixed set (a route template, never a raw path: paths carry
// ids, and a metric series per id grows without bound). Default: none; such
// an event's Route is "".
func WithRouteName(f func(*http.Request) string) Option {
	return func(c *config) error {
		if f == nil {
			return errors.New("WithRouteName(nil): the function must not be nil")
		}
		c.routeName = f
		return nil
	}
}

// WithErrorWriter replaces the writer of the middleware's own error
// responses. Default: WriteProblem, RFC 9457 problem+json.
func WithErrorWriter(w ErrorWriter) Option {
	return func(c *config) error {
		if w == nil {
			return errors.New("WithErrorWriter(nil): the error writer must not be nil")
		}
		c.errorWriter = w
		return nil
	}
}

// WithFailOpen makes a request whose claim fails because the store cannot
// be reached at all (an error matching store.ErrUnreachable: a refused or
// timed-out dial, an unknown host) run its handler without idempotency
// instead of answering 503. A retry of such a request may then run twice.
// Every other claim error still answers 503, as without the option: a full
// pool, a full store (store.ErrFull), a refused operation, or a timeout of a
// store that is reachable (the first request may be running on it); so does
// a failure under a request whose caller has gone (its context is done: its
// retry would run again) or that found its key running for the same
// request and waits on it (WithWait). New refuses the option with a
// store.TxStore: a transactional store's handler never runs without its
// transaction. Default: off, fail closed.
func WithFailOpen() Option {
	return func(c *config) error {
		c.failOpen = true
		return nil
	}
}

// WithoutNewRequestID stops the middleware from making up request ids: a
// response it answers carries X-Request-Id only when the request came with
// one or the service's own request-id middleware set one on the response.
// Default: a response to a covered request with a key always carries one,
// made up (a random UUID) when there is none; see the package
// documentation.
func WithoutNewRequestID() Option {
	return func(c *config) error {
		c.noNewRequestID = true
		return nil
	}
}

// WithLocalCache keeps up to size completed records in process memory for
// up to ttl (never past a minute before the end of a record's retention,
// so that clocks up to a minute apart never replay a record the store has
// dropped), so that replays of them make no store round trip. Completed
// records never change, so instances that each cache them stay correct; a record deleted from the store by hand
// goes on being replayed from caches until their entries lapse. Default:
// off.
func WithLocalCache(size int, ttl time.Duration) Option {
	return func(c *config) error {
		if size <= 0 || ttl <= 0 {
			return fmt.Errorf("WithLocalCache(%d, %v): the size and the ttl must be positive", size, ttl)
		}
		c.cacheSize, c.cacheTTL = size, ttl
		return nil
	}
}

func newConfig(opts []Option) (*config, error) {
	c := &config{}
	if err := option.Apply("idemkey: middleware", c, opts); err != nil {
		return nil, err
	}
	if c.header == "" {
		c.header = idemkey.Header
	}
	if c.covers == nil {
		c.covers = idemkey.Mutation
	}
	if c.scope == nil {
		c.scope = scope.Principal
	}
	if c.fingerprint == nil {
		c.fingerprint = fingerprint.Default
		c.defaultFingerprint = true
	}
	c.Fill()
	if c.maxRequestBody == 0 {
		c.maxRequestBody = defaultMaxRequestBody
	}
	if c.maxResponseBody == 0 {
		c.maxResponseBody = defaultMaxResponseBody
	}
	if c.bodyTimeout == 0 {
		c.bodyTimeout = defaultBodyTimeout
	}
	if c.keep == nil {
		c.keep = DefaultKeep
	}
	if c.keepHeader == nil {
		c.keepHeader = DefaultKeepHeader
	}
	if c.errorWriter == nil {
		c.errorWriter = WriteProblem
	}
	return c, nil
}

// quoted lists methods as a call to WithMethods shows them: "POST", "GET".
func quoted(methods []string) string {
	q := make([]string, len(methods))
	for i, m := range methods {
		q[i] = strconv.Quote(m)
	}
	return strings.Join(q, ", ")
}
