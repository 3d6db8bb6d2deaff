package middleware_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

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

// ctxStore records what the context of each Complete and Release says: a
// client that hangs up must not stop its record from being kept or its
// claim from being released, and the store still sees the request's
// values (a trace, say).
type ctxStore struct {
	store.Store
	mu   sync.Mutex
	seen []string
}

type traceKey struct{}

func (s *ctxStore) note(op string, ctx context.Context) {
	_, hasDeadline := ctx.Deadline()
	s.mu.Lock()
	s.seen = append(s.seen, fmt.Sprintf("%s err=%v done=%v deadline=%v trace=%v", op, ctx.Err(), ctx.Done() != nil, hasDeadline, ctx.Value(traceKey{})))
	s.mu.Unlock()
}

func (s *ctxStore) Complete(ctx context.Context, key, token string, rec *store.Record, retention time.Duration) error {
	s.note("complete", ctx)
	return s.Store.Complete(ctx, key, token, rec, retention)
}

func (s *ctxStore) Release(ctx context.Context, key, token string) error {
	s.note("release", ctx)
	return s.Store.Release(ctx, key, token)
}

func TestSettlingOutlivesTheClientHangingUp(t *testing.T) {
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	st := &ctxStore{Store: mem}
	mw, err := middleware.New(st)
	if err != nil {
		t.Fatal(err)
	}
	status := http.StatusCreated
	var runs atomic.Int64
	srv := mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		// The client hangs up while the handler runs.
		r.Context().Value(cancelKey{}).(context.CancelFunc)()
		w.WriteHeader(status)
	}))
	send := func(key string) int {
		ctx, cancel := context.WithCancel(context.WithValue(context.Background(), traceKey{}, "t-1"))
		defer cancel()
		ctx = context.WithValue(ctx, cancelKey{}, cancel)
		return serve(srv, post(key, `{"a":1}`).WithContext(ctx)).Code
	}
	send("gone-kept")
	status = http.StatusServiceUnavailable
	send("gone-released")
	want := []string{
		"complete err=<nil> done=false deadline=false trace=t-1",
		"release err=<nil> done=false deadline=false trace=t-1",
	}
	if !slices.Equal(st.seen, want) {
		t.Errorf("the settling calls saw\n%q\nwant\n%q", st.seen, want)
	}
	// The record was kept and the released key runs again.
	status = http.StatusCreated
	if code := send("gone-kept"); code != http.StatusCreated {
		t.Errorf("repeat of the kept key: %d, want the kept 201", code)
	}
	if runs.Load() != 2 {
		t.Errorf("the kept key ran again: %d runs, want 2", runs.Load())
	}
	send("gone-released")
	if runs.Load() != 3 {
		t.Errorf("the released key did not run again: %d runs, want 3", runs.Load())
	}
}

type cancelKey struct{}
