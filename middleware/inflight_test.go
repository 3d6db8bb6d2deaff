package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/scope"
	"github.com/idemkey/idemkey/store"
)

// blocker is a handler that holds its first run until released.
type blocker struct {
	started chan struct{}
	release chan struct{}
	counter
}

func newBlocker() *blocker {
	return &blocker{started: make(chan struct{}, 1), release: make(chan struct{})}
}

func (b *blocker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.started <- struct{}{}
	<-b.release
	b.counter.ServeHTTP(w, r)
}

func TestInFlightConflictAndReuse(t *testing.T) {
	f := newFixture(t)
	h := newBlocker()
	mw := f.mw.Required(middleware.Deadline(10 * time.Second))(h)

	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- serve(mw, post("k", `{"a":1}`)) }()
	<-h.started

	// Same request while the first runs: 409 with Retry-After.
	w := serve(mw, post("k", `{"a":1}`))
	wantProblem(t, w, http.StatusConflict, idemkey.CodeConflict)
	ra, err := strconv.Atoi(w.Header().Get("Retry-After"))
	if err != nil || ra < 1 || ra > 15 {
		t.Fatalf("Retry-After %q", w.Header().Get("Retry-After"))
	}
	// A different request under the same key while in flight: 422.
	wantProblem(t, serve(mw, post("k", `{"a":2}`)), http.StatusUnprocessableEntity, idemkey.CodeKeyReused)

	close(h.release)
	if first := <-done; first.Code != http.StatusCreated {
		t.Fatalf("first: %d", first.Code)
	}
	// And after it completed: still 422 for a different request.
	wantProblem(t, serve(mw, post("k", `{"a":2}`)), http.StatusUnprocessableEntity, idemkey.CodeKeyReused)
	// A different path is a different request too.
	r := post("k", `{"a":1}`)
	r.URL.Path = "/refunds"
	wantProblem(t, serve(mw, r), http.StatusUnprocessableEntity, idemkey.CodeKeyReused)
	if h.runs.Load() != 1 {
		t.Fatalf("handler ran %d times", h.runs.Load())
	}
	if !f.events.has(middleware.EventInFlight) || !f.events.has(middleware.EventKeyReused) {
		t.Fatalf("events %v", f.events.kinds())
	}
}

func TestWaitReplaysTheFirstAnswer(t *testing.T) {
	f := newFixture(t, middleware.WithWait(5*time.Second))
	h := newBlocker()
	mw := f.mw.Required()(h)
	go serve(mw, post("k", `{}`))
	<-h.started
	repeat := make(chan *httptest.ResponseRecorder)
	go func() { repeat <- serve(mw, post("k", `{}`)) }()
	// Let the repeat find the key in flight before the first finishes.
	for f.store.claims.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	close(h.release)
	w := <-repeat
	if w.Code != http.StatusCreated || w.Header().Get(idemkey.HeaderReplayed) != "true" || h.runs.Load() != 1 {
		t.Fatalf("repeat %d replayed=%q runs=%d", w.Code, w.Header().Get(idemkey.HeaderReplayed), h.runs.Load())
	}
}

func TestExactlyOnceUnderConcurrency(t *testing.T) {
	const workers = 64
	for rep := 0; rep < 20; rep++ {
		f := newFixture(t)
		h := &counter{}
		mw := f.mw.Required()(h)
		var wg sync.WaitGroup
		start := make(chan struct{})
		codes := make([]int, workers)
		for i := range workers {
			wg.Go(func() {
				<-start
				codes[i] = serve(mw, post("hot", `{"n":1}`)).Code
			})
		}
		close(start)
		wg.Wait()
		if n := h.runs.Load(); n != 1 {
			t.Fatalf("rep %d: handler ran %d times", rep, n)
		}
		for i, c := range codes {
			if c != http.StatusCreated && c != http.StatusConflict {
				t.Fatalf("rep %d: request %d got %d", rep, i, c)
			}
		}
	}
}

// TestWaitEndsWhenTheKeyIsHeldForAnotherRequest shows that a repeat waiting
// for its key answers 422 as soon as the key is held for a different
// request (the first was released and another took the key), rather than
// waiting on it and answering 409.
func TestWaitEndsWhenTheKeyIsHeldForAnotherRequest(t *testing.T) {
	f := newFixture(t, middleware.WithWait(2*time.Second))
	h := &counter{}
	mw := f.mw.Required()(h)
	skey := store.KeyName(scope.Anonymous, "k")
	ctx := context.Background()
	same := fingerprint.Default(post("k", `{"a":1}`), []byte(`{"a":1}`))
	other := fingerprint.Default(post("k", `{"a":2}`), []byte(`{"a":2}`))
	if _, err := f.store.Claim(ctx, skey, store.Claim{Token: "first", Fingerprint: same, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	repeat := make(chan *httptest.ResponseRecorder)
	go func() { repeat <- serve(mw, post("k", `{"a":1}`)) }()
	// The repeat's own claim found the first in flight and it now waits.
	for f.store.claims.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	if err := f.store.Release(ctx, skey, "first"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Claim(ctx, skey, store.Claim{Token: "another", Fingerprint: other, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	wantProblem(t, <-repeat, http.StatusUnprocessableEntity, idemkey.CodeKeyReused)
	if h.runs.Load() != 0 {
		t.Fatalf("handler ran %d times", h.runs.Load())
	}
}
