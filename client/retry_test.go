package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRetryAfterParsing(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		value string
		want  time.Duration
		ok    bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"5", 5 * time.Second, true},
		{" 12 ", 12 * time.Second, true},
		{"1.5", 0, false},
		{"-3", 0, false},
		{"99999999999999999999999", maxDuration, true},
		{"9223372036854775807", maxDuration, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-90 * time.Second).Format(http.TimeFormat), 0, true},
		{"Sunday, 06-Jan-30 03:04:05 GMT", 4*24*time.Hour + 0, true}, // RFC 850 form
		{"tomorrow", 0, false},
	} {
		resp := &http.Response{Header: http.Header{}}
		if c.value != "" {
			resp.Header.Set("Retry-After", c.value)
		}
		got, ok := retryAfter(resp, now)
		if got != c.want || ok != c.ok {
			t.Errorf("Retry-After %q = %v, %v; want %v, %v", c.value, got, ok, c.want, c.ok)
		}
	}
	if _, ok := retryAfter(nil, now); ok {
		t.Error("a nil response has a Retry-After")
	}
}

func TestReplayed(t *testing.T) {
	for value, want := range map[string]bool{"true": true, "True": true, " true ": true, "false": false, "": false, "1": false} {
		resp := &http.Response{Header: http.Header{}}
		if value != "" {
			resp.Header.Set("Idempotent-Replayed", value)
		}
		if got := Replayed(resp); got != want {
			t.Errorf("Replayed with %q = %v, want %v", value, got, want)
		}
	}
	if Replayed(nil) {
		t.Error("Replayed(nil) = true")
	}
}

func TestDefaultRetryPolicy(t *testing.T) {
	post, _ := http.NewRequest(http.MethodPost, "http://x/", nil)
	get, _ := http.NewRequest(http.MethodGet, "http://x/", nil)
	resp := func(status int, replayed bool) *http.Response {
		r := &http.Response{StatusCode: status, Header: http.Header{}}
		if replayed {
			r.Header.Set("Idempotent-Replayed", "true")
		}
		return r
	}
	for _, c := range []struct {
		name string
		a    Attempt
		want bool
	}{
		{"reset", Attempt{Request: post, Err: connReset}, true},
		{"wrapped EOF", Attempt{Request: post, Err: fmt.Errorf("read: %w", io.EOF)}, true},
		{"unknown authority", Attempt{Request: post, Err: &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}}, false},
		{"hostname", Attempt{Request: get, Err: fmt.Errorf("x: %w", x509.HostnameError{})}, false},
		{"expired", Attempt{Request: get, Err: x509.CertificateInvalidError{Reason: x509.Expired}}, false},
		{"plain HTTP from a TLS client", Attempt{Request: get, Err: tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}}, false},
		{"POST 409", Attempt{Request: post, Response: resp(409, false)}, true},
		{"GET 409", Attempt{Request: get, Response: resp(409, false)}, false},
		{"POST 429", Attempt{Request: post, Response: resp(429, false)}, true},
		{"GET 429", Attempt{Request: get, Response: resp(429, false)}, true},
		{"POST 502", Attempt{Request: post, Response: resp(502, false)}, true},
		{"POST 503", Attempt{Request: post, Response: resp(503, false)}, true},
		{"GET 504", Attempt{Request: get, Response: resp(504, false)}, true},
		{"POST 500", Attempt{Request: post, Response: resp(500, false)}, false},
		{"POST 505", Attempt{Request: post, Response: resp(505, false)}, false},
		{"POST 400", Attempt{Request: post, Response: resp(400, false)}, false},
		{"POST 422", Attempt{Request: post, Response: resp(422, false)}, false},
		{"POST 200", Attempt{Request: post, Response: resp(200, false)}, false},
		{"replayed 409", Attempt{Request: post, Response: resp(409, true)}, false},
		{"replayed 429", Attempt{Request: post, Response: resp(429, true)}, false},
		{"nothing", Attempt{Request: post}, false},
	} {
		if got := DefaultRetryPolicy(c.a); got != c.want {
			t.Errorf("%s: DefaultRetryPolicy = %v, want %v", c.name, got, c.want)
		}
	}
}

// opaqueBody is a request body http.NewRequest cannot make a GetBody for.
type opaqueBody struct{ *trackedBody }

func TestRequestBodies(t *testing.T) {
	const body = "0123456789"
	for _, c := range []struct {
		name     string
		body     func() io.Reader
		limit    int64
		attempts int
	}{
		{"with GetBody", func() io.Reader { return strings.NewReader(body) }, 1 << 20, 3},
		{"without GetBody, buffered", func() io.Reader { return opaqueBody{newTracked(body)} }, 1 << 20, 3},
		{"without GetBody, exactly the limit", func() io.Reader { return opaqueBody{newTracked(body)} }, 10, 3},
		{"without GetBody, over the limit: once", func() io.Reader { return opaqueBody{newTracked(body)} }, 9, 1},
		{"without GetBody, buffering off: once", func() io.Reader { return opaqueBody{newTracked(body)} }, 0, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, srv := newScript(t, step{status: http.StatusServiceUnavailable}, step{status: http.StatusServiceUnavailable},
				step{status: http.StatusOK})
			tr, _ := newTest(t, WithBase(noKeepAlive(t)), WithMaxRequestBody(c.limit))
			r := c.body()
			req, _ := http.NewRequest(http.MethodPost, srv.URL, r)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			got := s.Seen()
			if len(got) != c.attempts {
				t.Fatalf("%d attempts, want %d", len(got), c.attempts)
			}
			for i, g := range got {
				if g.Body != body {
					t.Errorf("attempt %d body %q, want %q", i+1, g.Body, body)
				}
			}
			if o, ok := r.(opaqueBody); ok && !o.Closed() {
				t.Error("the request body was not closed")
			}
		})
	}
}

func TestEmptyBodiesAreRetried(t *testing.T) {
	for name, body := range map[string]io.Reader{"nil": nil, "NoBody": http.NoBody, "empty opaque": opaqueBody{newTracked("")}} {
		s, srv := newScript(t, step{status: http.StatusBadGateway}, step{status: http.StatusOK})
		tr, _ := newTest(t, WithBase(noKeepAlive(t)))
		req, _ := http.NewRequest(http.MethodDelete, srv.URL, body)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || len(s.Seen()) != 2 {
			t.Errorf("%s: %d after %d attempts, want 200 after 2", name, resp.StatusCode, len(s.Seen()))
		}
	}
}

type failingBody struct{ closed bool }

func (b *failingBody) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }
func (b *failingBody) Close() error             { b.closed = true; return nil }

func TestBodyReadErrorFailsBeforeSending(t *testing.T) {
	sent := 0
	tr, _ := newTest(t, WithBase(rtFunc(func(r *http.Request) (*http.Response, error) {
		sent++
		return response(r, http.StatusOK, http.NoBody), nil
	})))
	b := &failingBody{}
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://127.0.0.1:1/", b)
	if _, err := tr.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Errorf("error %v, want the body's read error", err)
	}
	if sent != 0 || !b.closed {
		t.Errorf("%d attempts sent, body closed %v; want none sent and closed", sent, b.closed)
	}
}

func TestGetBodyErrorEndsRetries(t *testing.T) {
	sent := 0
	tr, _ := newTest(t, WithBase(rtFunc(func(r *http.Request) (*http.Response, error) {
		sent++
		return response(r, http.StatusServiceUnavailable, http.NoBody), nil
	})))
	req := post(t, context.Background(), "http://127.0.0.1:1/", "b")
	req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("gone") }
	resp, err := tr.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || sent != 1 {
		t.Errorf("RoundTrip = %v, %v after %d attempts; want the 503 after 1", resp, err, sent)
	}
}

func TestTraceReportsAReplay(t *testing.T) {
	n := 0
	tr, _ := newTest(t, WithBase(rtFunc(func(r *http.Request) (*http.Response, error) {
		n++
		if n == 1 {
			return nil, connReset
		}
		return response(r, http.StatusCreated, http.NoBody, "Idempotent-Replayed", "true"), nil
	})), WithKeyGenerator(func() string { return "k" }))
	trace := Trace{Attempts: 99, Key: "stale", Replayed: false, Waited: time.Hour}
	resp, err := tr.RoundTrip(post(t, WithTrace(context.Background(), &trace), "http://127.0.0.1:1/", "b"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if trace.Attempts != 2 || trace.Key != "k" || !trace.Replayed || trace.Waited != 100*time.Millisecond-1 {
		t.Errorf("trace = %+v, want 2 attempts, key k, replayed, waited 100ms", trace)
	}
}

func TestResendable(t *testing.T) {
	for _, c := range []struct {
		method string
		keyed  bool
		want   bool
	}{
		{"GET", false, true}, {"HEAD", false, true}, {"OPTIONS", false, true}, {"TRACE", false, true},
		{"POST", false, false}, {"PUT", false, false}, {"PATCH", false, false}, {"DELETE", false, false},
		{"PROPFIND", false, false},
		{"POST", true, true}, {"DELETE", true, true}, {"PROPFIND", true, true}, {"GET", true, true},
	} {
		if got := Resendable(c.method, c.keyed); got != c.want {
			t.Errorf("Resendable(%s, keyed %v) = %v, want %v", c.method, c.keyed, got, c.want)
		}
	}
}

func TestRetryableError(t *testing.T) {
	for name, c := range map[string]struct {
		err  error
		want bool
	}{
		"refused":           {&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, true},
		"reset":             {connReset, true},
		"EOF":               {io.EOF, true},
		"attempt timeout":   {&timeoutError{}, true},
		"unknown authority": {&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, false},
		"TLS record":        {fmt.Errorf("x: %w", tls.RecordHeaderError{}), false},
	} {
		if got := RetryableError(c.err); got != c.want {
			t.Errorf("%s: RetryableError = %v, want %v", name, got, c.want)
		}
	}
}
