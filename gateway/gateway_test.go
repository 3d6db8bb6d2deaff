package gateway

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
)

// front serves g as a reverse proxy.
func front(t *testing.T, g *Gateway) *httptest.Server {
	t.Helper()
	p := g.ReverseProxy()
	p.ErrorLog = discardLog
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv
}

func do(t *testing.T, req *http.Request) answer {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	return read(t, resp)
}

func checkProblem(t *testing.T, a answer, status int, code string) {
	t.Helper()
	if a.Status != status || a.Problem.Code != code {
		t.Fatalf("got %d %q (%s), want %d %s", a.Status, a.Problem.Code, a.Body, status, code)
	}
	p := a.Problem
	if p.Type != idemkey.ProblemTypePrefix+code || p.Title == "" || p.Status != status || p.Detail == "" {
		t.Errorf("problem %+v: want type, title, status and detail", p)
	}
	if ct := a.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q", ct)
	}
}

// TestKeyedLostReplyIsReplayedByAnotherUpstream: instance a runs the
// payment and its reply is lost; the gateway sends the same key and body
// to b, which replays a's kept answer. The handler ran once.
func TestKeyedLostReplyIsReplayedByAnotherUpstream(t *testing.T) {
	app := newPayments(t)
	a, b := startInstance(t, "a", app), startInstance(t, "b", app)
	a.lose.Store(1)
	var seen failures
	g, _ := newGateway(t, []string{a.URL(), b.URL()}, WithObserver(seen.observe))
	srv := front(t, g)

	got := do(t, postReq(t, context.Background(), srv.URL+"/payments", "pay-1", `{"amount":10}`))
	if got.Status != http.StatusCreated || got.Header.Get(idemkey.HeaderReplayed) != "true" || got.Instance != "a" {
		t.Errorf("got %d replayed=%q from %q, want a's kept 201 replayed (by b)", got.Status, got.Header.Get(idemkey.HeaderReplayed), got.Instance)
	}
	// b replayed rather than refusing with 422: it got the same key and body.
	if runs := app.Runs("pay-1"); runs != 1 {
		t.Errorf("the handler ran %d times, want once", runs)
	}
	if a.seen.Load() != 1 || b.seen.Load() != 1 {
		t.Errorf("a saw %d, b %d; want 1 and 1", a.seen.Load(), b.seen.Load())
	}
	f := seen.List()
	if len(f) != 1 || f[0].Upstream != a.URL() || !f[0].Keyed || !f[0].Sent || !f[0].Next || f[0].Attempt != 1 {
		t.Errorf("failures %+v, want a's lost reply, sent, keyed, failed over", f)
	}
}

// TestUnkeyedLostReplyIs502: without a key the gateway cannot know whether
// the mutation ran, so it does not send it again: 502 upstream_reply_lost,
// and the handler ran once.
func TestUnkeyedLostReplyIs502(t *testing.T) {
	for _, c := range []struct {
		name string
		key  string
		opts []Option
	}{
		{"no key", "", nil},
		{"a key the route does not honour", "note-1", []Option{WithCovered(func(r *http.Request) bool { return r.URL.Path != "/notes" })}},
	} {
		t.Run(c.name, func(t *testing.T) {
			app := newPayments(t)
			a, b := startInstance(t, "a", app), startInstance(t, "b", app)
			a.lose.Store(1)
			g, _ := newGateway(t, []string{a.URL(), b.URL()}, c.opts...)
			got := do(t, postReq(t, context.Background(), front(t, g).URL+"/notes", c.key, `{"note":1}`))
			checkProblem(t, got, http.StatusBadGateway, CodeReplyLost)
			if runs := app.Runs(c.key); runs != 1 || a.seen.Load() != 1 || b.seen.Load() != 0 {
				t.Errorf("%d runs, a saw %d, b %d; want 1 run on a, nothing on b", runs, a.seen.Load(), b.seen.Load())
			}
		})
	}
}

// TestRefusedUpstreamIsSkipped: a refused connection sent nothing, so every
// request, unkeyed mutations included, goes on to the next upstream.
func TestRefusedUpstreamIsSkipped(t *testing.T) {
	app := newPayments(t)
	b := startInstance(t, "b", app)
	refused := refusedAddr(t)
	for _, c := range []struct {
		method, path, key string
	}{
		{http.MethodPost, "/payments", "pay-2"},
		{http.MethodPost, "/notes", ""},
		{http.MethodGet, "/payments", ""},
	} {
		t.Run(c.method+" "+c.path+" "+c.key, func(t *testing.T) {
			var seen failures
			g, _ := newGateway(t, []string{refused, b.URL()}, WithObserver(seen.observe))
			req, _ := http.NewRequest(c.method, front(t, g).URL+c.path, strings.NewReader(`{"amount":7}`))
			if c.key != "" {
				req.Header.Set(idemkey.Header, c.key)
			}
			got := do(t, req)
			if got.Status/100 != 2 || got.Instance != "b" {
				t.Fatalf("got %d from %q (%s), want b's answer", got.Status, got.Instance, got.Body)
			}
			if c.method == http.MethodPost && !strings.Contains(got.Body, `"body":"{\"amount\":7}"`) {
				t.Errorf("b got another body: %s", got.Body)
			}
			f := seen.List()
			if len(f) != 1 || f[0].Upstream != refused || f[0].Sent || !f[0].Next {
				t.Errorf("failures %+v, want the refused upstream, nothing sent, failed over", f)
			}
		})
	}
	if runs := app.Runs(""); runs != 1 {
		t.Errorf("unkeyed handler ran %d times, want once", runs)
	}
}

// TestReadFailsOver: a GET whose connection fails, before or after the
// handler ran, is sent to the next upstream.
func TestReadFailsOver(t *testing.T) {
	for name, fail := range map[string]func(*instance){
		"reply lost":                  func(in *instance) { in.lose.Store(1) },
		"connection closed, unserved": func(in *instance) { in.drop.Store(1) },
	} {
		t.Run(name, func(t *testing.T) {
			app := newPayments(t)
			a, b := startInstance(t, "a", app), startInstance(t, "b", app)
			fail(a)
			var seen failures
			g, _ := newGateway(t, []string{a.URL(), b.URL()}, WithObserver(seen.observe))
			req, _ := http.NewRequest(http.MethodGet, front(t, g).URL+"/payments", nil)
			got := do(t, req)
			if got.Status != http.StatusOK || got.Instance != "b" {
				t.Errorf("got %d from %q, want 200 from b", got.Status, got.Instance)
			}
			if f := seen.List(); len(f) != 1 || !f[0].Sent || f[0].Keyed || !f[0].Next {
				t.Errorf("failures %+v, want one sent read, failed over", f)
			}
		})
	}
}

// TestDeadlineBoundsTheAttempts: the first upstream never answers; when the
// request's deadline passes the gateway stops, and tries no other.
func TestDeadlineBoundsTheAttempts(t *testing.T) {
	for _, c := range []struct {
		name, path, key string
		status          int
		code            string
	}{
		{"keyed", "/payments", "pay-3", http.StatusGatewayTimeout, CodeTimeout},
		{"read", "/payments", "", http.StatusGatewayTimeout, CodeTimeout},
		{"unkeyed: it may have run", "/notes", "", http.StatusBadGateway, CodeReplyLost},
	} {
		t.Run(c.name, func(t *testing.T) {
			app := newPayments(t)
			b := startInstance(t, "b", app)
			hanging, hung := hangingAddr(t)
			var seen failures
			g, _ := newGateway(t, []string{hanging, b.URL()}, WithObserver(seen.observe))
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			req := postReq(t, ctx, "http://gateway"+c.path, c.key, "{}")
			if c.name == "read" {
				req.Method, req.Body, req.GetBody, req.ContentLength = http.MethodGet, http.NoBody, nil, 0
			}
			resp, err := g.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			checkProblem(t, read(t, resp), c.status, c.code)
			if hung.Load() != 1 || b.seen.Load() != 0 {
				t.Errorf("the hanging upstream saw %d, b %d; want 1 and 0", hung.Load(), b.seen.Load())
			}
			if f := seen.List(); len(f) != 1 || f[0].Upstream != hanging || f[0].Next {
				t.Errorf("failures %+v, want one attempt, on the hanging upstream, and no other", f)
			}
			if g.upstreams[0].downUntil.Load() != 0 {
				t.Error("the request's own deadline put its upstream in cool-off")
			}
		})
	}
}

// TestAttemptsAreBounded: at most the maximum attempts, each upstream at
// most once, then 503 upstream_unavailable.
func TestAttemptsAreBounded(t *testing.T) {
	for _, c := range []struct {
		upstreams, max, dials int
	}{
		{4, DefaultMaxAttempts, 3},
		{3, 2, 2},
		{2, 5, 2},
		{3, 1, 1},
	} {
		d, tr := newDialCounter()
		urls := refusedAddrs(t, c.upstreams)
		g, _ := newGateway(t, urls, WithTransport(tr), WithMaxAttempts(c.max))
		resp, err := g.RoundTrip(postReq(t, context.Background(), "http://gateway/payments", "pay-4", "{}"))
		if err != nil {
			t.Fatal(err)
		}
		got := read(t, resp)
		checkProblem(t, got, http.StatusServiceUnavailable, CodeUnavailable)
		if got.Header.Get("Retry-After") != "1" {
			t.Errorf("Retry-After %q, want 1", got.Header.Get("Retry-After"))
		}
		total := 0
		for _, u := range urls {
			if n := d.Dials(u); n > 1 {
				t.Errorf("%d upstreams, max %d: %s dialled %d times", c.upstreams, c.max, u, n)
			}
			total += d.Dials(u)
		}
		if total != c.dials {
			t.Errorf("%d upstreams, max %d: %d attempts, want %d", c.upstreams, c.max, total, c.dials)
		}
	}
}

// TestFailingUpstreamIsSkippedDuringItsCoolOff: once an upstream has
// failed, requests go to the others until its cool-off ends (on a fake
// clock); then it gets its turn again.
func TestFailingUpstreamIsSkippedDuringItsCoolOff(t *testing.T) {
	app := newPayments(t)
	b := startInstance(t, "b", app)
	refused := refusedAddr(t)
	d, tr := newDialCounter()
	g, clk := newGateway(t, []string{refused, b.URL()}, WithTransport(tr))
	get := func() {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://gateway/payments", nil)
		resp, err := g.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		if got := read(t, resp); got.Status != http.StatusOK || got.Instance != "b" {
			t.Fatalf("got %d from %q, want b's 200", got.Status, got.Instance)
		}
	}
	get() // the refused upstream's turn: it fails, b answers
	if n := d.Dials(refused); n != 1 {
		t.Fatalf("refused upstream dialled %d times, want 1", n)
	}
	for range 6 { // three of these would be its turn
		get()
	}
	clk.Advance(DefaultCoolOff - time.Nanosecond)
	get()
	get()
	if n := d.Dials(refused); n != 1 {
		t.Errorf("during the cool-off the failing upstream was dialled %d more times, want none", n-1)
	}
	clk.Advance(time.Nanosecond)
	get()
	get()
	if n := d.Dials(refused); n != 2 {
		t.Errorf("after the cool-off the upstream was dialled %d more times, want 1", n-1)
	}
	if b.seen.Load() != 11 {
		t.Errorf("b saw %d requests, want all 11", b.seen.Load())
	}
}

// TestCoolingUpstreamsAreTriedWhenNoneIsHealthy: a gateway whose every
// upstream is cooling off still tries them, soonest back first, rather
// than refusing what one of them may serve.
func TestCoolingUpstreamsAreTriedWhenNoneIsHealthy(t *testing.T) {
	app := newPayments(t)
	a, b := startInstance(t, "a", app), startInstance(t, "b", app)
	a.Stop()
	b.Stop()
	g, clk := newGateway(t, []string{a.URL(), b.URL()})
	resp, err := g.RoundTrip(postReq(t, context.Background(), "http://gateway/payments", "pay-5", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	checkProblem(t, read(t, resp), http.StatusServiceUnavailable, CodeUnavailable)
	clk.Advance(time.Second) // both still cooling off; a is back soonest
	b.Start(t)
	resp, err = g.RoundTrip(postReq(t, context.Background(), "http://gateway/payments", "pay-5", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	if got := read(t, resp); got.Status != http.StatusCreated || got.Instance != "b" {
		t.Errorf("got %d from %q, want b's 201", got.Status, got.Instance)
	}
	if g.upstreams[1].downUntil.Load() != 0 || g.upstreams[0].downUntil.Load() == 0 {
		t.Error("b's answer did not end its cool-off, or a's failure did not extend its own")
	}
}

// TestOverLimitBodyIsSentOnce: a body longer than the buffer limit is
// streamed to one upstream and never sent again, even with a key.
func TestOverLimitBodyIsSentOnce(t *testing.T) {
	app := newPayments(t)
	a, b := startInstance(t, "a", app), startInstance(t, "b", app)
	a.lose.Store(1)
	g, _ := newGateway(t, []string{a.URL(), b.URL()}, WithMaxRequestBody(8))
	const body = `{"amount":123456}`
	req := postReq(t, context.Background(), "http://gateway/payments", "pay-6", body)
	req.GetBody = nil // as a server's request: nothing to make it again
	req.ContentLength = -1
	resp, err := g.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	checkProblem(t, read(t, resp), http.StatusServiceUnavailable, CodeUnavailable)
	if app.Runs("pay-6") != 1 || a.seen.Load() != 1 || b.seen.Load() != 0 {
		t.Errorf("%d runs, a saw %d, b %d; want one attempt, on a", app.Runs("pay-6"), a.seen.Load(), b.seen.Load())
	}
}

// TestMaybeSentIsNeverResentUnkeyed: a connection that was made and then
// closed before anything came back may have carried the request; an
// unkeyed mutation is not sent elsewhere.
func TestMaybeSentIsNeverResentUnkeyed(t *testing.T) {
	app := newPayments(t)
	b := startInstance(t, "b", app)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	defer wg.Wait()
	defer ln.Close()
	var seen failures
	g, _ := newGateway(t, []string{"http://" + ln.Addr().String(), b.URL()}, WithObserver(seen.observe))
	resp, err := g.RoundTrip(postReq(t, context.Background(), "http://gateway/notes", "", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	checkProblem(t, read(t, resp), http.StatusBadGateway, CodeReplyLost)
	if b.seen.Load() != 0 {
		t.Errorf("b saw %d requests, want none", b.seen.Load())
	}
	if f := seen.List(); len(f) != 1 || !f[0].Sent || f[0].Next {
		t.Errorf("failures %+v, want one sent attempt, not failed over", f)
	}
}

// TestCancelledRequestIsAnError: a caller that gives up gets its
// context's error, and its upstream is not blamed.
func TestCancelledRequestIsAnError(t *testing.T) {
	hanging, hung := hangingAddr(t)
	g, _ := newGateway(t, []string{hanging})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		resp, err := g.RoundTrip(postReq(t, ctx, "http://gateway/payments", "pay-7", "{}"))
		if resp != nil {
			resp.Body.Close()
		}
		done <- err
	}()
	for hung.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want context.Canceled", err)
	}
	if g.upstreams[0].downUntil.Load() != 0 {
		t.Error("the caller's cancellation put the upstream in cool-off")
	}
}

// TestConcurrentKeyedRequestsThroughDyingUpstreams: 64 payments with
// distinct keys go through the gateway while its two upstreams die (each
// kills itself right after every 8th payment it makes, losing the replies
// in flight) and come back. The callers resend with the same key until they
// get an answer, as client.Transport does. Exactly 64 payments are made,
// one per key, and no keyed request is given up as a lost reply.
func TestConcurrentKeyedRequestsThroughDyingUpstreams(t *testing.T) {
	app := newPayments(t)
	a, b := startInstance(t, "a", app), startInstance(t, "b", app)
	var (
		mu     sync.Mutex
		made   int
		kills  int
		revive sync.WaitGroup
	)
	app.onRun = func(in *instance) {
		mu.Lock()
		made++
		kill := made%8 == 0
		if kill {
			kills++
		}
		mu.Unlock()
		if !kill {
			return
		}
		in.Stop()
		revive.Add(1)
		go func() {
			defer revive.Done()
			time.Sleep(2 * time.Millisecond)
			in.Start(t)
		}()
	}
	var seen failures
	g, _ := newGateway(t, []string{a.URL(), b.URL()}, WithObserver(seen.observe), WithCoolOff(time.Millisecond))
	srv := front(t, g)
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer c.CloseIdleConnections()

	const n = 64
	var wg sync.WaitGroup
	statuses := make([][]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "pay-c" + string(rune('A'+i/26)) + string(rune('a'+i%26))
			for try := 0; try < 1000; try++ {
				resp, err := c.Do(postReq(t, context.Background(), srv.URL+"/payments", key, `{"amount":1}`))
				if err != nil {
					t.Errorf("%s: %v", key, err)
					return
				}
				got := read(t, resp)
				statuses[i] = append(statuses[i], got.Status)
				switch got.Status {
				case http.StatusCreated:
					return
				case http.StatusConflict, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
					time.Sleep(time.Millisecond)
				default:
					t.Errorf("%s: got %d %s", key, got.Status, got.Body)
					return
				}
			}
			t.Errorf("%s: no answer after 1000 tries", key)
		}()
	}
	wg.Wait()
	revive.Wait()
	runs, keys := app.Total()
	if runs != n || keys != n {
		t.Errorf("%d payments for %d keys, want %d for %d", runs, keys, n, n)
	}
	for i := range n {
		if s := statuses[i]; len(s) == 0 || s[len(s)-1] != http.StatusCreated {
			t.Errorf("request %d ended with %v", i, s)
		}
	}
	lost := 0
	for _, f := range seen.List() {
		if f.Sent {
			lost++
		}
	}
	if kills != n/8 || lost == 0 {
		t.Errorf("%d kills and %d failed-over sent attempts; want %d kills that lost replies", kills, lost, n/8)
	}
	t.Logf("%d kills, %d failures seen by the gateway, %d of them after sending", kills, len(seen.List()), lost)
}

// TestRoundRobin: healthy upstreams share the requests in turn.
func TestRoundRobin(t *testing.T) {
	app := newPayments(t)
	a, b, c := startInstance(t, "a", app), startInstance(t, "b", app), startInstance(t, "c", app)
	g, _ := newGateway(t, []string{a.URL(), b.URL(), c.URL()})
	var order []string
	for range 6 {
		req, _ := http.NewRequest(http.MethodGet, "http://gateway/payments", nil)
		resp, err := g.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		order = append(order, read(t, resp).Instance)
	}
	if got := strings.Join(order, ""); got != "abcabc" {
		t.Errorf("requests went to %s, want abcabc", got)
	}
}

// TestBodyTooLargeForTheFront: the proxy's error handler answers a body
// over an http.MaxBytesReader limit with 413, and sends nothing upstream.
func TestBodyTooLargeForTheFront(t *testing.T) {
	app := newPayments(t)
	a := startInstance(t, "a", app)
	g, _ := newGateway(t, []string{a.URL()})
	srv := httptest.NewServer(http.MaxBytesHandler(g.ReverseProxy(), 4))
	defer srv.Close()
	req := postReq(t, context.Background(), srv.URL+"/payments", "pay-8", `{"amount":10}`)
	req.ContentLength = -1 // chunked: the limit trips while reading
	req.GetBody = nil
	req.Body = struct{ io.ReadCloser }{req.Body}
	checkProblem(t, do(t, req), http.StatusRequestEntityTooLarge, idemkey.CodeRequestTooLarge)
	if a.seen.Load() != 0 {
		t.Errorf("the upstream saw %d requests, want none", a.seen.Load())
	}
}

// TestConflictFromAnotherUpstreamPassesThrough: instance a dies while its
// payment is still running; the gateway sends the request to b, whose 409
// (the first run is in flight) goes back to the client as it is, with its
// Retry-After. Once a's handler has finished, the client's retry with the
// same key gets the replay from b. The handler ran once.
func TestConflictFromAnotherUpstreamPassesThrough(t *testing.T) {
	app := newPayments(t)
	a, b := startInstance(t, "a", app), startInstance(t, "b", app)
	started, hold := make(chan struct{}), make(chan struct{})
	var once sync.Once
	app.onRun = func(in *instance) {
		once.Do(func() {
			close(started)
			<-hold
		})
	}
	g, _ := newGateway(t, []string{a.URL(), b.URL()})
	srv := front(t, g)

	first := make(chan answer, 1)
	go func() { first <- do(t, postReq(t, context.Background(), srv.URL+"/payments", "pay-9", `{"amount":3}`)) }()
	<-started
	a.Stop() // the payment is still running on a
	got := <-first
	checkProblem(t, got, http.StatusConflict, "conflict")
	if got.Header.Get("Retry-After") == "" {
		t.Error("the 409 lost its Retry-After")
	}
	if a.seen.Load() != 1 || b.seen.Load() != 1 || app.Runs("pay-9") != 1 {
		t.Errorf("a saw %d, b %d, %d runs; want 1, 1 and 1", a.seen.Load(), b.seen.Load(), app.Runs("pay-9"))
	}

	close(hold) // a's handler returns and its answer is kept
	for try := 0; ; try++ {
		got = do(t, postReq(t, context.Background(), srv.URL+"/payments", "pay-9", `{"amount":3}`))
		if got.Status != http.StatusConflict || try == 1000 {
			break
		}
		time.Sleep(time.Millisecond) // until a's record is kept
	}
	if got.Status != http.StatusCreated || got.Header.Get(idemkey.HeaderReplayed) != "true" || got.Instance != "a" {
		t.Errorf("retry: %d replayed=%q from %q, want a's 201 replayed by b", got.Status, got.Header.Get(idemkey.HeaderReplayed), got.Instance)
	}
	if app.Runs("pay-9") != 1 {
		t.Errorf("the handler ran %d times, want once", app.Runs("pay-9"))
	}
}

// TestKeyLikeHeaderDoesNotLetTheTransportResend: net/http's Transport
// resends a request on its own, on a fresh connection, when a reused
// connection breaks before the response and the request looks idempotent
// to it, which any Idempotency-Key or X-Idempotency-Key header does,
// whatever its value. A mutation the gateway counts as unkeyed (a route
// whose upstream does not honour keys, another header name, an invalid
// key) must still reach its upstream once: the gateway answers 502 and
// the upstream ran it once.
func TestKeyLikeHeaderDoesNotLetTheTransportResend(t *testing.T) {
	var runs atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			io.WriteString(w, "ok")
			return
		}
		io.Copy(io.Discard, r.Body)
		runs.Add(1)
		// The mutation ran; its reply is lost with the connection.
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			c.Close()
		}
	}))
	defer srv.Close()
	cases := []struct {
		name, method, path, header, key, body string
	}{
		{"route not honoured, POST", http.MethodPost, "/raw", idemkey.Header, "k1", "charge"},
		{"route not honoured, DELETE without a body", http.MethodDelete, "/raw", idemkey.Header, "k2", ""},
		{"X-Idempotency-Key", http.MethodPost, "/payments", "X-Idempotency-Key", "k3", "charge"},
		{"two keys", http.MethodPatch, "/payments", idemkey.Header, "k4", "charge"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			runs.Store(0)
			g, _ := newGateway(t, []string{srv.URL}, WithCovered(func(r *http.Request) bool { return r.URL.Path != "/raw" }))
			// A first request leaves a kept-alive connection for the
			// mutation to reuse.
			get, _ := http.NewRequest(http.MethodGet, "http://gateway/prime", nil)
			if resp, err := g.RoundTrip(get); err != nil {
				t.Fatal(err)
			} else {
				read(t, resp)
			}
			var body io.Reader
			if c.body != "" {
				body = strings.NewReader(c.body)
			}
			req, err := http.NewRequest(c.method, "http://gateway"+c.path, body)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Add(c.header, c.key)
			if c.name == "two keys" {
				req.Header.Add(c.header, c.key+"-other")
			}
			resp, err := g.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			checkProblem(t, read(t, resp), http.StatusBadGateway, CodeReplyLost)
			if n := runs.Load(); n != 1 {
				t.Errorf("the upstream ran the unkeyed mutation %d times, want 1", n)
			}
		})
	}
}

// TestBrokenStreamedBodyIsTheClientsFault: a body too long to hold, whose
// reader fails midway (here the front server's MaxBytesReader), is the
// client's error, not the upstream's: the client gets 413 (400 for other
// read errors), keyed or not, and the upstream is not put in cool-off.
func TestBrokenStreamedBodyIsTheClientsFault(t *testing.T) {
	app := newPayments(t)
	a := startInstance(t, "a", app)
	for _, key := range []string{"", "pay-broken"} {
		g, _ := newGateway(t, []string{a.URL()}, WithMaxRequestBody(16))
		p := g.ReverseProxy()
		p.ErrorLog = discardLog
		srv := httptest.NewServer(http.MaxBytesHandler(p, 64))
		body := strings.Repeat("x", 200)
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(body))
		req.ContentLength = -1 // chunked: the limit is met while streaming
		if key != "" {
			req.Header.Set(idemkey.Header, key)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		checkProblem(t, read(t, resp), http.StatusRequestEntityTooLarge, idemkey.CodeRequestTooLarge)
		if g.upstreams[0].downUntil.Load() != 0 {
			t.Errorf("key %q: the client's broken body put the upstream in cool-off", key)
		}
		srv.Close()
	}
}
