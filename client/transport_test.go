package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
)

func TestKeyedPostKeepsItsKeyAcrossRetries(t *testing.T) {
	s, srv := newScript(t,
		step{status: http.StatusServiceUnavailable},
		step{status: http.StatusBadGateway},
		step{status: http.StatusGatewayTimeout},
		step{status: http.StatusCreated, body: "made"})
	tr, clk := newTest(t, WithBase(noKeepAlive(t)))
	var trace Trace
	resp, err := tr.RoundTrip(post(t, WithTrace(context.Background(), &trace), srv.URL+"/charges", `{"amount":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated || readAll(t, resp) != "made" {
		t.Fatalf("final response %d, want 201 made", resp.StatusCode)
	}
	got := s.Seen()
	if len(got) != 4 {
		t.Fatalf("server saw %d attempts, want 4", len(got))
	}
	for i, r := range got {
		if r.Key == "" || r.Key != got[0].Key {
			t.Errorf("attempt %d key %q, want %q on every attempt", i+1, r.Key, got[0].Key)
		}
		if r.Body != `{"amount":1}` {
			t.Errorf("attempt %d body %q, want the full body", i+1, r.Body)
		}
	}
	if trace.Attempts != 4 || trace.Key != got[0].Key || trace.Replayed {
		t.Errorf("trace = %+v, want 4 attempts with key %q, not replayed", trace, got[0].Key)
	}
	wantSleeps := []time.Duration{100*time.Millisecond - 1, 200*time.Millisecond - 1, 400*time.Millisecond - 1}
	if !slices.Equal(clk.Sleeps(), wantSleeps) {
		t.Errorf("waits = %v, want %v", clk.Sleeps(), wantSleeps)
	}
	if trace.Waited != wantSleeps[0]+wantSleeps[1]+wantSleeps[2] {
		t.Errorf("trace.Waited = %v", trace.Waited)
	}
}

func TestKeyedPostRetriedAfterDroppedConnection(t *testing.T) {
	s, srv := newScript(t, step{status: drop}, step{status: drop}, step{status: http.StatusOK, body: "ok"})
	tr, _ := newTest(t, WithBase(noKeepAlive(t)))
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "b"))
	if err != nil {
		t.Fatal(err)
	}
	if readAll(t, resp) != "ok" {
		t.Error("did not get the final answer")
	}
	got := s.Seen()
	if len(got) != 3 || got[0].Key == "" || got[1].Key != got[0].Key || got[2].Key != got[0].Key {
		t.Errorf("server saw %+v, want 3 attempts with one key", got)
	}
}

func TestTransportErrorsOfAKeyedMutationAreRetried(t *testing.T) {
	for name, fail := range map[string]error{
		"connection reset":  connReset,
		"EOF":               io.ErrUnexpectedEOF,
		"attempt timeout":   &timeoutError{},
		"other context end": context.DeadlineExceeded, // not the caller's context
	} {
		t.Run(name, func(t *testing.T) {
			n := 0
			tr, _ := newTest(t, WithBase(rtFunc(func(r *http.Request) (*http.Response, error) {
				n++
				if n == 1 {
					return nil, fail
				}
				return response(r, http.StatusOK, http.NoBody), nil
			})))
			resp, err := tr.RoundTrip(post(t, context.Background(), "http://127.0.0.1:1/", "b"))
			if err != nil || resp.StatusCode != http.StatusOK || n != 2 {
				t.Errorf("RoundTrip = %v, %v after %d attempts; want 200 after 2", resp, err, n)
			}
		})
	}
}

type timeoutError struct{}

func (*timeoutError) Error() string   { return "i/o timeout" }
func (*timeoutError) Timeout() bool   { return true }
func (*timeoutError) Temporary() bool { return true }

func TestUnkeyedMutationIsSentOnce(t *testing.T) {
	always := WithRetryPolicy(func(Attempt) bool { return true })
	for name, st := range map[string]step{
		"dropped connection": {status: drop},
		"503":                {status: http.StatusServiceUnavailable},
		"409":                {status: http.StatusConflict, header: map[string]string{"Retry-After": "1"}},
	} {
		t.Run(name, func(t *testing.T) {
			s, srv := newScript(t, st, step{status: http.StatusOK})
			tr, clk := newTest(t, WithBase(noKeepAlive(t)), WithoutAutoKey(), always)
			var trace Trace
			resp, err := tr.RoundTrip(post(t, WithTrace(context.Background(), &trace), srv.URL, "b"))
			if st.status == drop {
				if err == nil {
					t.Fatalf("got %d, want the transport error", resp.StatusCode)
				}
			} else if err != nil || resp.StatusCode != st.status {
				t.Fatalf("RoundTrip = %v, %v; want the first answer, %d", resp, err, st.status)
			} else {
				resp.Body.Close()
			}
			if got := s.Seen(); len(got) != 1 || got[0].Key != "" {
				t.Errorf("server saw %+v, want one attempt without a key", got)
			}
			if trace.Attempts != 1 || trace.Key != "" || len(clk.Sleeps()) != 0 {
				t.Errorf("trace %+v, waits %v; want 1 attempt, no key, no wait", trace, clk.Sleeps())
			}
		})
	}
}

func TestReadsAreRetriedWithoutAKey(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodOptions, ""} {
		t.Run("method "+method, func(t *testing.T) {
			s, srv := newScript(t, step{status: drop}, step{status: http.StatusServiceUnavailable},
				step{status: http.StatusTooManyRequests}, step{status: http.StatusOK})
			tr, _ := newTest(t, WithBase(noKeepAlive(t)))
			req, _ := http.NewRequest(method, srv.URL+"/things", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("status %d, want 200", resp.StatusCode)
			}
			got := s.Seen()
			if len(got) != 4 {
				t.Fatalf("server saw %d attempts, want 4", len(got))
			}
			for _, r := range got {
				if r.Key != "" {
					t.Errorf("a read was sent with key %q", r.Key)
				}
			}
		})
	}
}

func TestFinalStatusesAreNotRetried(t *testing.T) {
	for _, c := range []struct {
		method string
		status int
		header map[string]string
	}{
		{"POST", 400, nil}, {"POST", 401, nil}, {"POST", 403, nil}, {"POST", 404, nil},
		{"POST", 422, nil}, {"POST", 500, nil}, {"POST", 501, nil}, {"PUT", 500, nil},
		{"POST", 409, map[string]string{idemkey.HeaderReplayed: "true"}},
		{"POST", 429, map[string]string{idemkey.HeaderReplayed: "true"}},
		{"POST", 200, nil}, {"POST", 201, nil},
		{"GET", 409, nil}, {"GET", 500, nil}, {"GET", 404, nil},
	} {
		t.Run(c.method+" "+http.StatusText(c.status), func(t *testing.T) {
			s, srv := newScript(t, step{status: c.status, header: c.header}, step{status: http.StatusOK})
			tr, _ := newTest(t, WithBase(noKeepAlive(t)))
			req, _ := http.NewRequest(c.method, srv.URL, strings.NewReader("b"))
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.status || len(s.Seen()) != 1 {
				t.Errorf("got %d after %d attempts, want %d after 1", resp.StatusCode, len(s.Seen()), c.status)
			}
		})
	}
}

func TestRetryAfterIsHonoured(t *testing.T) {
	start := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		status int
		after  string
		want   time.Duration
	}{
		// The hint, then the first backoff (the largest jitter, 100ms-1).
		{http.StatusConflict, "3", 3*time.Second + 100*time.Millisecond - 1},
		{http.StatusTooManyRequests, "7", 7*time.Second + 100*time.Millisecond - 1},
		{http.StatusServiceUnavailable, "2", 2*time.Second + 100*time.Millisecond - 1},
		{http.StatusConflict, start.Add(9 * time.Second).Format(http.TimeFormat), 9*time.Second + 100*time.Millisecond - 1},
		{http.StatusTooManyRequests, start.Add(-time.Hour).Format(http.TimeFormat), 100*time.Millisecond - 1},
		{http.StatusConflict, "0", 100*time.Millisecond - 1},
		{http.StatusConflict, "soon", 100*time.Millisecond - 1},
	} {
		t.Run(http.StatusText(c.status)+" "+c.after, func(t *testing.T) {
			s, srv := newScript(t, step{status: c.status, header: map[string]string{"Retry-After": c.after}},
				step{status: http.StatusOK})
			tr, clk := newTest(t, WithBase(noKeepAlive(t)))
			clk.now = start
			resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "b"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || len(s.Seen()) != 2 {
				t.Fatalf("got %d after %d attempts, want 200 after 2", resp.StatusCode, len(s.Seen()))
			}
			if got := clk.Sleeps(); !slices.Equal(got, []time.Duration{c.want}) {
				t.Errorf("waits = %v, want [%v]", got, c.want)
			}
		})
	}
}

func TestRetryAfterBeyondTheLimitIsNotWaitedFor(t *testing.T) {
	s, srv := newScript(t, step{status: http.StatusServiceUnavailable, header: map[string]string{"Retry-After": "120"}, body: "later"},
		step{status: http.StatusOK})
	tr, clk := newTest(t, WithBase(noKeepAlive(t)))
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "b"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || readAll(t, resp) != "later" {
		t.Errorf("got %d, want the 503 with its body", resp.StatusCode)
	}
	if len(s.Seen()) != 1 || len(clk.Sleeps()) != 0 {
		t.Errorf("%d attempts, waits %v; want 1 attempt and no wait", len(s.Seen()), clk.Sleeps())
	}

	// A higher limit waits for it.
	s, srv = newScript(t, step{status: http.StatusServiceUnavailable, header: map[string]string{"Retry-After": "120"}},
		step{status: http.StatusOK})
	tr, clk = newTest(t, WithBase(noKeepAlive(t)), WithRetryAfterLimit(5*time.Minute))
	resp, err = tr.RoundTrip(post(t, context.Background(), srv.URL, "b"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(s.Seen()) != 2 || !slices.Equal(clk.Sleeps(), []time.Duration{2*time.Minute + 100*time.Millisecond - 1}) {
		t.Errorf("got %d after %d attempts with waits %v, want 200 after 2, waiting 2m and the backoff", resp.StatusCode, len(s.Seen()), clk.Sleeps())
	}
}

func TestAttemptsAreBounded(t *testing.T) {
	for _, max := range []int{1, 2, 4, 6} {
		s, srv := newScript(t, step{status: http.StatusServiceUnavailable, body: "busy"})
		tr, clk := newTest(t, WithBase(noKeepAlive(t)), WithMaxAttempts(max))
		var trace Trace
		resp, err := tr.RoundTrip(post(t, WithTrace(context.Background(), &trace), srv.URL, "b"))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusServiceUnavailable || readAll(t, resp) != "busy" {
			t.Errorf("max %d: final response %d, want the last 503 with its body", max, resp.StatusCode)
		}
		if len(s.Seen()) != max || trace.Attempts != max || len(clk.Sleeps()) != max-1 {
			t.Errorf("max %d: %d attempts (trace %d), %d waits", max, len(s.Seen()), trace.Attempts, len(clk.Sleeps()))
		}
	}
}

func TestBackoffStaysWithinTheDeadline(t *testing.T) {
	s, srv := newScript(t, step{status: http.StatusServiceUnavailable, body: "busy"})
	// Backoff in minutes against a deadline an hour ahead on the fake clock:
	// waits of 10m and 20m fit, the next 40m would end past it.
	tr, clk := newTest(t, WithBase(noKeepAlive(t)), WithMaxAttempts(10), WithBackoff(10*time.Minute, 40*time.Minute))
	tr.jitter = func(n int64) int64 { return n } // the full ceiling, to the nanosecond
	deadline := clk.Now().Add(time.Hour)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, "b"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || readAll(t, resp) != "busy" {
		t.Errorf("got %d, want the last 503 with its body", resp.StatusCode)
	}
	if got := clk.Sleeps(); !slices.Equal(got, []time.Duration{10 * time.Minute, 20 * time.Minute}) {
		t.Errorf("waits = %v, want [10m 20m]", got)
	}
	if len(s.Seen()) != 3 {
		t.Errorf("%d attempts, want 3", len(s.Seen()))
	}
	if !clk.Now().Before(deadline) {
		t.Errorf("the clock reached %v, past the deadline %v", clk.Now(), deadline)
	}
}

func TestBackoffWithRandomJitterNeverPassesTheDeadline(t *testing.T) {
	for i := 0; i < 50; i++ {
		s, srv := newScript(t, step{status: http.StatusBadGateway})
		tr, clk := newTest(t, WithBase(noKeepAlive(t)), WithMaxAttempts(50), WithBackoff(time.Minute, 10*time.Minute))
		tr.jitter = defaultJitter(t)
		deadline := clk.Now().Add(30 * time.Minute)
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		resp, err := tr.RoundTrip(post(t, ctx, srv.URL, "b"))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if !clk.Now().Before(deadline) {
			t.Fatalf("run %d: waited until %v, past the deadline", i, clk.Now().Sub(deadline))
		}
		if n := len(s.Seen()); n < 1 || n != len(clk.Sleeps())+1 {
			t.Fatalf("run %d: %d attempts with %d waits", i, n, len(clk.Sleeps()))
		}
	}
}

func defaultJitter(t *testing.T) func(int64) int64 {
	tr, err := New()
	if err != nil {
		t.Fatal(err)
	}
	return tr.jitter
}

// TestRetryAfterPastTheDeadlineWaitsWhatItCanAndTriesOnceMore: a 409 whose
// Retry-After (35 s, the claim's whole life) ends past the caller's 30 s
// budget used to go back to the caller at once, after one attempt, although
// the first request answered 2.5 s later. The transport waits what is left
// of the budget, less room for one attempt, and tries once more.
func TestRetryAfterPastTheDeadlineWaitsWhatItCanAndTriesOnceMore(t *testing.T) {
	s, srv := newScript(t, step{status: http.StatusConflict, header: map[string]string{"Retry-After": "35"}, body: "in flight"},
		step{status: http.StatusCreated, header: map[string]string{"Idempotent-Replayed": "true"}, body: "made"},
		step{status: http.StatusTeapot})
	tr, clk := newTest(t, WithBase(noKeepAlive(t)))
	ctx, cancel := context.WithDeadline(context.Background(), clk.Now().Add(30*time.Second))
	defer cancel()
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, "b"))
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != http.StatusCreated || body != "made" {
		t.Errorf("got %d %q, want the replayed 201", resp.StatusCode, body)
	}
	if got := clk.Sleeps(); len(s.Seen()) != 2 || !slices.Equal(got, []time.Duration{30*time.Second - minAttemptRoom}) {
		t.Errorf("%d attempts, waits %v; want 2 and [%v]", len(s.Seen()), got, 30*time.Second-minAttemptRoom)
	}

	// Still in flight at the last attempt: that answer goes back, with no
	// further wait.
	s, srv = newScript(t, step{status: http.StatusConflict, header: map[string]string{"Retry-After": "7200"}, body: "in flight"})
	tr, clk = newTest(t, WithBase(noKeepAlive(t)), WithRetryAfterLimit(3*time.Hour))
	ctx, cancel = context.WithDeadline(context.Background(), clk.Now().Add(time.Hour))
	defer cancel()
	resp, err = tr.RoundTrip(post(t, ctx, srv.URL, "b"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusConflict || readAll(t, resp) != "in flight" {
		t.Errorf("got %d, want the 409 with its body", resp.StatusCode)
	}
	if got := clk.Sleeps(); len(s.Seen()) != 2 || !slices.Equal(got, []time.Duration{DefaultInFlightWait}) {
		t.Errorf("%d attempts, waits %v; want 2 and the in-flight wait", len(s.Seen()), got)
	}
}

// TestBackoffPastTheDeadlineReturnsAtOnce: a wait of the transport's own
// choosing (no Retry-After) that ends past the deadline is not cut short.
func TestBackoffPastTheDeadlineReturnsAtOnce(t *testing.T) {
	s, srv := newScript(t, step{status: http.StatusServiceUnavailable, body: "busy"}, step{status: http.StatusOK})
	tr, clk := newTest(t, WithBase(noKeepAlive(t)), WithBackoff(time.Hour, time.Hour))
	ctx, cancel := context.WithDeadline(context.Background(), clk.Now().Add(time.Minute))
	defer cancel()
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, "b"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || readAll(t, resp) != "busy" {
		t.Errorf("got %d, want the 503 with its body", resp.StatusCode)
	}
	if len(s.Seen()) != 1 || len(clk.Sleeps()) != 0 {
		t.Errorf("%d attempts, waits %v; want 1 and none", len(s.Seen()), clk.Sleeps())
	}
}

func TestCancelDuringTheWait(t *testing.T) {
	var bodies []*trackedBody
	tr, clk := newTest(t, WithBase(rtFunc(func(r *http.Request) (*http.Response, error) {
		b := newTracked("busy")
		bodies = append(bodies, b)
		return response(r, http.StatusServiceUnavailable, b), nil
	})))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clk.onSleep = func(context.Context) error { cancel(); return nil }
	resp, err := tr.RoundTrip(post(t, ctx, "http://127.0.0.1:1/", "b"))
	if !errors.Is(err, context.Canceled) || resp != nil {
		t.Fatalf("RoundTrip = %v, %v; want an error matching context.Canceled", resp, err)
	}
	if len(bodies) != 1 || !bodies[0].Closed() {
		t.Errorf("%d attempts; want 1 with its response closed", len(bodies))
	}
}

func TestCallerContextEndStopsRetries(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	tr, _ := newTest(t, WithBase(rtFunc(func(r *http.Request) (*http.Response, error) {
		n++
		cancel()
		return nil, r.Context().Err()
	})))
	_, err := tr.RoundTrip(post(t, ctx, "http://127.0.0.1:1/", "b"))
	if !errors.Is(err, context.Canceled) || n != 1 {
		t.Errorf("RoundTrip error %v after %d attempts; want context.Canceled after 1", err, n)
	}
}

func TestDiscardedResponsesAreDrainedAndClosed(t *testing.T) {
	var bodies []*trackedBody
	tr, _ := newTest(t, WithBase(rtFunc(func(r *http.Request) (*http.Response, error) {
		status := http.StatusServiceUnavailable
		if len(bodies) == 2 {
			status = http.StatusOK
		}
		b := newTracked(strings.Repeat("x", 1000))
		bodies = append(bodies, b)
		resp := response(r, status, b)
		resp.ContentLength = 1000
		if len(bodies) == 2 {
			// A body of unknown length is closed unread.
			resp.ContentLength = -1
		}
		return resp, nil
	})))
	resp, err := tr.RoundTrip(post(t, context.Background(), "http://127.0.0.1:1/", "b"))
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range bodies[:2] {
		if !b.Closed() {
			t.Errorf("discarded response %d not closed", i+1)
		}
	}
	if rest, _ := io.ReadAll(bodies[0].r); len(rest) != 0 {
		t.Errorf("discarded response of known length not drained: %d bytes left", len(rest))
	}
	if rest, _ := io.ReadAll(bodies[1].r); len(rest) != 1000 {
		t.Errorf("discarded response of unknown length was read: %d bytes left", len(rest))
	}
	if bodies[2].Closed() {
		t.Error("the final response was closed before the caller read it")
	}
	if len(readAll(t, resp)) != 1000 {
		t.Error("final body incomplete")
	}
}

func TestTLSCertificateErrorsAreNotRetried(t *testing.T) {
	var runs atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1) }))
	defer srv.Close()
	// The base does not trust the test server's certificate.
	base := &http.Transport{DisableKeepAlives: true, TLSClientConfig: &tls.Config{RootCAs: x509.NewCertPool()}}
	defer base.CloseIdleConnections()
	srv.Config.ErrorLog = discardLogger()
	var attempts int
	tr, _ := newTest(t, WithBase(rtFunc(func(r *http.Request) (*http.Response, error) {
		attempts++
		return base.RoundTrip(r)
	})))
	_, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "b"))
	var verify *tls.CertificateVerificationError
	if !errors.As(err, &verify) {
		t.Fatalf("error %v, want a certificate verification error", err)
	}
	if attempts != 1 || runs.Load() != 0 {
		t.Errorf("%d attempts, %d handler runs; want 1 and 0", attempts, runs.Load())
	}
}

func TestRetryPolicyIsReplaceable(t *testing.T) {
	s, srv := newScript(t, step{status: http.StatusInternalServerError}, step{status: http.StatusOK})
	var seenAttempts []Attempt
	policy := func(a Attempt) bool {
		seenAttempts = append(seenAttempts, a)
		return a.Response != nil && a.Response.StatusCode == http.StatusInternalServerError
	}
	tr, _ := newTest(t, WithBase(noKeepAlive(t)), WithRetryPolicy(policy), WithKeyGenerator(func() string { return "k1" }))
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "b"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(s.Seen()) != 2 {
		t.Fatalf("got %d after %d attempts; want 200 after 2", resp.StatusCode, len(s.Seen()))
	}
	// Consulted after each attempt: it asked for the retry of the 500 and
	// said no to the 200.
	if len(seenAttempts) != 2 {
		t.Fatalf("policy consulted %d times, want 2", len(seenAttempts))
	}
	a := seenAttempts[0]
	if a.Number != 1 || a.Key != "k1" || a.Request.Header.Get("Idempotency-Key") != "k1" || a.Err != nil {
		t.Errorf("first attempt = %+v", a)
	}
	if seenAttempts[1].Number != 2 {
		t.Errorf("second attempt number %d", seenAttempts[1].Number)
	}
}

func TestPolicyIsNotConsultedWhenNoRetryIsPossible(t *testing.T) {
	consulted := 0
	policy := WithRetryPolicy(func(Attempt) bool { consulted++; return true })
	ok := rtFunc(func(r *http.Request) (*http.Response, error) {
		return response(r, http.StatusServiceUnavailable, http.NoBody), nil
	})
	for name, opts := range map[string][]Option{
		"unkeyed mutation": {WithoutAutoKey()},
		"one attempt":      {WithMaxAttempts(1)},
	} {
		consulted = 0
		tr, _ := newTest(t, append(opts, policy, WithBase(ok))...)
		resp, err := tr.RoundTrip(post(t, context.Background(), "http://127.0.0.1:1/", "b"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if consulted != 0 {
			t.Errorf("%s: policy consulted %d times, want never", name, consulted)
		}
	}
}

func TestBackoffCeilingGrowsToTheCap(t *testing.T) {
	tr, _ := newTest(t, WithBackoff(100*time.Millisecond, time.Second))
	want := []time.Duration{100, 200, 400, 800, 1000, 1000, 1000}
	for i, w := range want {
		if got := tr.backoffCeiling(i + 1); got != w*time.Millisecond {
			t.Errorf("ceiling before attempt %d = %v, want %v", i+2, got, w*time.Millisecond)
		}
	}
	// A cap near the largest duration never overflows.
	tr, _ = newTest(t, WithBackoff(time.Nanosecond, maxDuration))
	for n := 1; n < 200; n++ {
		if c := tr.backoffCeiling(n); c <= 0 {
			t.Fatalf("ceiling before attempt %d = %v", n+1, c)
		}
	}
}

func TestFullJitterStaysUnderTheCeiling(t *testing.T) {
	tr, err := New()
	if err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= 8; n++ {
		ceiling := tr.backoffCeiling(n)
		distinct := map[time.Duration]bool{}
		for i := 0; i < 200; i++ {
			d, ok := tr.wait(n, nil)
			if !ok || d < 0 || d >= ceiling {
				t.Fatalf("wait before attempt %d = %v, want in [0, %v)", n+1, d, ceiling)
			}
			distinct[d] = true
		}
		if len(distinct) < 100 {
			t.Errorf("wait before attempt %d took only %d values in 200 draws", n+1, len(distinct))
		}
	}
}

func TestBaseWithoutResponseOrError(t *testing.T) {
	tr, _ := newTest(t, WithBase(rtFunc(func(*http.Request) (*http.Response, error) { return nil, nil })), WithMaxAttempts(1))
	resp, err := tr.RoundTrip(post(t, context.Background(), "http://127.0.0.1:1/", "b"))
	if err == nil || resp != nil {
		t.Errorf("RoundTrip = %v, %v; want an error", resp, err)
	}
}

// halfJitter draws half of every ceiling, so waits are predictable and
// tell the backoff apart from the server's hint.
func halfJitter(n int64) int64 { return n / 2 }

// TestConflictWithAOneSecondHintThenReplay: an idemkey server's 409 says
// Retry-After: 1 (at least one second, its estimate of when the first
// request is done). The client waits at least the hint, plus the jittered
// backoff, so clients told the same hint do not come back in step; the
// backoff still grows; the replay ends it.
func TestConflictWithAOneSecondHintThenReplay(t *testing.T) {
	conflict := step{status: http.StatusConflict, header: map[string]string{"Retry-After": "1"}}
	s, srv := newScript(t, conflict, conflict,
		step{status: http.StatusCreated, header: map[string]string{"Idempotent-Replayed": "true"}, body: "made"})
	tr, clk := newTest(t, WithBase(noKeepAlive(t)))
	tr.jitter = halfJitter
	var trace Trace
	resp, err := tr.RoundTrip(post(t, WithTrace(context.Background(), &trace), srv.URL, "b"))
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != http.StatusCreated || body != "made" || !trace.Replayed {
		t.Errorf("got %d %q replayed %v, want the replayed 201", resp.StatusCode, body, trace.Replayed)
	}
	want := []time.Duration{time.Second + 50*time.Millisecond, time.Second + 100*time.Millisecond}
	if got := clk.Sleeps(); !slices.Equal(got, want) {
		t.Errorf("waits = %v, want %v: the hint plus the jittered backoff", got, want)
	}
	got := s.Seen()
	if len(got) != 3 || got[0].Key == "" || got[1].Key != got[0].Key || got[2].Key != got[0].Key {
		t.Errorf("server saw %+v, want 3 attempts with one key", got)
	}
}

// TestShortHintsAreBoundedByTheInFlightWaitAndTheDeadline: 409s with a
// Retry-After (the first request still runs) do not spend the attempts:
// the in-flight wait and the context bound how long the client keeps
// asking, so that it outlasts the claim of a server that died (409s until
// the claim's life ends). The last wait is cut to what is left.
func TestShortHintsAreBoundedByTheInFlightWaitAndTheDeadline(t *testing.T) {
	conflict := step{status: http.StatusConflict, header: map[string]string{"Retry-After": "1"}, body: "in flight"}
	t.Run("in-flight wait", func(t *testing.T) {
		s, srv := newScript(t, conflict)
		tr, clk := newTest(t, WithBase(noKeepAlive(t)), WithMaxAttempts(3))
		tr.jitter = halfJitter
		resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "b"))
		if err != nil {
			t.Fatal(err)
		}
		if body := readAll(t, resp); resp.StatusCode != http.StatusConflict || body != "in flight" {
			t.Errorf("got %d %q, want the last 409", resp.StatusCode, body)
		}
		var total time.Duration
		for _, d := range clk.Sleeps() {
			total += d
		}
		if total != DefaultInFlightWait || len(s.Seen()) != len(clk.Sleeps())+1 || len(s.Seen()) <= 3 {
			t.Errorf("%d attempts, waits %v (%v); want more than 3, waiting the in-flight wait in all", len(s.Seen()), clk.Sleeps(), total)
		}
	})
	t.Run("dead owner", func(t *testing.T) {
		// An instance died holding the claim: 409s for the claim's 35 s
		// with hints that grow as the middleware's do, then the run.
		var steps []step
		for _, ra := range []string{"1", "1", "2", "3", "4", "6", "9", "10"} {
			steps = append(steps, step{status: http.StatusConflict, header: map[string]string{"Retry-After": ra}})
		}
		steps = append(steps, step{status: http.StatusCreated, body: "made"})
		s, srv := newScript(t, steps...)
		tr, _ := newTest(t, WithBase(noKeepAlive(t)))
		tr.jitter = halfJitter
		resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "b"))
		if err != nil {
			t.Fatal(err)
		}
		if body := readAll(t, resp); resp.StatusCode != http.StatusCreated || body != "made" || len(s.Seen()) != 9 {
			t.Errorf("got %d %q after %d attempts, want the 201 after 9", resp.StatusCode, body, len(s.Seen()))
		}
	})
	t.Run("counted as attempts", func(t *testing.T) {
		s, srv := newScript(t, conflict)
		tr, clk := newTest(t, WithBase(noKeepAlive(t)), WithMaxAttempts(3), WithInFlightWait(0))
		tr.jitter = halfJitter
		resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "b"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if len(s.Seen()) != 3 || len(clk.Sleeps()) != 2 {
			t.Errorf("%d attempts, waits %v; want 3 and 2", len(s.Seen()), clk.Sleeps())
		}
	})
	t.Run("deadline", func(t *testing.T) {
		s, srv := newScript(t, conflict)
		tr, clk := newTest(t, WithBase(noKeepAlive(t)), WithMaxAttempts(10))
		tr.jitter = halfJitter
		// Waits of 1.05 s and 1.1 s fit in 2.5 s less the room for an
		// attempt; the third, 1.2 s, does not, and is cut to 250 ms.
		ctx, cancel := context.WithDeadline(context.Background(), clk.Now().Add(2500*time.Millisecond))
		defer cancel()
		resp, err := tr.RoundTrip(post(t, ctx, srv.URL, "b"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := []time.Duration{1050 * time.Millisecond, 1100 * time.Millisecond, 250 * time.Millisecond}
		if resp.StatusCode != http.StatusConflict || len(s.Seen()) != 4 || !slices.Equal(clk.Sleeps(), want) {
			t.Errorf("got %d after %d attempts and waits %v; want the 409 after 4 and waits %v",
				resp.StatusCode, len(s.Seen()), clk.Sleeps(), want)
		}
	})
}

// TestKeyLikeHeaderOfAnUnkeyedMutationDoesNotLetTheBaseResend: net/http's
// Transport resends by itself a request that looks idempotent to it (any
// Idempotency-Key or X-Idempotency-Key header, whatever its value) when a
// kept-alive connection breaks before the response. A mutation the client
// sends without a key it honours (a blank key, another header's name)
// must reach the server once, on the default base.
func TestKeyLikeHeaderOfAnUnkeyedMutationDoesNotLetTheBaseResend(t *testing.T) {
	var runs atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			io.WriteString(w, "ok")
			return
		}
		io.Copy(io.Discard, r.Body)
		runs.Add(1)
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			c.Close() // ran; the reply is lost
		}
	}))
	defer srv.Close()
	for _, c := range []struct{ name, method, header, body string }{
		{"blank key, POST", http.MethodPost, "Idempotency-Key", "pay"},
		{"blank key, DELETE without a body", http.MethodDelete, "Idempotency-Key", ""},
		{"X-Idempotency-Key", http.MethodPost, "X-Idempotency-Key", "pay"},
	} {
		t.Run(c.name, func(t *testing.T) {
			runs.Store(0)
			base := http.DefaultTransport.(*http.Transport).Clone()
			defer base.CloseIdleConnections()
			tr, _ := newTest(t, WithBase(base), WithoutAutoKey())
			// A read leaves a kept-alive connection for the mutation.
			get, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
			resp, err := tr.RoundTrip(get)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			var body io.Reader
			if c.body != "" {
				body = strings.NewReader(c.body)
			}
			req, _ := http.NewRequest(c.method, srv.URL+"/pay", body)
			req.Header[c.header] = []string{""}
			if c.header == "X-Idempotency-Key" {
				req.Header[c.header] = []string{"k1"}
			}
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
				t.Fatalf("got %d, want the lost reply's error", resp.StatusCode)
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("the server ran the mutation %d times, want 1", n)
			}
		})
	}
}
