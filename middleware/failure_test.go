package middleware_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

func TestStoreUnavailable(t *testing.T) {
	f := newFixture(t)
	f.store.failClaims(fmt.Errorf("%w: dial tcp: refused", store.ErrUnavailable))
	h := &counter{}
	w := serve(f.mw.Required()(h), post("k", `{}`))
	p := wantProblem(t, w, http.StatusServiceUnavailable, idemkey.CodeUnavailable)
	if strings.Contains(p.Detail, "refused") {
		t.Errorf("detail leaks the store error: %q", p.Detail)
	}
	if ra, _ := strconv.Atoi(w.Header().Get("Retry-After")); ra < 1 {
		t.Errorf("Retry-After %q", w.Header().Get("Retry-After"))
	}
	if h.runs.Load() != 0 || !f.events.has(middleware.EventStoreError) {
		t.Fatalf("runs %d events %v", h.runs.Load(), f.events.kinds())
	}

	open := newFixture(t, middleware.WithFailOpen())
	// An error that is not an outage (here a value the store cannot read)
	// still fails closed under WithFailOpen.
	open.store.failClaims(errStoreDown)
	wantProblem(t, serve(open.mw.Required()(h), post("k", `{}`)), http.StatusServiceUnavailable, idemkey.CodeUnavailable)
	if h.runs.Load() != 0 {
		t.Fatal("fail-open ran the handler on an error that is not an outage")
	}
	open.store.failClaims(fmt.Errorf("%w: connection refused", store.ErrUnreachable))
	w = serve(open.mw.Required()(h), post("k", `{"amount":7}`))
	if w.Code != http.StatusCreated || h.runs.Load() != 1 || !strings.Contains(w.Body.String(), `"echo":{"amount":7}`) {
		t.Fatalf("fail-open: %d %q runs %d, want the handler to read the whole body", w.Code, w.Body, h.runs.Load())
	}
}

func TestKeepFailureStillAnswersAndLeavesClaimToLapse(t *testing.T) {
	f := newFixture(t)
	f.store.failCompletes(errStoreDown)
	h := &counter{}
	mw := f.mw.Required()(h)
	if w := serve(mw, post("k", `{}`)); w.Code != http.StatusCreated {
		t.Fatalf("first: %d", w.Code)
	}
	if !f.events.has(middleware.EventStoreError) {
		t.Fatalf("events %v", f.events.kinds())
	}
	// The claim still holds the key: a repeat is refused, not run again.
	wantProblem(t, serve(mw, post("k", `{}`)), http.StatusConflict, idemkey.CodeConflict)
	if h.runs.Load() != 1 {
		t.Fatalf("runs %d", h.runs.Load())
	}
}

// lapsing is a store whose Complete finds another owner.
type lapsing struct{ countingStore }

func (s *lapsing) Complete(context.Context, string, string, *store.Record, time.Duration) error {
	return store.ErrNotOwner
}

func TestOwnershipLostIsReported(t *testing.T) {
	f := newFixture(t)
	mw, err := middleware.New(&lapsing{countingStore{Store: f.store.Store}}, middleware.WithObserver(f.events.observe))
	if err != nil {
		t.Fatal(err)
	}
	w := serve(mw.Required()(&counter{}), post("k", `{}`))
	if w.Code != http.StatusCreated || !f.events.has(middleware.EventOwnershipLost) {
		t.Fatalf("%d events %v", w.Code, f.events.kinds())
	}
}

// hanging is a store whose claims never answer until their context ends.
type hanging struct{ *countingStore }

func (h hanging) Claim(ctx context.Context, key string, c store.Claim) (store.Result, error) {
	<-ctx.Done()
	return store.Result{}, ctx.Err()
}

func TestStoreTimeoutBoundsAHangingStore(t *testing.T) {
	f := newFixture(t)
	mw, err := middleware.New(hanging{f.store}, middleware.WithStoreTimeout(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	h := &counter{}
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- serve(mw.Required()(h), post("k", `{}`)) }()
	select {
	case w := <-done:
		wantProblem(t, w, http.StatusServiceUnavailable, idemkey.CodeUnavailable)
	case <-time.After(10 * time.Second):
		t.Fatal("a hanging claim was not bounded by WithStoreTimeout")
	}
	if h.runs.Load() != 0 {
		t.Fatal("handler ran")
	}
}

// TestFailOpenOnlyWhenUnreachable: WithFailOpen runs a handler without a
// claim only when the store cannot be reached at all. A full pool, a
// timeout of a store that answers, a full store: each is a store that is
// up, whose first request for the key may be running, and answers 503.
func TestFailOpenOnlyWhenUnreachable(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("%w: connection pool exhausted", store.ErrUnavailable),
		fmt.Errorf("%w: i/o timeout", store.ErrUnavailable),
		fmt.Errorf("%w: max entries", store.ErrFull),
	} {
		f := newFixture(t, middleware.WithFailOpen())
		h := &counter{}
		f.store.failClaims(err)
		wantProblem(t, serve(f.mw.Required()(h), post("k", `{}`)), http.StatusServiceUnavailable, idemkey.CodeUnavailable)
		if h.runs.Load() != 0 {
			t.Errorf("%v: fail-open ran the handler", err)
		}
	}
	f := newFixture(t, middleware.WithFailOpen())
	h := &counter{}
	f.store.failClaims(fmt.Errorf("%w: dial tcp 127.0.0.1:6379: connect: connection refused", store.ErrUnreachable))
	if w := serve(f.mw.Required()(h), post("k", `{}`)); w.Code != http.StatusCreated || h.runs.Load() != 1 {
		t.Fatalf("unreachable: %d runs %d, want 201 and one run", w.Code, h.runs.Load())
	}
}

// TestFailOpenBodyEndsWithTheHandler shows that, as on a claimed run, the
// body a fail-open handler was given reads EOF once the handler has
// returned: its buffer goes back to the pool then, and a late read must
// never find another request's body in it.
func TestFailOpenBodyEndsWithTheHandler(t *testing.T) {
	f := newFixture(t, middleware.WithFailOpen())
	f.store.failClaims(fmt.Errorf("%w: connection refused", store.ErrUnreachable))
	var body io.Reader
	f.mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body = r.Body
		w.WriteHeader(http.StatusAccepted)
	})).ServeHTTP(httptest.NewRecorder(), post("k", `{"secret":1}`))
	if n, err := body.Read(make([]byte, 64)); n != 0 || err != io.EOF {
		t.Fatalf("read after return: %d bytes, %v; want EOF", n, err)
	}
}

// TestFailOpenNeverRunsForACallerThatHasGone: a store answers a claim made
// under a cancelled context as unavailable (the Redis store does). That is
// the caller leaving, not the store failing: WithFailOpen must not run the
// handler unguarded then, or the caller's retry runs it a second time.
func TestFailOpenNeverRunsForACallerThatHasGone(t *testing.T) {
	f := newFixture(t, middleware.WithFailOpen())
	h := &counter{}
	srv := f.mw.Required()(h)
	f.store.failClaims(fmt.Errorf("%w: %w", store.ErrUnreachable, context.Canceled))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	serve(srv, post("gone-1", `{"a":1}`).WithContext(ctx))
	f.store.failClaims(nil)
	if w := serve(srv, post("gone-1", `{"a":1}`)); w.Code != http.StatusCreated {
		t.Fatalf("retry: %d, want 201", w.Code)
	}
	if n := h.runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times for one key, want 1", n)
	}
}

// TestFailOpenNeverRunsARepeatItSawInFlight: under WithWait a repeat that
// has seen its key in flight, for its own request, knows the first one is
// running: a store failure while it waits answers 503, and never runs the
// handler beside the first, whatever WithFailOpen says.
func TestFailOpenNeverRunsARepeatItSawInFlight(t *testing.T) {
	f := newFixture(t, middleware.WithFailOpen(), middleware.WithWait(5*time.Second))
	started, finish := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	srv := f.mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(started)
			<-finish
		}
		w.WriteHeader(http.StatusCreated)
	}))
	first := make(chan int)
	go func() { first <- serve(srv, post("wait-1", `{"a":1}`)).Code }()
	<-started
	repeat := make(chan int)
	go func() { repeat <- serve(srv, post("wait-1", `{"a":1}`)).Code }()
	// Let the repeat see the key in flight and start polling, then make
	// the store fail.
	for f.store.claims.Load() < 3 {
		time.Sleep(5 * time.Millisecond)
	}
	f.store.failClaims(fmt.Errorf("%w: connection reset", store.ErrUnreachable))
	code := <-repeat
	f.store.failClaims(nil)
	close(finish)
	if c := <-first; c != http.StatusCreated {
		t.Errorf("first: %d", c)
	}
	if code != http.StatusServiceUnavailable {
		t.Errorf("repeat: %d, want 503", code)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times for one key, want 1", n)
	}
}
