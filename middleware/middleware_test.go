package middleware_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/scope"
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
