package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/client"
	"github.com/idemkey/idemkey/internal/httpretry"
	"github.com/idemkey/idemkey/internal/option"
)

// Gateway is an http.RoundTripper that sends each request to one of a list
// of upstream instances and fails it over to the next as the package
// documentation describes. Make one with New; it is safe for concurrent
// use.
type Gateway struct {
	cfg       config
	upstreams []*upstream
	next      atomic.Uint64 // round-robin position
	// once is cfg.transport without keep-alives, for the requests that
	// must reach an upstream at most once but that net/http would resend
	// by itself (see httpretry.LooksIdempotent).
	once *http.Transport

	now func() time.Time // the clock of the cool-offs; a seam for tests
}

// Failure describes one attempt that ended without a response, for the
// function set with WithObserver.
type Failure struct {
	// Upstream is the base URL of the upstream the attempt went to.
	Upstream string
	// Attempt counts the request's attempts, starting at 1.
	Attempt int
	// Method is the request's method.
	Method string
	// Keyed reports whether the request carries a key the upstreams honour.
	Keyed bool
	// Sent reports whether the request may have reached the upstream: a
	// connection was obtained. When false, nothing was sent.
	Sent bool
	// Err is the attempt's transport error.
	Err error
	// Next reports whether the gateway tries another upstream; when false
	// this was the request's last attempt.
	Next bool
}

// New returns a Gateway over upstreams, the base URLs of the instances
// ("http://10.0.0.7:8080", "https://api-2.internal"; a path is a prefix put
// before every request's path), which must all keep their idempotency
// records in one store. It returns an error, and no Gateway, when there is
// no upstream, an upstream is not an absolute http or https URL without
// user info, query or fragment, one is listed twice, or an option is
// invalid or nil.
func New(upstreams []string, opts ...Option) (*Gateway, error) {
	c := defaultConfig()
	err := option.Apply("idemkey: gateway", &c, opts)
	ups, uerr := parseUpstreams(upstreams)
	if err = errors.Join(err, uerr); err != nil {
		return nil, err
	}
	if c.transport == nil {
		c.transport = defaultTransport()
	}
	return &Gateway{cfg: c, upstreams: ups, once: httpretry.Once(c.transport), now: time.Now}, nil
}

func parseUpstreams(list []string) ([]*upstream, error) {
	if len(list) == 0 {
		return nil, errors.New("idemkey: gateway: no upstream")
	}
	var errs []error
	ups := make([]*upstream, 0, len(list))
	seen := make(map[string]bool, len(list))
	for _, s := range list {
		u, err := url.Parse(strings.TrimSpace(s))
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("idemkey: gateway: upstream %q: %w", s, err))
			continue
		case u.Scheme != "http" && u.Scheme != "https", u.Host == "", u.Opaque != "":
			errs = append(errs, fmt.Errorf("idemkey: gateway: upstream %q is not an absolute http or https URL", s))
			continue
		case u.User != nil, u.RawQuery != "", u.ForceQuery, u.Fragment != "":
			errs = append(errs, fmt.Errorf("idemkey: gateway: upstream %q has user info, a query or a fragment", s))
			continue
		}
		name := u.String()
		if seen[name] {
			errs = append(errs, fmt.Errorf("idemkey: gateway: upstream %q is listed twice", s))
			continue
		}
		seen[name] = true
		ups = append(ups, &upstream{url: u, name: name})
	}
	return ups, errors.Join(errs...)
}

// Upstreams returns the upstreams' base URLs in the order New was given them.
func (g *Gateway) Upstreams() []string {
	names := make([]string, len(g.upstreams))
	for i, u := range g.upstreams {
		names[i] = u.name
	}
	return names
}

// CloseIdleConnections closes the transport's idle connections.
func (g *Gateway) CloseIdleConnections() {
	g.cfg.transport.CloseIdleConnections()
	g.once.CloseIdleConnections()
}

// RoundTrip sends req to an upstream, and to the next ones after a failure
// when that is safe (see the package documentation). It returns the first
// response an upstream gives, whatever its status. When no attempt got a
// response it returns a problem response of its own: 502
// upstream_reply_lost, 503 upstream_unavailable or 504 upstream_timeout.
// It returns an error only when the request's context was cancelled or its
// body could not be read (ErrRequestBody). It always closes req's body.
//
// The request goes to the upstream's scheme and host, with the upstream's
// path put before its own; its Host header, other headers, key and body
// are sent as they are.
func (g *Gateway) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	keyed := g.keyed(req, method)
	resendable := client.Resendable(method, keyed)

	body, err := g.newBody(req)
	if err != nil {
		return nil, err
	}
	order := g.order(g.now())
	attempts := min(g.cfg.maxAttempts, len(order))
	if body.get == nil {
		attempts = 1
	}

	transport := g.cfg.transport
	if !resendable && httpretry.LooksIdempotent(req.Header) {
		transport = g.once
	}

	var (
		sentAny bool  // some attempt may have reached its upstream
		lastErr error // the last attempt's error
	)
	hold, _ := ctx.Value(earlyKey{}).(*early) // set by Proxy.ServeHTTP
	for i, u := range order[:attempts] {
		if i > 0 && ctx.Err() != nil {
			break
		}
		var sent atomic.Bool
		trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { sent.Store(true) }}
		if hold != nil {
			// Hold the 1xx of an attempt after which another may follow.
			hold.begin(i, resendable && i+1 < attempts)
			trace.Got1xxResponse = func(int, textproto.MIMEHeader) error {
				hold.got(i)
				return nil
			}
		}
		out := req.WithContext(httptrace.WithClientTrace(ctx, trace))
		out.URL = u.target(req.URL)
		if err := body.set(out, i, resendable); err != nil {
			// The body could not be made again: nothing more can be sent.
			lastErr = err
			break
		}
		resp, err := transport.RoundTrip(out)
		if err == nil {
			if hold != nil {
				hold.answered()
			}
			u.up()
			return resp, nil
		}
		if hold != nil {
			hold.failed()
		}
		if resp != nil && resp.Body != nil {
			resp.Body.Close()
		}
		lastErr = err
		wasSent := sent.Load()
		sentAny = sentAny || wasSent
		// The caller's end, or its body failing while it was sent (the
		// upstream got a request it could not read whole), is not the
		// upstream's fault, and ends the request.
		clientsFault := ctx.Err() != nil
		if berr := body.broken(); berr != nil {
			lastErr = fmt.Errorf("%w: %w", ErrRequestBody, berr)
			clientsFault = true
		}
		if !clientsFault {
			u.down(g.now(), g.cfg.coolOff)
		}
		// Nothing sent: any request may go elsewhere. Sent: only what may
		// be sent twice, and only after an error another attempt could
		// escape (client's rule).
		next := !clientsFault && i+1 < attempts &&
			(!wasSent || resendable && client.RetryableError(err))
		if g.cfg.observer != nil {
			g.cfg.observer(Failure{Upstream: u.name, Attempt: i + 1, Method: method, Keyed: keyed, Sent: wasSent, Err: lastErr, Next: next})
		}
		if !next {
			break
		}
	}
	return g.failed(req, resendable, sentAny, lastErr)
}

// failed answers a request none of whose attempts got a response.
func (g *Gateway) failed(req *http.Request, resendable, sentAny bool, lastErr error) (*http.Response, error) {
	ctxErr := req.Context().Err()
	switch {
	case errors.Is(lastErr, ErrRequestBody):
		return nil, lastErr
	case sentAny && !resendable:
		return problemResponse(req, problemReplyLost), nil
	case errors.Is(ctxErr, context.DeadlineExceeded):
		return problemResponse(req, problemTimeout), nil
	case ctxErr != nil:
		return nil, fmt.Errorf("idemkey: gateway: %w", ctxErr)
	}
	return problemResponse(req, problemUnavailable), nil
}

// keyed reports whether req carries a valid key that its upstream honours.
func (g *Gateway) keyed(req *http.Request, method string) bool {
	vs := req.Header.Values(g.cfg.header)
	if len(vs) == 0 {
		return false
	}
	if _, err := idemkey.ParseKey(vs); err != nil {
		return false
	}
	if method != req.Method {
		r := *req
		r.Method = method
		req = &r
	}
	return g.cfg.honoured(req)
}

// order returns the upstreams in the order one request tries them: the
// healthy ones round-robin from the next position, then those cooling
// off, the one back soonest first.
func (g *Gateway) order(now time.Time) []*upstream {
	n := len(g.upstreams)
	start := int((g.next.Add(1) - 1) % uint64(n))
	order := make([]*upstream, 0, n)
	type coolingUpstream struct {
		u     *upstream
		until int64
	}
	var cooling []coolingUpstream
	for i := range n {
		u := g.upstreams[(start+i)%n]
		if until := u.downUntil.Load(); until == 0 || now.UnixNano() >= until {
			order = append(order, u)
		} else {
			cooling = append(cooling, coolingUpstream{u, until})
		}
	}
	slices.SortStableFunc(cooling, func(a, b coolingUpstream) int { return cmp.Compare(a.until, b.until) })
	for _, c := range cooling {
		order = append(order, c.u)
	}
	return order
}

// upstream is one instance behind the gateway.
type upstream struct {
	url  *url.URL
	name string
	// downUntil is when the upstream's cool-off ends, in Unix nanoseconds
	// of the gateway's clock; zero when it is healthy.
	downUntil atomic.Int64
}

func (u *upstream) down(now time.Time, coolOff time.Duration) {
	if coolOff > 0 {
		u.downUntil.Store(now.Add(coolOff).UnixNano())
	}
}

func (u *upstream) up() {
	if u.downUntil.Load() != 0 {
		u.downUntil.Store(0)
	}
}

// target returns the URL of in at the upstream: its scheme and host, its
// path after the upstream's, in's query.
func (u *upstream) target(in *url.URL) *url.URL {
	out := *in
	out.Scheme, out.Host, out.User = u.url.Scheme, u.url.Host, nil
	if base := u.url; base.Path != "" && base.Path != "/" {
		if base.RawPath == "" && in.RawPath == "" {
			out.Path, out.RawPath = joinSlash(base.Path, in.Path), ""
		} else {
			escaped := joinSlash(base.EscapedPath(), in.EscapedPath())
			if p, err := url.PathUnescape(escaped); err == nil {
				out.Path, out.RawPath = p, escaped
			}
		}
	}
	return &out
}

// joinSlash joins a and b with exactly one slash between them.
func joinSlash(a, b string) string {
	if b == "" {
		return a
	}
	return strings.TrimSuffix(a, "/") + "/" + strings.TrimPrefix(b, "/")
}
