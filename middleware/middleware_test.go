package middleware_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/scope"
	"github.com/idemkey/idemkey/store"
)

type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

// wantProblem checks that w is the problem+json response for code.
func wantProblem(t *testing.T, w *httptest.ResponseRecorder, status int, code string) problem {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d, want %d (body %s)", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q", ct)
	}
	var p problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body, err)
	}
	if p.Code != code || p.Status != status || p.Title == "" || p.Detail == "" || !strings.HasSuffix(p.Type, code) {
		t.Fatalf("problem %+v, want code %s status %d", p, code, status)
	}
	return p
}

func TestKeyRefusedBeforeAnyStoreCall(t *testing.T) {
	tests := []struct {
		name    string
		values  []string
		status  int
		code    string
		kind    middleware.EventKind
		handler bool
	}{
		{"missing", nil, 400, idemkey.CodeKeyMissing, middleware.EventKeyMissing, false},
		{"empty", []string{""}, 400, idemkey.CodeKeyInvalid, middleware.EventKeyInvalid, false},
		{"duplicate", []string{"a", "a"}, 400, idemkey.CodeKeyInvalid, middleware.EventKeyInvalid, false},
		{"too long", []string{strings.Repeat("x", 256)}, 400, idemkey.CodeKeyInvalid, middleware.EventKeyInvalid, false},
		{"control", []string{"a\x01"}, 400, idemkey.CodeKeyInvalid, middleware.EventKeyInvalid, false},
		{"non-ASCII", []string{"ключ"}, 400, idemkey.CodeKeyInvalid, middleware.EventKeyInvalid, false},
		{"bad quoting", []string{`"abc`}, 400, idemkey.CodeKeyInvalid, middleware.EventKeyInvalid, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			h := &counter{}
			r := post("", `{"a":1}`)
			for _, v := range tt.values {
				r.Header.Add("Idempotency-Key", v)
			}
			w := serve(f.mw.Required()(h), r)
			p := wantProblem(t, w, tt.status, tt.code)
			if len(tt.values) > 0 && len(tt.values[0]) > 3 && strings.Contains(p.Detail, tt.values[0]) {
				t.Errorf("detail echoes the key: %q", p.Detail)
			}
			if n := f.store.calls(); n != 0 {
				t.Errorf("%d store calls, want 0", n)
			}
			if h.runs.Load() != 0 {
				t.Error("handler ran")
			}
			if !f.events.has(tt.kind) {
				t.Errorf("events %v lack %v", f.events.kinds(), tt.kind)
			}
		})
	}
}

func TestUncoveredAndOptionalPassThrough(t *testing.T) {
	f := newFixture(t)
	h := &counter{}
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace} {
		r := httptest.NewRequest(m, "/payments", nil)
		r.Header.Set("Idempotency-Key", "k1")
		serve(f.mw.Required()(h), r)
	}
	// A required route's safe methods pass; an optional route without a
	// key runs the handler every time.
	opt := f.mw.Optional()(h)
	serve(opt, post("", `{}`))
	serve(opt, post("", `{}`))
	serve(f.mw.Handler(h), post("", `{}`))
	if n := h.runs.Load(); n != 7 {
		t.Fatalf("handler ran %d times, want 7", n)
	}
	if n := f.store.calls(); n != 0 {
		t.Fatalf("%d store calls, want 0", n)
	}
}

// A transient 4xx says "try again later": it is released, as a 5xx is, so
// a retry with the key runs the handler again instead of replaying the
// refusal for 24 hours. WithKeep can keep them.
func TestTransientClientErrorsAreReleased(t *testing.T) {
	for _, status := range []int{http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests, http.StatusInternalServerError} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			f := newFixture(t)
			h := &counter{status: status}
			mw := f.mw.Required()(h)
			for i := range 2 {
				w := serve(mw, post("key-1", `{"amount":10}`))
				if w.Code != status || w.Header().Get(idemkey.HeaderReplayed) != "" {
					t.Fatalf("try %d: %d, replayed %q; want %d, a run", i+1, w.Code, w.Header().Get(idemkey.HeaderReplayed), status)
				}
			}
			if h.runs.Load() != 2 || !f.events.has(middleware.EventReleased) {
				t.Fatalf("handler ran %d times, events %v; want 2 runs and a release", h.runs.Load(), f.events.kinds())
			}
		})
	}
	f := newFixture(t, middleware.WithKeep(func(s int) bool { return s < 500 }))
	h := &counter{status: http.StatusTooManyRequests}
	serve(f.mw.Required()(h), post("k", `{}`))
	if w := serve(f.mw.Required()(h), post("k", `{}`)); w.Header().Get(idemkey.HeaderReplayed) != "true" || h.runs.Load() != 1 {
		t.Fatalf("WithKeep keeping 429: replayed %q, runs %d", w.Header().Get(idemkey.HeaderReplayed), h.runs.Load())
	}
}

func TestFirstRunThenByteIdenticalReplay(t *testing.T) {
	for _, status := range []int{http.StatusOK, http.StatusCreated, http.StatusFound, http.StatusBadRequest, http.StatusNotFound, http.StatusUnprocessableEntity} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			f := newFixture(t)
			h := &counter{status: status}
			mw := f.mw.Required()(h)

			first := serve(mw, post("key-1", `{"amount":10}`))
			if first.Code != status {
				t.Fatalf("first: %d", first.Code)
			}
			if first.Header().Get(idemkey.HeaderReplayed) != "" {
				t.Fatal("first response marked replayed")
			}
			// The same request, key order and whitespace aside.
			r := post("key-1", `{ "amount" : 10 }`)
			r.Header.Set("X-Request-Id", "repeat-7")
			second := serve(mw, r)
			if h.runs.Load() != 1 {
				t.Fatalf("handler ran %d times", h.runs.Load())
			}
			if second.Code != first.Code || second.Body.String() != first.Body.String() {
				t.Fatalf("replay %d %q, first %d %q", second.Code, second.Body, first.Code, first.Body)
			}
			for _, k := range []string{"Content-Type", "X-Run"} {
				if second.Header().Get(k) != first.Header().Get(k) {
					t.Errorf("header %s: replay %q first %q", k, second.Header().Get(k), first.Header().Get(k))
				}
			}
			if got := second.Header().Get(idemkey.HeaderReplayed); got != "true" {
				t.Errorf("Idempotent-Replayed %q", got)
			}
			if got := second.Header().Get("X-Request-Id"); got != "repeat-7" {
				t.Errorf("X-Request-Id %q, want the repeat's own", got)
			}
			if got := second.Header().Get("Content-Length"); got != strconv.Itoa(first.Body.Len()) {
				t.Errorf("Content-Length %q, body %d", got, first.Body.Len())
			}
			if f.store.claims.Load() != 2 || f.store.completes.Load() != 1 || f.store.releases.Load() != 0 {
				t.Errorf("store calls: %d claims %d completes %d releases", f.store.claims.Load(), f.store.completes.Load(), f.store.releases.Load())
			}
			if !f.events.has(middleware.EventKept) || !f.events.has(middleware.EventReplay) || !f.events.has(middleware.EventFirstAttempt) {
				t.Errorf("events %v", f.events.kinds())
			}
		})
	}
}

func TestReplayWithoutRequestIDGetsFreshOne(t *testing.T) {
	f := newFixture(t)
	mw := f.mw.Required()(&counter{})
	serve(mw, post("k", `{}`))
	a := serve(mw, post("k", `{}`)).Header().Get("X-Request-Id")
	b := serve(mw, post("k", `{}`)).Header().Get("X-Request-Id")
	if len(a) != 36 || len(b) != 36 || a == b {
		t.Fatalf("request ids %q %q, want two fresh UUIDs", a, b)
	}
}

func TestQuotedAndBareKeysAreTheSameKey(t *testing.T) {
	f := newFixture(t)
	h := &counter{}
	mw := f.mw.Required()(h)
	serve(mw, post("abc", `{}`))
	w := serve(mw, post(`"abc"`, `{}`))
	if h.runs.Load() != 1 || w.Header().Get(idemkey.HeaderReplayed) != "true" {
		t.Fatalf("runs %d replayed %q", h.runs.Load(), w.Header().Get(idemkey.HeaderReplayed))
	}
}

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

func TestServerErrorsReleaseAndRunAgain(t *testing.T) {
	f := newFixture(t)
	h := &counter{status: http.StatusInternalServerError}
	mw := f.mw.Required()(h)
	for i := 1; i <= 3; i++ {
		w := serve(mw, post("k", `{}`))
		if w.Code != 500 || w.Header().Get(idemkey.HeaderReplayed) != "" {
			t.Fatalf("try %d: %d replayed=%q", i, w.Code, w.Header().Get(idemkey.HeaderReplayed))
		}
	}
	if h.runs.Load() != 3 || f.store.releases.Load() != 3 || f.store.completes.Load() != 0 {
		t.Fatalf("runs %d releases %d completes %d", h.runs.Load(), f.store.releases.Load(), f.store.completes.Load())
	}
	if !f.events.has(middleware.EventReleased) {
		t.Fatalf("events %v", f.events.kinds())
	}
	// Once it succeeds, that answer is kept.
	h.status = http.StatusOK
	serve(mw, post("k", `{}`))
	w := serve(mw, post("k", `{}`))
	if w.Header().Get(idemkey.HeaderReplayed) != "true" || h.runs.Load() != 4 {
		t.Fatalf("after success: replayed=%q runs=%d", w.Header().Get(idemkey.HeaderReplayed), h.runs.Load())
	}
}

func TestKeepOption(t *testing.T) {
	f := newFixture(t, middleware.WithKeep(func(s int) bool { return s < 400 }))
	h := &counter{status: http.StatusBadRequest}
	mw := f.mw.Required()(h)
	serve(mw, post("k", `{}`))
	serve(mw, post("k", `{}`))
	if h.runs.Load() != 2 {
		t.Fatalf("a 400 not kept under WithKeep(<400) should run again; ran %d", h.runs.Load())
	}
}

func TestPanicReleasesAndIsReraised(t *testing.T) {
	for _, value := range []any{"boom", http.ErrAbortHandler} {
		t.Run(fmt.Sprint(value), func(t *testing.T) {
			f := newFixture(t)
			runs := 0
			mw := f.mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs++
				if runs == 1 {
					w.WriteHeader(http.StatusCreated)
					panic(value)
				}
				w.WriteHeader(http.StatusAccepted)
			}))
			func() {
				defer func() {
					if got := recover(); got != value {
						t.Fatalf("recovered %v, want %v", got, value)
					}
				}()
				serve(mw, post("k", `{}`))
				t.Fatal("panic swallowed")
			}()
			if f.store.releases.Load() != 1 || f.store.completes.Load() != 0 {
				t.Fatalf("releases %d completes %d", f.store.releases.Load(), f.store.completes.Load())
			}
			if w := serve(mw, post("k", `{}`)); w.Code != http.StatusAccepted || runs != 2 {
				t.Fatalf("retry: %d, runs %d", w.Code, runs)
			}
		})
	}
}

func TestRequestTooLargeBeforeAnyStoreCall(t *testing.T) {
	f := newFixture(t, middleware.WithMaxRequestBody(16))
	h := &counter{}
	mw := f.mw.Required()(h)
	big := strings.Repeat("x", 17)

	wantProblem(t, serve(mw, post("k", big)), http.StatusRequestEntityTooLarge, idemkey.CodeRequestTooLarge)
	// Without a Content-Length (chunked), found while reading.
	r := post("k", big)
	r.ContentLength = -1
	r.Body = io.NopCloser(strings.NewReader(big))
	wantProblem(t, serve(mw, r), http.StatusRequestEntityTooLarge, idemkey.CodeRequestTooLarge)
	// An outer http.MaxBytesReader's refusal is a 413 too.
	r = post("k", big)
	r.ContentLength = -1
	r.Body = http.MaxBytesReader(httptest.NewRecorder(), io.NopCloser(strings.NewReader(big)), 8)
	wantProblem(t, serve(mw, r), http.StatusRequestEntityTooLarge, idemkey.CodeRequestTooLarge)
	if f.store.calls() != 0 || h.runs.Load() != 0 {
		t.Fatalf("store calls %d runs %d", f.store.calls(), h.runs.Load())
	}
	// Exactly at the limit is fine, and the handler reads the same body.
	w := serve(mw, post("k", strings.Repeat("y", 16)))
	if w.Code != http.StatusCreated || !strings.Contains(w.Body.String(), strings.Repeat("y", 16)) {
		t.Fatalf("at the limit: %d %q", w.Code, w.Body)
	}
}

func TestOversizeResponseKeptWithoutBodyAndNeverRerun(t *testing.T) {
	f := newFixture(t, middleware.WithMaxResponseBody(64))
	runs := 0
	big := strings.Repeat("z", 200)
	mw := f.mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.Header().Set("X-Kind", "export")
		w.WriteHeader(http.StatusCreated)
		for i := 0; i < 4; i++ {
			io.WriteString(w, big[:50])
		}
	}))
	first := serve(mw, post("k", `{}`))
	if first.Code != http.StatusCreated || first.Body.String() != big {
		t.Fatalf("first: %d %d bytes", first.Code, first.Body.Len())
	}
	second := serve(mw, post("k", `{}`))
	if runs != 1 {
		t.Fatalf("handler ran %d times", runs)
	}
	if second.Code != http.StatusCreated || second.Body.Len() != 0 ||
		second.Header().Get(idemkey.HeaderBodyOmitted) != "true" || second.Header().Get("X-Kind") != "export" ||
		second.Header().Get("Content-Length") != "0" {
		t.Fatalf("replay: %d %q %v", second.Code, second.Body, second.Header())
	}
}

func TestHeaderFilter(t *testing.T) {
	f := newFixture(t)
	mw := f.mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Set-Cookie", "session=secret")
		h.Set("Date", "Mon, 01 Jan 2001 00:00:00 GMT")
		h.Set("X-Request-Id", "first-request")
		h.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
		h.Set("Connection", "X-Hop")
		h.Set("X-Hop", "1")
		h.Set("Location", "/payments/1")
		h.Add("X-Multi", "a")
		h.Add("X-Multi", "b")
		w.WriteHeader(http.StatusCreated)
	}))
	serve(mw, post("k", `{}`))
	r := post("k", `{}`)
	r.Header.Set("X-Request-Id", "second-request")
	w := serve(mw, r)
	h := w.Header()
	for _, k := range []string{"Set-Cookie", "Date", "Traceparent", "X-Hop", "Connection"} {
		if v := h.Values(k); len(v) != 0 {
			t.Errorf("%s replayed: %q", k, v)
		}
	}
	if h.Get("X-Request-Id") != "second-request" || h.Get("Location") != "/payments/1" || strings.Join(h.Values("X-Multi"), ",") != "a,b" {
		t.Errorf("replayed headers %v", h)
	}
}

func TestHeadersSnapshotWhenStatusWritten(t *testing.T) {
	f := newFixture(t)
	mw := f.mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Before", "1")
		w.WriteHeader(http.StatusCreated)
		w.Header().Set("X-After", "1")
		io.WriteString(w, "ok")
	}))
	for i, w := range []*httptest.ResponseRecorder{serve(mw, post("k", `{}`)), serve(mw, post("k", `{}`))} {
		if w.Header().Get("X-Before") != "1" || w.Header().Get("X-After") != "" {
			t.Errorf("response %d headers %v", i, w.Header())
		}
	}
}

func TestHandlerThatWritesNothingIsKeptAs200(t *testing.T) {
	f := newFixture(t)
	runs := 0
	mw := f.mw.Required()(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { runs++ }))
	a, b := serve(mw, post("k", `{}`)), serve(mw, post("k", `{}`))
	if a.Code != 200 || b.Code != 200 || runs != 1 || b.Header().Get(idemkey.HeaderReplayed) != "true" {
		t.Fatalf("%d %d runs %d", a.Code, b.Code, runs)
	}
}

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

func TestScopesNeverShareRecords(t *testing.T) {
	f := newFixture(t)
	h := &counter{}
	mw := f.mw.Required()(h)
	as := func(user string, body string) *httptest.ResponseRecorder {
		r := post("same-key", body)
		if user != "" {
			r = r.WithContext(scope.NewContext(r.Context(), user))
		}
		return serve(mw, r)
	}
	alice := as("alice", `{"to":"a"}`)
	bob := as("bob", `{"to":"b"}`)
	anon := as("", `{"to":"c"}`)
	if h.runs.Load() != 3 || alice.Body.String() == bob.Body.String() || bob.Body.String() == anon.Body.String() {
		t.Fatalf("runs %d: %q %q %q", h.runs.Load(), alice.Body, bob.Body, anon.Body)
	}
	if again := as("bob", `{"to":"b"}`); again.Body.String() != bob.Body.String() {
		t.Fatalf("bob's replay %q, want %q", again.Body, bob.Body)
	}
}

func TestHandlerSeesKeyDeadlineAndBody(t *testing.T) {
	f := newFixture(t)
	var got idemkey.Key
	var left time.Duration
	var body string
	mw := f.mw.Required(middleware.Deadline(7 * time.Second))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = idemkey.FromContext(r.Context())
		d, _ := r.Context().Deadline()
		left = time.Until(d)
		b, _ := io.ReadAll(r.Body)
		body = string(b)
	}))
	r := post("k-9", `{"x":[1,2]}`)
	r = r.WithContext(scope.NewContext(r.Context(), "carol"))
	serve(mw, r)
	if got != (idemkey.Key{Scope: "carol", Value: "k-9"}) {
		t.Errorf("key in context %+v", got)
	}
	if left <= 6*time.Second || left > 7*time.Second {
		t.Errorf("deadline in %v, want about 7s", left)
	}
	if body != `{"x":[1,2]}` {
		t.Errorf("handler read %q", body)
	}
}

// The handler's context ends by the route's deadline, or by the request's
// own when that comes first; either way it carries the key, and contexts
// the handler derives from it end with the request's.
func TestHandlerContextDeadlineAndCancel(t *testing.T) {
	for _, c := range []struct {
		name   string
		outer  time.Duration // the request context's own deadline; 0 for none
		lo, hi time.Duration // the deadline the handler sees, from now
	}{
		{"none", 0, 6 * time.Second, 7 * time.Second},
		{"later", time.Minute, 6 * time.Second, 7 * time.Second},
		{"earlier", 3 * time.Second, 2 * time.Second, 3 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			var left time.Duration
			var key idemkey.Key
			var childErr, causeErr error
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if c.outer > 0 {
				var stop context.CancelFunc
				ctx, stop = context.WithTimeout(ctx, c.outer)
				defer stop()
			}
			mw := f.mw.Required(middleware.Deadline(7 * time.Second))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				d, ok := r.Context().Deadline()
				if !ok {
					t.Error("the handler's context has no deadline")
				}
				left = time.Until(d)
				key, _ = idemkey.FromContext(r.Context())
				child, stop := context.WithCancel(r.Context())
				defer stop()
				cancel()
				<-child.Done()
				childErr, causeErr = child.Err(), context.Cause(r.Context())
				w.WriteHeader(http.StatusCreated)
			}))
			serve(mw, post("k-ctx", `{"a":1}`).WithContext(ctx))
			if left <= c.lo || left > c.hi {
				t.Errorf("deadline in %v, want in (%v, %v]", left, c.lo, c.hi)
			}
			if key.Value != "k-ctx" {
				t.Errorf("key in context %+v", key)
			}
			if !errors.Is(childErr, context.Canceled) || !errors.Is(causeErr, context.Canceled) {
				t.Errorf("derived context ended with %v, cause %v; want context.Canceled", childErr, causeErr)
			}
		})
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

func TestNewValidatesOptions(t *testing.T) {
	f := newFixture(t)
	bad := []middleware.Option{
		middleware.WithHeader(""),
		middleware.WithMethods(http.MethodGet),
		middleware.WithMethods(),
		middleware.WithDeadline(0),
		middleware.WithRetention(-time.Second),
		middleware.WithMaxRequestBody(0),
		middleware.WithMaxResponseBody(-1),
		middleware.WithStoreTimeout(-1),
		middleware.WithWait(-1),
		middleware.WithKeep(nil),
		middleware.WithKeepHeader(nil),
		middleware.WithScope(nil),
		middleware.WithFingerprint(nil),
		middleware.WithErrorWriter(nil),
		nil,
	}
	for i, o := range bad {
		if _, err := middleware.New(f.store, o); err == nil || !strings.HasPrefix(err.Error(), "idemkey: ") {
			t.Errorf("option %d: err %v", i, err)
		}
	}
	if _, err := middleware.New(nil); err == nil {
		t.Error("nil store accepted")
	}
}

func TestDefaults(t *testing.T) {
	f := newFixture(t)
	if f.mw.HeaderName() != "Idempotency-Key" {
		t.Errorf("header %q", f.mw.HeaderName())
	}
	for _, m := range []string{"POST", "PUT", "PATCH", "DELETE"} {
		if !f.mw.Covers(m) {
			t.Errorf("%s not covered", m)
		}
	}
	if f.mw.Covers("GET") {
		t.Error("GET covered")
	}
	rt, ok := f.mw.RouteOf(f.mw.Handler(http.NotFoundHandler()))
	if !ok || rt.Required || rt.Deadline != 30*time.Second {
		t.Errorf("default route %+v %v", rt, ok)
	}
	rt, _ = f.mw.RouteOf(f.mw.Required(middleware.Deadline(time.Minute))(http.NotFoundHandler()))
	if !rt.Required || rt.Deadline != time.Minute {
		t.Errorf("required route %+v", rt)
	}
	// The claim lives the route deadline plus the margin.
	var ttl time.Duration
	probe := &ttlProbe{countingStore: f.store, ttl: &ttl}
	mw, _ := middleware.New(probe)
	serve(mw.Required(middleware.Deadline(3*time.Second))(&counter{}), post("k", `{}`))
	if ttl != 3*time.Second+middleware.ClaimMargin {
		t.Errorf("claim TTL %v", ttl)
	}
	// Retention defaults to 24 hours, the request and response limits to 1 MiB.
	if probe.retention != 24*time.Hour {
		t.Errorf("retention %v", probe.retention)
	}
	big := strings.Repeat("a", 1<<20)
	w := serve(mw.Required()(&counter{}), post("k2", `"`+big[2:]+`"`))
	if w.Code != http.StatusCreated {
		t.Errorf("1 MiB body: %d", w.Code)
	}
	w = serve(mw.Required()(&counter{}), post("k3", big+"a"))
	if w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("1 MiB + 1 body: %d", w.Code)
	}
}

type ttlProbe struct {
	*countingStore
	ttl       *time.Duration
	retention time.Duration
}

func (p *ttlProbe) Claim(ctx context.Context, key string, c store.Claim) (store.Result, error) {
	*p.ttl = c.TTL
	return p.countingStore.Claim(ctx, key, c)
}

func (p *ttlProbe) Complete(ctx context.Context, key, token string, rec *store.Record, retention time.Duration) error {
	p.retention = retention
	return p.countingStore.Complete(ctx, key, token, rec, retention)
}

func TestCustomErrorWriter(t *testing.T) {
	var got idemkey.Problem
	f := newFixture(t, middleware.WithErrorWriter(func(w http.ResponseWriter, r *http.Request, p idemkey.Problem) {
		got = p
		w.WriteHeader(p.Status)
	}))
	w := serve(f.mw.Required()(&counter{}), post("", `{}`))
	if w.Code != 400 || got.Code != idemkey.CodeKeyMissing {
		t.Fatalf("%d %+v", w.Code, got)
	}
}

func TestProblemsTable(t *testing.T) {
	want := map[string]int{
		"idempotency_key_missing": 400, "idempotency_key_invalid": 400, "request_too_large": 413,
		"request_body_unreadable": 400, "idempotency_key_reused": 422, "conflict": 409, "unavailable": 503,
		"scope_missing": 500, "route_invalid": 500,
	}
	for code, status := range want {
		if p, ok := middleware.ProblemFor(code); !ok || p.Status != status || p.Code != code {
			t.Errorf("%s: %+v", code, p)
		}
	}
	if codes := middleware.ProblemCodes(); len(codes) != len(want) {
		t.Errorf("ProblemCodes() = %v, want the %d codes of the table", codes, len(want))
	}
	// The table cannot be changed from outside: a copy comes back.
	p, _ := middleware.ProblemFor(idemkey.CodeConflict)
	p.Status = 200
	if q, _ := middleware.ProblemFor(idemkey.CodeConflict); q.Status != http.StatusConflict {
		t.Errorf("ProblemFor handed out the table's own value: status %d", q.Status)
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

func TestLocalCacheServesReplaysWithoutTheStore(t *testing.T) {
	f := newFixture(t, middleware.WithLocalCache(100, time.Minute))
	h := &counter{}
	mw := f.mw.Required()(h)
	first := serve(mw, post("k", `{"a":1}`))
	claims := f.store.claims.Load()
	for range 3 {
		w := serve(mw, post("k", `{"a":1}`))
		if w.Body.String() != first.Body.String() || w.Header().Get(idemkey.HeaderReplayed) != "true" {
			t.Fatalf("cached replay %d %q", w.Code, w.Body)
		}
	}
	wantProblem(t, serve(mw, post("k", `{"a":2}`)), http.StatusUnprocessableEntity, idemkey.CodeKeyReused)
	if got := f.store.claims.Load(); got != claims {
		t.Fatalf("%d store claims after the first run, want 0", got-claims)
	}

	// A second instance sharing the store learns the record on its first
	// replay and serves the next from its own cache.
	other, err := middleware.New(f.store, middleware.WithLocalCache(100, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	omw := other.Required()(h)
	serve(omw, post("k", `{"a":1}`))
	claims = f.store.claims.Load()
	if w := serve(omw, post("k", `{"a":1}`)); w.Body.String() != first.Body.String() || f.store.claims.Load() != claims {
		t.Fatalf("second instance: %q, claims %d -> %d", w.Body, claims, f.store.claims.Load())
	}
	if h.runs.Load() != 1 {
		t.Fatalf("handler ran %d times", h.runs.Load())
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

// TestInvalidDeadline: a route deadline that is not positive never panics;
// the route it makes answers every covered request 500 route_invalid,
// reports EventRouteInvalid with the error, and runs neither the handler
// nor a store call. Requests it does not cover pass through.
func TestInvalidDeadline(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		f := newFixture(t)
		c := &counter{}
		h := f.mw.Required(middleware.Deadline(d))(c)
		for _, r := range []*http.Request{post("k", `{}`), post("", `{}`)} {
			w := serve(h, r)
			var p idemkey.Problem
			if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != http.StatusInternalServerError || p.Code != idemkey.CodeRouteInvalid {
				t.Errorf("deadline %v: answer %d %s, want 500 %s", d, w.Code, w.Body, idemkey.CodeRouteInvalid)
			}
		}
		if n := c.runs.Load(); n != 0 || f.store.calls() != 0 {
			t.Errorf("deadline %v: %d runs, %d store calls; want none", d, n, f.store.calls())
		}
		var got error
		for _, e := range f.events.events {
			if e.Kind == middleware.EventRouteInvalid {
				got = e.Err
			}
		}
		if got == nil || !strings.Contains(got.Error(), "Deadline") {
			t.Errorf("deadline %v: event error %v, want one naming Deadline", d, got)
		}
		if w := serve(h, httptest.NewRequest(http.MethodGet, "/payments", nil)); w.Code != http.StatusCreated || c.runs.Load() != 1 {
			t.Errorf("deadline %v: a GET got %d", d, w.Code)
		}
	}
	// The zero RouteOption is invalid too.
	f := newFixture(t)
	if w := serve(f.mw.Optional(middleware.RouteOption{})(&counter{}), post("k", `{}`)); w.Code != http.StatusInternalServerError {
		t.Errorf("zero RouteOption: %d", w.Code)
	}
}
