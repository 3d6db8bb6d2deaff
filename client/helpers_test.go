package client

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeClock replaces the Transport's clock, sleep and jitter: sleeping
// advances the clock at once and is recorded.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
	// onSleep, when set, runs before a sleep returns; its error is returned.
	onSleep func(ctx context.Context) error
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	hook := c.onSleep
	c.mu.Unlock()
	if hook != nil {
		if err := hook(ctx); err != nil {
			return err
		}
	}
	return ctx.Err()
}

func (c *fakeClock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

// maxJitter makes every wait the full ceiling, so waits are predictable.
func maxJitter(n int64) int64 { return n - 1 }

// newTest returns a Transport with a fake clock starting now and the
// largest jitter.
func newTest(t *testing.T, opts ...Option) (*Transport, *fakeClock) {
	t.Helper()
	tr, err := New(opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	clk := &fakeClock{now: time.Now()}
	tr.now, tr.sleep, tr.jitter = clk.Now, clk.Sleep, maxJitter
	return tr, clk
}

// noKeepAlive is a base transport that dials a new connection for every
// attempt, so that net/http never resends a request on its own after a
// reused connection fails and the server counts exactly the attempts.
func noKeepAlive(t *testing.T) *http.Transport {
	t.Helper()
	b := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(b.CloseIdleConnections)
	return b
}

// seen is one request as a scripted server saw it.
type seen struct {
	Method, Path, Key, Body string
}

// script is a test server that answers each request with the next step,
// repeating the last one, and records what it saw. A step of -1 drops the
// connection without an answer.
type script struct {
	mu    sync.Mutex
	steps []step
	reqs  []seen
}

type step struct {
	status int
	header map[string]string
	body   string
}

const drop = -1

func newScript(t *testing.T, steps ...step) (*script, *httptest.Server) {
	s := &script{steps: steps}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, srv
}

func (s *script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	i := min(len(s.reqs), len(s.steps)-1)
	s.reqs = append(s.reqs, seen{r.Method, r.URL.Path, r.Header.Get("Idempotency-Key"), string(b)})
	st := s.steps[i]
	s.mu.Unlock()
	if st.status == drop {
		dropConn(w)
		return
	}
	for k, v := range st.header {
		w.Header().Set(k, v)
	}
	w.WriteHeader(st.status)
	io.WriteString(w, st.body)
}

func (s *script) Seen() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.reqs...)
}

// dropConn closes the connection under w without writing anything.
func dropConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	conn.Close()
}

// rtFunc is a RoundTripper made of a function.
type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// trackedBody is a response or request body that records whether it was
// read to the end and closed.
type trackedBody struct {
	r      io.Reader
	mu     sync.Mutex
	closed bool
}

func newTracked(s string) *trackedBody { return &trackedBody{r: strings.NewReader(s)} }

func (b *trackedBody) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b *trackedBody) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	return nil
}

func (b *trackedBody) Closed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// response makes a response to req with status and body.
func response(req *http.Request, status int, body io.ReadCloser, header ...string) *http.Response {
	h := http.Header{}
	for i := 0; i+1 < len(header); i += 2 {
		h.Set(header[i], header[i+1])
	}
	return &http.Response{StatusCode: status, Header: h, Body: body, ContentLength: -1, Request: req}
}

// connReset is the error a reset connection gives.
var connReset = &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}

func post(t *testing.T, ctx context.Context, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the response body: %v", err)
	}
	return string(b)
}

func discardLogger() *log.Logger { return log.New(io.Discard, "", 0) }

func stringsReader(s string) io.Reader { return strings.NewReader(s) }
