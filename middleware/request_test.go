package middleware_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// trickle is a body that declares much and sends little: a few bytes, then
// EOF.
type trickle struct{ n int }

func (t *trickle) Read(p []byte) (int, error) {
	if t.n == 0 {
		return 0, io.EOF
	}
	p[0] = 'x'
	t.n--
	return 1, nil
}

// A client that declares a large Content-Length and sends a few bytes must
// not make the middleware allocate what it declared.
func TestDeclaredLengthDoesNotSizeTheBuffer(t *testing.T) {
	f := newFixture(t)
	h := f.mw.Required()(&counter{})
	const requests = 32
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range requests {
		r := httptest.NewRequest(http.MethodPost, "/payments", io.NopCloser(&trickle{n: 3}))
		r.ContentLength = 1 << 20
		r.Header.Set("Idempotency-Key", "k"+strconv.Itoa(i))
		serve(h, r)
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / requests; per > 64<<10 {
		t.Fatalf("%d bytes allocated per request that declared 1 MiB and sent 3 bytes", per)
	}
}

// A body that stops arriving is refused once WithBodyTimeout has passed,
// without a store call, instead of holding the request forever.
func TestBodyThatStopsArrivingIsRefused(t *testing.T) {
	f := newFixture(t, middleware.WithBodyTimeout(200*time.Millisecond))
	srv := httptest.NewServer(f.mw.Required()(&counter{}))
	t.Cleanup(srv.Close)
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Length: 100\r\n\r\n{")
	conn.SetReadDeadline(time.Now().Add(20 * time.Second)) // a bound for a hang, not a measurement
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	body := readAll(t, resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, idemkey.CodeBodyUnreadable) {
		t.Fatalf("stalled body: %d %s", resp.StatusCode, body)
	}
	if f.store.calls() != 0 || !f.events.has(middleware.EventBodyUnreadable) {
		t.Fatalf("store calls %d, events %v", f.store.calls(), f.events.kinds())
	}
}

func TestEveryKeyedResponseCarriesARequestID(t *testing.T) {
	f := newFixture(t)
	h := f.mw.Required()(&counter{})
	isUUID := func(s string) bool { _, err := uuid.Parse(s); return err == nil }

	first := serve(h, post("k", `{}`))
	firstID := first.Header().Get(idemkey.HeaderRequestID)
	if !isUUID(firstID) {
		t.Fatalf("first run without an incoming id: X-Request-Id %q, want a fresh UUID", firstID)
	}
	replay := serve(h, post("k", `{}`))
	if id := replay.Header().Get(idemkey.HeaderRequestID); !isUUID(id) || id == firstID {
		t.Fatalf("replay: X-Request-Id %q, want a fresh one, not the first run's %q", id, firstID)
	}

	// The request's own id, on a first run, a replay and every refusal.
	for _, tc := range []struct {
		name string
		r    *http.Request
	}{
		{"first run", post("k2", `{}`)},
		{"replay", post("k2", `{}`)},
		{"reused", post("k2", `{"other":1}`)},
		{"invalid", post("a,b", `{}`)},
		{"missing", post("", `{}`)},
	} {
		tc.r.Header.Set(idemkey.HeaderRequestID, "req-"+strings.ReplaceAll(tc.name, " ", "-"))
		w := serve(h, tc.r)
		if got := w.Header().Values(idemkey.HeaderRequestID); len(got) != 1 || got[0] != "req-"+strings.ReplaceAll(tc.name, " ", "-") {
			t.Errorf("%s (%d): X-Request-Id %q, want the request's own", tc.name, w.Code, got)
		}
	}

	// An id the service's request-id middleware set on the response wins.
	setID := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(idemkey.HeaderRequestID, "from-service")
			next.ServeHTTP(w, r)
		})
	}
	for _, key := range []string{"k3", "k3"} {
		r := post(key, `{}`)
		r.Header.Set(idemkey.HeaderRequestID, "from-client")
		if got := serve(setID(h), r).Header().Values(idemkey.HeaderRequestID); len(got) != 1 || got[0] != "from-service" {
			t.Errorf("X-Request-Id %q, want the one the service set", got)
		}
	}

	// WithoutNewRequestID makes none up.
	g := newFixture(t, middleware.WithoutNewRequestID())
	hg := g.mw.Required()(&counter{})
	for _, key := range []string{"k", "k"} {
		if id := serve(hg, post(key, `{}`)).Header().Get(idemkey.HeaderRequestID); id != "" {
			t.Errorf("WithoutNewRequestID: X-Request-Id %q made up", id)
		}
	}
}

// The 409's Retry-After says when the first request is likely done: the
// route's recent first runs (2 s here) less how long it has run, not the
// claim's whole remaining life (15 s under a 10 s deadline).
func TestRetryAfterHintsWhenTheFirstRequestIsLikelyDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, _ := memory.New()
		defer st.Close()
		mw, _ := middleware.New(st)
		h := mw.Required(middleware.Deadline(10 * time.Second))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(2 * time.Second)
			w.WriteHeader(http.StatusCreated)
		}))
		retryAfter := func(key string, at time.Duration) string {
			done := make(chan struct{})
			go func() {
				serve(h, post(key, `{}`))
				close(done)
			}()
			time.Sleep(at)
			w := serve(h, post(key, `{}`))
			<-done
			if w.Code != http.StatusConflict {
				t.Fatalf("repeat at %v: %d, want 409", at, w.Code)
			}
			return w.Header().Get("Retry-After")
		}
		// No first run has finished yet: poll soon.
		if got := retryAfter("a", 500*time.Millisecond); got != "1" {
			t.Errorf("before any first run finished: Retry-After %s, want 1", got)
		}
		if got := retryAfter("b", 500*time.Millisecond); got != "2" {
			t.Errorf("0.5 s into a 2 s run: Retry-After %s, want 2", got)
		}
		if got := retryAfter("c", 1900*time.Millisecond); got != "1" {
			t.Errorf("1.9 s into a 2 s run: Retry-After %s, want 1", got)
		}
	})
	// A first request that runs far longer than usual is slow this time,
	// stuck, or its instance died: the hint grows with how long it has run
	// (half of it), not the claim's whole remaining life, which would make a
	// client with a shorter budget give up on a request that answers soon.
	synctest.Test(t, func(t *testing.T) {
		st, _ := memory.New()
		defer st.Close()
		mw, _ := middleware.New(st)
		slow := false
		h := mw.Required(middleware.Deadline(10 * time.Second))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if slow {
				time.Sleep(8 * time.Second)
			} else {
				time.Sleep(2 * time.Second)
			}
			w.WriteHeader(http.StatusCreated)
		}))
		serve(h, post("a", `{}`)) // the route's estimate: 2 s
		slow = true
		done := make(chan struct{})
		go func() {
			serve(h, post("b", `{}`))
			close(done)
		}()
		time.Sleep(4 * time.Second)
		w := serve(h, post("b", `{}`))
		<-done
		if got := w.Header().Get("Retry-After"); got != "2" {
			t.Errorf("4 s into a run that usually takes 2 s (claim life 15 s): Retry-After %s, want 2 (half of how long it has run)", got)
		}
	})
}

// TestOverdueRunGetsShortGrowingHints: a route whose first runs took 10 ms,
// then one that takes 3 s. A repeat 0.5 s in used to get the claim's whole
// remaining life (Retry-After: 35), which made a client with a 30 s budget
// give up at once although the answer came 2.5 s later. A client that
// follows the hints of a run that never ends comes back less and less
// often, at most 10 seconds apart, until the claim's life ends.
func TestOverdueRunGetsShortGrowingHints(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, _ := memory.New()
		defer st.Close()
		mw, _ := middleware.New(st)
		run := 10 * time.Millisecond
		h := mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-time.After(run):
			case <-r.Context().Done():
			}
			w.WriteHeader(http.StatusCreated)
		}))
		serve(h, post("a", `{}`)) // the route's estimate: 10 ms
		run = 3 * time.Second
		done := make(chan struct{})
		go func() {
			serve(h, post("b", `{}`))
			close(done)
		}()
		time.Sleep(500 * time.Millisecond)
		w := serve(h, post("b", `{}`))
		if w.Code != http.StatusConflict || w.Header().Get("Retry-After") != "1" {
			t.Errorf("0.5 s into a 3 s run on a 10 ms route: %d Retry-After %s, want 409 with 1", w.Code, w.Header().Get("Retry-After"))
		}
		<-done

		// A run that lasts until its deadline (30 s, claim life 35 s),
		// followed hint by hint from 0.5 s in.
		run = time.Hour
		go func() {
			serve(h, post("c", `{}`))
		}()
		time.Sleep(500 * time.Millisecond)
		var hints []int
		for range 20 {
			w := serve(h, post("c", `{}`))
			if w.Code != http.StatusConflict {
				break
			}
			ra, err := strconv.Atoi(w.Header().Get("Retry-After"))
			if err != nil {
				t.Fatalf("Retry-After %q", w.Header().Get("Retry-After"))
			}
			hints = append(hints, ra)
			time.Sleep(time.Duration(ra) * time.Second)
		}
		want := []int{1, 1, 2, 3, 4, 6, 9, 10}
		if !slices.Equal(hints, want) {
			t.Errorf("hints %v, want %v", hints, want)
		}
	})
}

func TestObserversComposeAndSeeRouteAndSize(t *testing.T) {
	var mu sync.Mutex
	var seen [2][]middleware.Event
	observer := func(i int) middleware.Observer {
		return func(_ *http.Request, e middleware.Event) {
			mu.Lock()
			seen[i] = append(seen[i], e)
			mu.Unlock()
		}
	}
	st, _ := memory.New()
	t.Cleanup(func() { st.Close() })
	mw, err := middleware.New(st, middleware.WithObserver(observer(0)), middleware.WithObserver(observer(1)))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/p/1")
		io.WriteString(w, "0123456789")
	})))
	serve(mux, post("k", `{}`))
	serve(mux, post("k", `{}`))
	if len(seen[0]) != 3 || len(seen[1]) != 3 {
		t.Fatalf("observers saw %d and %d events, want 3 each (first attempt, kept, replay)", len(seen[0]), len(seen[1]))
	}
	want := len("0123456789") + len("Location") + len("/p/1")
	for i, e := range seen[0] {
		if e.Route != "POST /payments" || seen[1][i] != e {
			t.Errorf("event %d: %+v (second observer: %+v), want route POST /payments in both", i, e, seen[1][i])
		}
		if (e.Kind == middleware.EventKept || e.Kind == middleware.EventReplay) && e.Size != want {
			t.Errorf("%v: size %d, want %d", e.Kind, e.Size, want)
		}
	}
	if _, err := middleware.New(st, middleware.WithObserver(nil)); err == nil {
		t.Error("a nil observer was accepted")
	}
}

// downStore fails every claim; its releases hang until let go, as they do
// against a server that stopped answering.
type downStore struct {
	store.Store
	let      chan struct{}
	inFlight atomic.Int32
	most     atomic.Int32
}

func (s *downStore) Claim(context.Context, string, store.Claim) (store.Result, error) {
	return store.Result{}, fmt.Errorf("%w: timeout", store.ErrUnavailable)
}

func (s *downStore) Release(ctx context.Context, key, token string) error {
	n := s.inFlight.Add(1)
	for {
		m := s.most.Load()
		if n <= m || s.most.CompareAndSwap(m, n) {
			break
		}
	}
	<-s.let
	s.inFlight.Add(-1)
	return errors.New("still down")
}

// During an outage each failed claim is released in the background, in
// case it landed; those releases must not pile up without bound.
func TestReleasesOfFailedClaimsAreBounded(t *testing.T) {
	st := &downStore{let: make(chan struct{})}
	events := &eventLog{}
	mw, _ := middleware.New(st, middleware.WithObserver(events.observe))
	h := mw.Required()(&counter{})
	for i := range 200 {
		wantProblem(t, serve(h, post("k"+strconv.Itoa(i), `{}`)), http.StatusServiceUnavailable, idemkey.CodeUnavailable)
	}
	// Give the background releases time to start: all 200 of them would,
	// unbounded.
	for i := 0; i < 100 && st.inFlight.Load() < 200; i++ {
		time.Sleep(5 * time.Millisecond)
	}
	if most := st.most.Load(); most > 16 || most == 0 {
		t.Fatalf("%d releases ran at once, want between 1 and 16", most)
	}
	close(st.let)
	// A release that fails for another reason than the outage is reported.
	deadline := time.Now().Add(10 * time.Second)
	for st.inFlight.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	n := 0
	for _, k := range events.kinds() {
		if k == middleware.EventStoreError {
			n++
		}
	}
	if n <= 200 {
		t.Errorf("%d store errors reported, want the 200 claims' and the failed releases'", n)
	}
}
