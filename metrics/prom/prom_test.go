package prom_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemkey/idemkey/metrics/prom"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// faultyStore fails claims, or answers ErrNotOwner to completes, for the
// keys it is told to.
type faultyStore struct {
	store.Store
	mu          sync.Mutex
	failClaim   map[string]bool
	loseOwnerOf map[string]bool
}

func (s *faultyStore) Claim(ctx context.Context, key string, c store.Claim) (store.Result, error) {
	s.mu.Lock()
	fail := s.failClaim[key]
	s.mu.Unlock()
	if fail {
		return store.Result{}, fmt.Errorf("%w: refused", store.ErrUnavailable)
	}
	return s.Store.Claim(ctx, key, c)
}

func (s *faultyStore) Complete(ctx context.Context, key, token string, rec *store.Record, retention time.Duration) error {
	s.mu.Lock()
	lose := s.loseOwnerOf[key]
	s.mu.Unlock()
	if lose {
		return store.ErrNotOwner
	}
	return s.Store.Complete(ctx, key, token, rec, retention)
}

type recorder struct {
	mu     sync.Mutex
	events []middleware.Event
}

func (r *recorder) observe(_ *http.Request, e middleware.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) withLatency() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := map[string]int{}
	for _, e := range r.events {
		if e.StoreLatency > 0 {
			n[e.Kind.String()]++
		}
	}
	return n
}

const paymentBody = `{"id":"pay_1","amount":10}`

// TestScriptedSession sends a fixed sequence of requests through a real
// middleware behind a ServeMux and checks every counter exactly.
func TestScriptedSession(t *testing.T) {
	reg := prometheus.NewRegistry()
	met, err := prom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	fs := &faultyStore{Store: mem,
		failClaim:   map[string]bool{store.KeyName("anonymous", "down"): true},
		loseOwnerOf: map[string]bool{store.KeyName("anonymous", "lapsed"): true},
	}
	rec := &recorder{}
	obs := met.Observer()
	idem, err := middleware.New(met.Store(fs), middleware.WithMaxRequestBody(64),
		middleware.WithObserver(func(r *http.Request, e middleware.Event) { obs(r, e); rec.observe(r, e) }))
	if err != nil {
		t.Fatal(err)
	}

	entered, proceed := make(chan struct{}), make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(paymentBody))
	})))
	mux.Handle("POST /slow", idem.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-proceed
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("ok"))
	})))
	mux.Handle("PUT /profile", idem.Optional()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "backend down", http.StatusBadGateway)
	})))
	// No route pattern: mounted without a mux.
	bare := idem.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("bare"))
	}))

	send := func(h http.Handler, method, path, key, body string, wantStatus int) {
		t.Helper()
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		if key != "" {
			r.Header.Add("Idempotency-Key", key)
		}
		if key == "twice" {
			r.Header.Add("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != wantStatus {
			t.Fatalf("%s %s key %q: status %d, want %d: %s", method, path, key, w.Code, wantStatus, w.Body)
		}
	}

	send(mux, "POST", "/payments", "k1", `{"amount":10}`, 201)          // first_attempt, kept
	send(mux, "POST", "/payments", "k1", `{"amount":10}`, 201)          // replay
	send(mux, "POST", "/payments", "k1", `{"amount":10}`, 201)          // replay
	send(mux, "POST", "/payments", "k1", `{"amount":99}`, 422)          // key_reused
	send(mux, "POST", "/payments", "", `{"amount":10}`, 400)            // key_missing
	send(mux, "POST", "/payments", "twice", `{"amount":10}`, 400)       // key_invalid
	send(mux, "POST", "/payments", "big", strings.Repeat("x", 65), 413) // request_too_large
	send(mux, "POST", "/payments", "down", `{"amount":10}`, 503)        // store_error
	send(mux, "POST", "/payments", "lapsed", `{"amount":10}`, 201)      // first_attempt, ownership_lost
	send(mux, "PUT", "/profile", "p1", `{}`, 502)                       // first_attempt, released
	send(mux, "PUT", "/profile", "", `{}`, 502)                         // optional, no key: no event
	send(mux, "GET", "/payments", "k1", "", 405)                        // not covered: no event
	send(bare, "POST", "/anything/42", "b1", `{}`, 200)                 // first_attempt, kept; route unknown

	// A repeat while the first request still runs.
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := httptest.NewRequest("POST", "/slow", strings.NewReader("{}"))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", "s1")
		mux.ServeHTTP(httptest.NewRecorder(), r)
	}()
	<-entered
	send(mux, "POST", "/slow", "s1", "{}", 409) // in_flight
	close(proceed)
	<-done // first_attempt, kept

	want := `
# HELP idemkey_events_total Decisions of the idempotency middleware, by event and route.
# TYPE idemkey_events_total counter
idemkey_events_total{event="first_attempt",route="POST /payments"} 2
idemkey_events_total{event="kept",route="POST /payments"} 1
idemkey_events_total{event="replay",route="POST /payments"} 2
idemkey_events_total{event="key_reused",route="POST /payments"} 1
idemkey_events_total{event="key_missing",route="POST /payments"} 1
idemkey_events_total{event="key_invalid",route="POST /payments"} 1
idemkey_events_total{event="request_too_large",route="POST /payments"} 1
idemkey_events_total{event="store_error",route="POST /payments"} 1
idemkey_events_total{event="ownership_lost",route="POST /payments"} 1
idemkey_events_total{event="first_attempt",route="PUT /profile"} 1
idemkey_events_total{event="released",route="PUT /profile"} 1
idemkey_events_total{event="first_attempt",route="unknown"} 1
idemkey_events_total{event="kept",route="unknown"} 1
idemkey_events_total{event="first_attempt",route="POST /slow"} 1
idemkey_events_total{event="in_flight",route="POST /slow"} 1
idemkey_events_total{event="kept",route="POST /slow"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idemkey_events_total"); err != nil {
		t.Fatal(err)
	}

	// Latency: one observation per event that carried a store call, under
	// that event's name, and none for the refusals made without one.
	withLatency := rec.withLatency()
	for _, kind := range []string{"first_attempt", "kept", "released", "store_error", "ownership_lost"} {
		if withLatency[kind] == 0 {
			t.Errorf("no %s event carried a store latency", kind)
		}
	}
	for _, kind := range []string{"first_attempt", "kept", "released", "store_error", "ownership_lost", "replay", "in_flight", "key_reused"} {
		n, want := histogramCount(t, reg, "idemkey_store_latency_seconds", kind), withLatency[kind]
		if n != want {
			t.Errorf("idemkey_store_latency_seconds{event=%q} count %d, want %d", kind, n, want)
		}
	}

	// Size: the three kept responses (the lapsed one was refused by the
	// store and is not measured).
	wantSum := 0
	for _, body := range []string{paymentBody, "bare", "ok"} {
		wantSum += len(body) + len("Content-Type")
	}
	wantSum += len("application/json") + 2*len("text/plain; charset=utf-8")
	count, sum := histogram(t, reg, "idemkey_kept_record_bytes", "")
	if count != 3 || sum != float64(wantSum) {
		t.Errorf("idemkey_kept_record_bytes: count %d sum %v, want 3 and %d", count, sum, wantSum)
	}
}

// histogram returns the sample count and sum of the histogram name, in the
// series whose event label is event ("" for an unlabelled histogram).
func histogram(t *testing.T, g prometheus.Gatherer, name, event string) (uint64, float64) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "event" {
					got = l.GetValue()
				}
			}
			if got == event {
				return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
			}
		}
	}
	return 0, 0
}

func histogramCount(t *testing.T, g prometheus.Gatherer, name, event string) int {
	n, _ := histogram(t, g, name, event)
	return int(n)
}

// TestChiRoute: chi sets the request's Pattern when it matches a route, so
// middleware on the route counts under the route template, middleware in a
// mounted sub-router's Use under the mount ("/top/*"), and middleware in
// the root router's Use, which runs before any match, under "unknown".
func TestChiRoute(t *testing.T) {
	reg := prometheus.NewRegistry()
	met, err := prom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	idem, err := middleware.New(mem, middleware.WithObserver(met.Observer()))
	if err != nil {
		t.Fatal(err)
	}
	ok := func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }
	r := chi.NewRouter()
	r.With(idem.Required()).Post("/payments/{id}/refunds", ok)
	r.Route("/top", func(r chi.Router) {
		r.Use(idem.Handler)
		r.Post("/{id}", ok)
	})
	root := chi.NewRouter()
	root.Use(idem.Handler)
	root.Post("/root/{id}", ok)
	for _, path := range []string{"/payments/1/refunds", "/payments/2/refunds", "/top/3"} {
		req := httptest.NewRequest("POST", path, nil)
		req.Header.Set("Idempotency-Key", path)
		r.ServeHTTP(httptest.NewRecorder(), req)
	}
	req := httptest.NewRequest("POST", "/root/4", nil)
	req.Header.Set("Idempotency-Key", "root")
	root.ServeHTTP(httptest.NewRecorder(), req)
	want := `
# HELP idemkey_events_total Decisions of the idempotency middleware, by event and route.
# TYPE idemkey_events_total counter
idemkey_events_total{event="first_attempt",route="/payments/{id}/refunds"} 2
idemkey_events_total{event="kept",route="/payments/{id}/refunds"} 2
idemkey_events_total{event="first_attempt",route="/top/*"} 1
idemkey_events_total{event="kept",route="/top/*"} 1
idemkey_events_total{event="first_attempt",route="unknown"} 1
idemkey_events_total{event="kept",route="unknown"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idemkey_events_total"); err != nil {
		t.Fatal(err)
	}
}

func TestRouteFunction(t *testing.T) {
	reg := prometheus.NewRegistry()
	met, err := prom.New(reg, prom.WithRoute(func(r *http.Request) string {
		if strings.HasPrefix(r.URL.Path, "/orders/") {
			return "/orders/{id}"
		}
		return ""
	}))
	if err != nil {
		t.Fatal(err)
	}
	obs := met.Observer()
	for _, path := range []string{"/orders/1", "/orders/2", "/other"} {
		obs(httptest.NewRequest("POST", path, nil), middleware.Event{Kind: middleware.EventKeyMissing})
	}
	// A pattern wins over the function.
	r := httptest.NewRequest("POST", "/orders/3", nil)
	r.Pattern = "POST /orders/{id}"
	obs(r, middleware.Event{Kind: middleware.EventKeyMissing})

	want := `
# HELP idemkey_events_total Decisions of the idempotency middleware, by event and route.
# TYPE idemkey_events_total counter
idemkey_events_total{event="key_missing",route="/orders/{id}"} 2
idemkey_events_total{event="key_missing",route="POST /orders/{id}"} 1
idemkey_events_total{event="key_missing",route="unknown"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idemkey_events_total"); err != nil {
		t.Fatal(err)
	}
}

func TestLatencyBuckets(t *testing.T) {
	reg := prometheus.NewRegistry()
	met, err := prom.New(reg, prom.WithLatencyBuckets(0.001, 0.01), prom.WithConstLabels(prometheus.Labels{"service": "pay"}))
	if err != nil {
		t.Fatal(err)
	}
	obs := met.Observer()
	r := httptest.NewRequest("POST", "/", nil)
	obs(r, middleware.Event{Kind: middleware.EventFirstAttempt, StoreLatency: 500 * time.Microsecond})
	obs(r, middleware.Event{Kind: middleware.EventFirstAttempt, StoreLatency: 5 * time.Millisecond})
	obs(r, middleware.Event{Kind: middleware.EventKept, StoreLatency: 2 * time.Second})
	obs(r, middleware.Event{Kind: middleware.EventReplay}) // no store call: not observed

	want := `
# HELP idemkey_store_latency_seconds Duration of the idempotency store call behind each event, in seconds.
# TYPE idemkey_store_latency_seconds histogram
idemkey_store_latency_seconds_bucket{event="first_attempt",service="pay",le="0.001"} 1
idemkey_store_latency_seconds_bucket{event="first_attempt",service="pay",le="0.01"} 2
idemkey_store_latency_seconds_bucket{event="first_attempt",service="pay",le="+Inf"} 2
idemkey_store_latency_seconds_sum{event="first_attempt",service="pay"} 0.0055
idemkey_store_latency_seconds_count{event="first_attempt",service="pay"} 2
idemkey_store_latency_seconds_bucket{event="kept",service="pay",le="0.001"} 0
idemkey_store_latency_seconds_bucket{event="kept",service="pay",le="0.01"} 0
idemkey_store_latency_seconds_bucket{event="kept",service="pay",le="+Inf"} 1
idemkey_store_latency_seconds_sum{event="kept",service="pay"} 2
idemkey_store_latency_seconds_count{event="kept",service="pay"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idemkey_store_latency_seconds"); err != nil {
		t.Fatal(err)
	}
}

func TestDefaultBuckets(t *testing.T) {
	reg := prometheus.NewRegistry()
	met, err := prom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	met.Observer()(httptest.NewRequest("POST", "/", nil), middleware.Event{Kind: middleware.EventKept, StoreLatency: time.Millisecond})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "idemkey_store_latency_seconds" {
			continue
		}
		var got []float64
		for _, b := range mf.GetMetric()[0].GetHistogram().GetBucket() {
			got = append(got, b.GetUpperBound())
		}
		if fmt.Sprint(got) != fmt.Sprint(prom.DefaultLatencyBuckets) {
			t.Errorf("latency buckets %v, want %v", got, prom.DefaultLatencyBuckets)
		}
		return
	}
	t.Fatal("no latency histogram gathered")
}

func TestNewErrors(t *testing.T) {
	if _, err := prom.New(nil); err == nil {
		t.Error("nil registerer accepted")
	}
	reg := prometheus.NewRegistry()
	for name, opt := range map[string]prom.Option{
		"nil option":         nil,
		"nil route":          prom.WithRoute(nil),
		"no latency buckets": prom.WithLatencyBuckets(),
		"unsorted buckets":   prom.WithSizeBuckets(10, 5),
		"repeated bucket":    prom.WithLatencyBuckets(1, 1),
	} {
		if _, err := prom.New(reg, opt); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	if _, err := prom.New(reg); err != nil {
		t.Fatalf("first New on a registry: %v", err)
	}
	_, err := prom.New(reg)
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		t.Errorf("second New on one registry: %v, want AlreadyRegisteredError", err)
	}
}

func TestRecordSize(t *testing.T) {
	rec := &store.Record{
		Header: http.Header{"Content-Type": {"application/json"}, "Vary": {"Accept", "Origin"}},
		Body:   []byte("12345"),
	}
	want := 5 + len("Content-Type") + len("application/json") + len("Vary") + len("Accept") + len("Origin")
	if got := prom.RecordSize(rec); got != want {
		t.Errorf("RecordSize = %d, want %d", got, want)
	}
}
