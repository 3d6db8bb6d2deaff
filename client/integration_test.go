package client

// These tests run the client against servers wrapped by the real idemkey
// middleware with an in-memory store.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

// protected returns the middleware over an in-memory store.
func protected(t *testing.T, opts ...middleware.Option) *middleware.Middleware {
	t.Helper()
	st, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m, err := middleware.New(st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// lossyListener drops the connection of the first reply that is written to
// any of the first n accepted connections: the request reached the server
// and the handler ran, but its answer never leaves.
type lossyListener struct {
	net.Listener
	lose atomic.Int32
}

func (l *lossyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &lossyConn{Conn: c, l: l}, nil
}

type lossyConn struct {
	net.Conn
	l *lossyListener
}

func (c *lossyConn) Write(p []byte) (int, error) {
	if c.l.lose.Add(-1) >= 0 {
		c.Conn.Close()
		return 0, net.ErrClosed
	}
	return c.Conn.Write(p)
}

// lossyServer starts h behind a listener that loses the first n replies.
func lossyServer(t *testing.T, h http.Handler, n int32) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	l := &lossyListener{Listener: srv.Listener}
	l.lose.Store(n)
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func TestLostReplyIsReplayedAndTheHandlerRunsOnce(t *testing.T) {
	var runs atomic.Int32
	m := protected(t)
	srv := lossyServer(t, m.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"charge":`+strconv.Itoa(int(n))+`}`)
	})), 1)

	tr, _ := newTest(t, WithBase(noKeepAlive(t)))
	var trace Trace
	resp, err := tr.RoundTrip(post(t, WithTrace(context.Background(), &trace), srv.URL+"/charges", `{"amount":100}`))
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusCreated || body != `{"charge":1}` {
		t.Errorf("got %d %s, want the first run's 201 {\"charge\":1}", resp.StatusCode, body)
	}
	if !Replayed(resp) || !trace.Replayed {
		t.Error("the answer is not marked as a replay")
	}
	if runs.Load() != 1 {
		t.Errorf("handler ran %d times, want once", runs.Load())
	}
	if trace.Attempts != 2 {
		t.Errorf("%d attempts, want 2", trace.Attempts)
	}
}

func TestLostReplyOfAnUnkeyedPostIsNotRetried(t *testing.T) {
	var runs atomic.Int32
	m := protected(t)
	srv := lossyServer(t, m.Optional()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})), 1)
	tr, _ := newTest(t, WithBase(noKeepAlive(t)), WithoutAutoKey())
	var trace Trace
	resp, err := tr.RoundTrip(post(t, WithTrace(context.Background(), &trace), srv.URL, "{}"))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got %d, want the transport error", resp.StatusCode)
	}
	if runs.Load() != 1 || trace.Attempts != 1 || trace.Key != "" {
		t.Errorf("%d runs, trace %+v; want one unkeyed attempt", runs.Load(), trace)
	}
}

// inFlight starts a request with key that the handler holds until release
// is closed, and returns once the handler is running.
func inFlight(t *testing.T, url, key, body string, started <-chan struct{}) <-chan *http.Response {
	t.Helper()
	done := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, url, stringsReader(body))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			done <- nil
			return
		}
		done <- resp
	}()
	<-started
	return done
}

// holdingServer serves m over a handler whose first run waits until
// release is called (at the latest when the test ends) and then answers 201
// "done". It returns the release function and the count of runs.
func holdingServer(t *testing.T, m *middleware.Middleware) (srv *httptest.Server, started <-chan struct{}, release func(), runs *atomic.Int32) {
	t.Helper()
	start, hold := make(chan struct{}), make(chan struct{})
	runs = new(atomic.Int32)
	srv = httptest.NewServer(m.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(start)
			<-hold
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "done")
	})))
	t.Cleanup(srv.Close)
	release = sync.OnceFunc(func() { close(hold) })
	t.Cleanup(release) // runs before srv.Close
	return srv, start, release, runs
}

func TestConflictThenSuccessHonoursRetryAfter(t *testing.T) {
	srv, started, release, runs := holdingServer(t, protected(t))
	first := inFlight(t, srv.URL, "op-1", "{}", started)

	// Record each answer's Retry-After; on the wait, let the first request
	// finish so that the retry finds its kept answer.
	var afters []string
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := http.DefaultTransport.RoundTrip(r)
		if err == nil {
			afters = append(afters, resp.Header.Get("Retry-After"))
		}
		return resp, err
	})
	tr, clk := newTest(t, WithBase(base))
	clk.onSleep = func(context.Context) error {
		release()
		if resp := <-first; resp != nil {
			resp.Body.Close()
		}
		return nil
	}
	var trace Trace
	resp, err := tr.RoundTrip(post(t, WithTrace(WithKey(context.Background(), "op-1"), &trace), srv.URL, "{}"))
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != http.StatusCreated || body != "done" || !Replayed(resp) {
		t.Errorf("got %d %q replayed %v, want the first request's kept 201", resp.StatusCode, body, Replayed(resp))
	}
	if len(afters) != 2 || afters[0] == "" {
		t.Fatalf("Retry-After of the answers: %q, want one on the 409", afters)
	}
	secs, err := strconv.Atoi(afters[0])
	if err != nil || secs < 1 {
		t.Fatalf("Retry-After %q is not whole seconds", afters[0])
	}
	if got := clk.Sleeps(); !slices.Equal(got, []time.Duration{time.Duration(secs)*time.Second + 100*time.Millisecond - 1}) {
		t.Errorf("waits = %v, want the server's %ds and the first backoff", got, secs)
	}
	if runs.Load() != 1 || trace.Attempts != 2 {
		t.Errorf("%d runs, %d attempts; want 1 and 2", runs.Load(), trace.Attempts)
	}
}

func TestConflictPastTheDeadlineWaitsWhatItCanAndTriesOnceMore(t *testing.T) {
	srv, started, release, runs := holdingServer(t, protected(t, middleware.WithDeadline(time.Minute)))
	first := inFlight(t, srv.URL, "op-2", "{}", started)
	defer func() {
		release()
		if resp := <-first; resp != nil {
			resp.Body.Close()
		}
	}()

	// The server's hint is at least a second; the caller gives the whole
	// call half a second of the fake clock: the transport waits what it can
	// (less room for an attempt) and tries once more.
	tr, clk := newTest(t, WithRetryAfterLimit(time.Hour))
	ctx, cancel := context.WithDeadline(context.Background(), clk.Now().Add(500*time.Millisecond))
	defer cancel()
	resp, err := tr.RoundTrip(post(t, WithKey(ctx, "op-2"), srv.URL, "{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Errorf("got %d, want the 409", resp.StatusCode)
	}
	if n, _ := strconv.Atoi(resp.Header.Get("Retry-After")); n < 1 {
		t.Errorf("Retry-After %q, want at least a second", resp.Header.Get("Retry-After"))
	}
	want := []time.Duration{500*time.Millisecond - minAttemptRoom}
	if !slices.Equal(clk.Sleeps(), want) || runs.Load() != 1 {
		t.Errorf("waits %v, %d runs; want %v and only the first run", clk.Sleeps(), runs.Load(), want)
	}
}

func TestGetThroughTheMiddlewareIsRetried(t *testing.T) {
	var runs atomic.Int32
	m := protected(t)
	srv := httptest.NewServer(m.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) < 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "thing")
	})))
	defer srv.Close()
	tr, _ := newTest(t)
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/things/1", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK || body != "thing" || runs.Load() != 3 {
		t.Errorf("got %d %q after %d runs, want 200 thing after 3", resp.StatusCode, body, runs.Load())
	}
}

func TestMiddlewareRefusalsAreNotRetried(t *testing.T) {
	var runs atomic.Int32
	m := protected(t)
	srv := httptest.NewServer(m.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()
	tr, _ := newTest(t, WithoutAutoKey())

	// No key on a required route: 400, once.
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || runs.Load() != 0 {
		t.Errorf("got %d with %d runs, want 400 and none", resp.StatusCode, runs.Load())
	}
	// The same key with another body: 422, once, after the first run.
	for i, body := range []string{`{"a":1}`, `{"a":2}`} {
		var trace Trace
		resp, err := tr.RoundTrip(post(t, WithTrace(WithKey(context.Background(), "op-3"), &trace), srv.URL, body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := []int{http.StatusCreated, http.StatusUnprocessableEntity}[i]
		if resp.StatusCode != want || trace.Attempts != 1 {
			t.Errorf("request %d: got %d after %d attempts, want %d after 1", i+1, resp.StatusCode, trace.Attempts, want)
		}
	}
	if runs.Load() != 1 {
		t.Errorf("handler ran %d times, want once", runs.Load())
	}
}

// TestDerivedKeysAcrossARetriedRequest runs a service that makes three
// calls to a downstream service while serving a keyed request, fails, and
// is retried by its caller: the retry sends the same three keys downstream,
// which replays instead of acting again.
func TestDerivedKeysAcrossARetriedRequest(t *testing.T) {
	var (
		mu   sync.Mutex
		sent = map[string][]string{} // downstream path: keys seen
		runs = map[string]int{}      // downstream path: handler runs
	)
	down := protected(t)
	downstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sent[r.URL.Path] = append(sent[r.URL.Path], r.Header.Get("Idempotency-Key"))
		mu.Unlock()
		down.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			runs[r.URL.Path]++
			mu.Unlock()
			w.WriteHeader(http.StatusCreated)
		})).ServeHTTP(w, r)
	}))
	defer downstream.Close()

	// The downstream's first answer to each call is lost once, so every call
	// is retried within one run of the upstream handler too.
	var lostMu sync.Mutex
	lost := map[string]bool{}
	lossy := rtFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := http.DefaultTransport.RoundTrip(r)
		lostMu.Lock()
		defer lostMu.Unlock()
		if err == nil && !lost[r.URL.Path] {
			lost[r.URL.Path] = true
			discard(resp)
			return nil, io.ErrUnexpectedEOF
		}
		return resp, err
	})
	out, _ := newTest(t, WithBase(lossy))
	outbound := &http.Client{Transport: out}

	var incoming []idemkey.Key
	var upstreamRuns atomic.Int32
	var replays [][]bool
	up := protected(t)
	upstream := httptest.NewServer(up.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, _ := idemkey.FromContext(r.Context())
		mu.Lock()
		incoming = append(incoming, k)
		mu.Unlock()
		var rep []bool
		for _, call := range []struct{ name, path string }{{"charge", "/charge"}, {"receipt", "/receipt"}, {"", "/audit"}} {
			ctx := r.Context()
			if call.name != "" {
				ctx = WithCallName(ctx, call.name)
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, downstream.URL+call.path, stringsReader("{}"))
			resp, err := outbound.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			rep = append(rep, Replayed(resp))
		}
		mu.Lock()
		replays = append(replays, rep)
		mu.Unlock()
		if upstreamRuns.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable) // released: the retry runs again
			return
		}
		w.WriteHeader(http.StatusOK)
	})))
	defer upstream.Close()

	caller, _ := newTest(t)
	var trace Trace
	resp, err := caller.RoundTrip(post(t, WithTrace(WithKey(context.Background(), "order-9"), &trace), upstream.URL+"/orders", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || trace.Attempts != 2 || upstreamRuns.Load() != 2 {
		t.Fatalf("upstream: %d after %d attempts and %d runs, want 200 after 2 and 2", resp.StatusCode, trace.Attempts, upstreamRuns.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(incoming) != 2 || incoming[0] != incoming[1] || incoming[0].Value != "order-9" {
		t.Fatalf("incoming keys %v", incoming)
	}
	in := incoming[0]
	want := map[string]string{
		"/charge":  in.Derive("charge"),
		"/receipt": in.Derive("receipt"),
		"/audit":   in.Derive("POST " + downstreamHost(downstream) + "/audit"),
	}
	for path, key := range want {
		// First run: the lost answer and its retry; second run: one call.
		if got := sent[path]; len(got) != 3 || got[0] != key || got[1] != key || got[2] != key {
			t.Errorf("%s got keys %v, want %s three times", path, got, key)
		}
		if runs[path] != 1 {
			t.Errorf("%s ran %d times, want once", path, runs[path])
		}
	}
	if want["/charge"] == want["/receipt"] || want["/charge"] == want["/audit"] || want["/receipt"] == want["/audit"] {
		t.Error("two calls share a derived key")
	}
	if !slices.Equal(replays[0], []bool{true, true, true}) || !slices.Equal(replays[1], []bool{true, true, true}) {
		t.Errorf("replays seen by the upstream: %v, want every call's answer a replay", replays)
	}
}

func downstreamHost(s *httptest.Server) string {
	req, _ := http.NewRequest(http.MethodGet, s.URL, nil)
	return req.URL.Host
}

// TestQuotedKeyReachesTheHandler: a key the bare form cannot carry reaches
// the middleware intact, and a lost reply is replayed under it.
func TestQuotedKeyReachesTheHandler(t *testing.T) {
	var runs atomic.Int32
	var seen []string
	var mu sync.Mutex
	m := protected(t)
	srv := lossyServer(t, m.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		k, _ := idemkey.FromContext(r.Context())
		mu.Lock()
		seen = append(seen, k.Value)
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	})), 1)
	tr, _ := newTest(t, WithBase(noKeepAlive(t)))
	const key = `order "9", line 2 `
	resp, err := tr.RoundTrip(post(t, WithKey(context.Background(), key), srv.URL, "{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || !Replayed(resp) || runs.Load() != 1 {
		t.Errorf("got %d replayed %v after %d runs, want the kept 201 after one run", resp.StatusCode, Replayed(resp), runs.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(seen, []string{key}) {
		t.Errorf("the handler saw keys %q, want [%q]", seen, key)
	}
}

// TestSlowFirstRunOnAFastRouteIsWaitedFor is the case of the report: a
// route whose first runs take milliseconds, then one that takes seconds.
// A repeat used to get 409 with Retry-After 35 (the claim's whole life),
// which a caller with a 30 s budget gave up on at once, in milliseconds,
// although the first run answered soon after. The hint is now short, and
// the transport waits for the answer.
func TestSlowFirstRunOnAFastRouteIsWaitedFor(t *testing.T) {
	m := protected(t)
	started, hold := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	var runs atomic.Int32
	srv := httptest.NewServer(m.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if r.Header.Get("Idempotency-Key") == "slow" {
			close(started)
			<-hold
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "done")
	})))
	t.Cleanup(srv.Close)
	t.Cleanup(release)
	for i := range 3 { // the route's first runs: fast
		resp := <-inFlight(t, srv.URL, fmt.Sprint("warm-", i), "{}", closedChan)
		resp.Body.Close()
	}
	first := inFlight(t, srv.URL, "slow", "{}", started)

	var afters []string
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := http.DefaultTransport.RoundTrip(r)
		if err == nil {
			afters = append(afters, resp.Header.Get("Retry-After"))
		}
		return resp, err
	})
	tr, clk := newTest(t, WithBase(base))
	clk.onSleep = func(context.Context) error {
		// While the caller waits, the first run answers.
		release()
		if resp := <-first; resp != nil {
			resp.Body.Close()
		}
		return nil
	}
	ctx, cancel := context.WithDeadline(context.Background(), clk.Now().Add(30*time.Second))
	defer cancel()
	resp, err := tr.RoundTrip(post(t, WithKey(ctx, "slow"), srv.URL, "{}"))
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != http.StatusCreated || body != "done" || !Replayed(resp) {
		t.Errorf("got %d %q replayed %v, want the first run's kept 201", resp.StatusCode, body, Replayed(resp))
	}
	if len(afters) != 2 || afters[0] != "1" {
		t.Errorf("Retry-After of the answers %q, want 1 on the 409", afters)
	}
	if runs.Load() != 4 {
		t.Errorf("%d runs, want 4 (3 warm, 1 slow)", runs.Load())
	}
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()
