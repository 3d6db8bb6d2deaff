package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/httpretry"
	"github.com/idemkey/idemkey/internal/option"
)

// Transport is an http.RoundTripper that sends one idempotency key on every
// attempt of a logical request and retries what is safe to retry (see the
// package documentation). Make one with New; the zero value has no base
// RoundTripper and fails every request. A Transport is safe for concurrent
// use.
type Transport struct {
	config
	// once is the base without keep-alives when the base is an
	// *http.Transport: for mutations without a key the server honours that
	// carry a key-like header, which the base would otherwise resend by
	// itself (see httpretry.LooksIdempotent).
	once http.RoundTripper

	// Seams for tests: the clock, the wait between attempts and the jitter
	// source (uniform in [0, n)).
	now    func() time.Time
	sleep  func(ctx context.Context, d time.Duration) error
	jitter func(n int64) int64
}

// New returns a Transport configured by opts, with the defaults of the
// Default constants for every option not given. It returns an error, and no
// Transport, when an option's value is invalid or an option is nil; the
// error reports every such option.
func New(opts ...Option) (*Transport, error) {
	c := defaultConfig()
	if err := option.Apply("idemkey: client", &c, opts); err != nil {
		return nil, err
	}
	t := &Transport{config: c, now: time.Now, sleep: sleep, jitter: rand.Int64N}
	if b, ok := c.base.(*http.Transport); ok {
		t.once = httpretry.Once(b)
	}
	return t, nil
}

// sleep waits d or until ctx is done, whichever comes first.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var (
	errNotMadeByNew = errors.New("idemkey: client: Transport used without New")
	errNoResponse   = errors.New("idemkey: client: base RoundTripper returned neither a response nor an error")
)

// drainLimit is how much of a discarded response body is read so that its
// connection can be reused.
const drainLimit = 64 << 10

// RoundTrip sends req, with its key, until an attempt's outcome is final (see
// the package documentation), and returns the last response or transport
// error. It does not modify req and always closes its body.
func (t *Transport) RoundTrip(req *http.Request) (resp *http.Response, err error) {
	ctx := req.Context()
	tr, _ := ctx.Value(traceContextKey{}).(*Trace)
	if tr != nil {
		*tr = Trace{}
		defer func() { tr.Replayed = Replayed(resp) }()
	}
	if t.base == nil {
		closeBody(req)
		return nil, errNotMadeByNew
	}
	method := methodOf(req)
	key, set, err := t.chooseKey(req, method)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	if tr != nil {
		tr.Key = key
	}
	// Reads are retried freely; anything else only with a key.
	resendable := Resendable(method, key != "")
	retryable := t.maxAttempts > 1 && resendable
	base := t.base
	if !resendable && t.once != nil && httpretry.LooksIdempotent(req.Header) {
		base = t.once
	}
	body, err := t.newBodySource(req, retryable)
	if err != nil {
		return nil, err
	}

	var header string
	if set {
		header = idemkey.FormatKey(key)
	}
	var (
		start   = t.now()
		counted int           // attempts that count against maxAttempts
		longest time.Duration // the longest attempt so far
		final   bool          // this attempt is the last, whatever it answers
	)
	for n := 1; ; n++ {
		out := req.Clone(ctx)
		if set {
			out.Header.Set(t.header, header)
		}
		if n == 1 {
			out.Body = body.first
		} else {
			out.Body = body.next
		}
		out.GetBody = nil
		if resendable && out.Body != nil && out.Body != http.NoBody {
			// The base may resend on a fresh connection by itself.
			out.GetBody = body.get
		}
		if body.length >= 0 {
			out.ContentLength = body.length
		}
		sent := t.now()
		resp, err = base.RoundTrip(out)
		longest = max(longest, t.now().Sub(sent))
		switch {
		case err != nil && resp != nil:
			discard(resp)
			resp = nil
		case err == nil && resp == nil:
			err = errNoResponse
		case err == nil && resp.Request == nil:
			// The request that got resp, key included: http.Client hands
			// it to the next hop of a redirect (see redirectedKey).
			resp.Request = out
		}
		if tr != nil {
			tr.Attempts = n
		}
		inFlight := t.inFlightWait > 0 && inFlightAnswer(resp)
		if !inFlight {
			counted++
		}

		if !retryable || final || body.get == nil || ctx.Err() != nil {
			return resp, err
		}
		if inFlight && !t.now().Before(start.Add(t.inFlightWait)) || !inFlight && counted >= t.maxAttempts {
			return resp, err
		}
		if !t.policy(Attempt{Number: n, Key: key, Request: out, Response: resp, Err: err}) {
			return resp, err
		}
		wait, ok := t.wait(n, resp)
		if !ok {
			return resp, err
		}
		// The budget: the context's deadline, and for an in-flight answer
		// the in-flight wait. A wait that ends past it is not made; but a
		// wait the server asked for (Retry-After) is cut to what is left,
		// less room for one more attempt before the deadline, for one last
		// attempt: the first request may well have answered by then.
		now := t.now()
		deadline, hasDeadline := ctx.Deadline()
		pastDeadline := hasDeadline && !now.Add(wait).Before(deadline)
		pastInFlight := inFlight && !now.Add(wait).Before(start.Add(t.inFlightWait))
		if pastDeadline || pastInFlight {
			if _, hinted := retryAfter(resp, now); !hinted {
				return resp, err
			}
			end := start.Add(t.inFlightWait)
			if hasDeadline && (!inFlight || deadline.Add(-max(2*longest, minAttemptRoom)).Before(end)) {
				end = deadline.Add(-max(2*longest, minAttemptRoom))
			}
			if !now.Before(end) {
				return resp, err
			}
			wait, final = end.Sub(now), true
		}
		next, gerr := body.get()
		if gerr != nil {
			return resp, err
		}
		if resp != nil {
			discard(resp)
		}
		if tr != nil {
			tr.Waited += wait
		}
		if serr := t.sleep(ctx, wait); serr != nil {
			if next != nil {
				next.Close()
			}
			return nil, errorf("waiting to retry after %d attempts: %w", n, serr)
		}
		body.next = next
	}
}

// minAttemptRoom is the least time left before the context's deadline for
// a last attempt that a Retry-After past the deadline is cut short for:
// the attempt needs at least twice as long as the longest attempt so far,
// and never less than this.
const minAttemptRoom = 100 * time.Millisecond

// inFlightAnswer reports whether resp says that the first request with the
// key is still running: a 409 with a Retry-After, as an idemkey server (and
// Stripe's API) answers then.
func inFlightAnswer(resp *http.Response) bool {
	return resp != nil && resp.StatusCode == http.StatusConflict && resp.Header.Get("Retry-After") != ""
}

// CloseIdleConnections closes the idle connections of the base RoundTripper
// when it has such a method (http.Transport does). http.Client calls it.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// discard drains and closes a response the caller will never see. Only a
// body of known length up to drainLimit is drained, so that its connection
// can be reused; any other is closed unread, which costs the connection but
// never waits on a slow body.
func discard(resp *http.Response) {
	if resp.Body == nil {
		return
	}
	if resp.ContentLength >= 0 && resp.ContentLength <= drainLimit {
		io.CopyN(io.Discard, resp.Body, drainLimit)
	}
	resp.Body.Close()
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// bodySource hands out the request body for each attempt.
type bodySource struct {
	first io.ReadCloser // the body of the first attempt
	next  io.ReadCloser // the body of the next attempt after the first
	// get returns a fresh copy of the body; nil when the body cannot be
	// sent again.
	get func() (io.ReadCloser, error)
	// length is the body's length when the transport read it all, else -1:
	// keep the request's ContentLength.
	length int64
}

// newBodySource prepares req's body for one or more attempts. When retries
// are possible and the body has no GetBody, it reads up to the buffer limit
// of it into memory. On error it has closed req.Body.
func (t *Transport) newBodySource(req *http.Request, retryable bool) (bodySource, error) {
	switch {
	case req.Body == nil || req.Body == http.NoBody:
		b := req.Body
		return bodySource{first: b, get: func() (io.ReadCloser, error) { return b, nil }, length: -1}, nil
	case req.GetBody != nil:
		return bodySource{first: req.Body, get: req.GetBody, length: -1}, nil
	case !retryable || t.bodyLimit == 0 || req.ContentLength > t.bodyLimit:
		return bodySource{first: req.Body, length: -1}, nil
	}
	buf, err := io.ReadAll(io.LimitReader(req.Body, t.bodyLimit+1))
	if err != nil {
		req.Body.Close()
		return bodySource{}, errorf("reading the request body: %w", err)
	}
	if int64(len(buf)) > t.bodyLimit {
		// Too long to hold: stream what was read and the rest, once.
		return bodySource{first: struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(buf), req.Body), req.Body}, length: -1}, nil
	}
	req.Body.Close()
	if len(buf) == 0 {
		return bodySource{first: http.NoBody, get: func() (io.ReadCloser, error) { return http.NoBody, nil }, length: 0}, nil
	}
	get := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	first, _ := get()
	return bodySource{first: first, get: get, length: int64(len(buf))}, nil
}
