package prom_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
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
	idem, err := middleware.New(fs, middleware.WithMaxRequestBody(64),
		middleware.WithObserver(met.Observer()), middleware.WithObserver(rec.observe))
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
		var rd io.Reader = strings.NewReader(body)
		if body == "broken" {
			rd = io.MultiReader(strings.NewReader("{"), iotest.ErrReader(errors.New("connection reset")))
		}
		r := httptest.NewRequest(method, path, rd)
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
	send(mux, "POST", "/payments", "cut", "broken", 400)                // body_unreadable
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
idemkey_events_total{event="body_unreadable",route="POST /payments"} 1
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

	// Size: the three kept responses, from their kept events; not the
	// replays, and not the lapsed one, which the store refused to keep.
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

// TestKeptSizeFromEvent: the size histogram takes Event.Size of kept
// events, a zero size included, and nothing from other events, replays
// (which carry a size too) included.
func TestKeptSizeFromEvent(t *testing.T) {
	reg := prometheus.NewRegistry()
	met, err := prom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	obs := met.Observer()
	r := httptest.NewRequest("POST", "/", nil)
	obs(r, middleware.Event{Kind: middleware.EventKept, Size: 100})
	obs(r, middleware.Event{Kind: middleware.EventKept, Size: 0})
	obs(r, middleware.Event{Kind: middleware.EventReplay, Size: 100})
	obs(r, middleware.Event{Kind: middleware.EventFirstAttempt})
	if count, sum := histogram(t, reg, "idemkey_kept_record_bytes", ""); count != 2 || sum != 100 {
		t.Errorf("idemkey_kept_record_bytes: count %d sum %v, want 2 and 100", count, sum)
	}
}

// TestRouteName: a request without a Pattern counts under the name
// middleware.WithRouteName gives it, or "unknown" when that is empty; a
// Pattern wins over the name.
func TestRouteName(t *testing.T) {
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
	idem, err := middleware.New(mem, middleware.WithObserver(met.Observer()),
		middleware.WithRouteName(func(r *http.Request) string {
			if strings.HasPrefix(r.URL.Path, "/orders/") {
				return "/orders/{id}"
			}
			return ""
		}))
	if err != nil {
		t.Fatal(err)
	}
	bare := idem.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}", bare)
	for _, c := range []struct {
		h    http.Handler
		path string
	}{{bare, "/orders/1"}, {bare, "/orders/2"}, {bare, "/other"}, {mux, "/orders/3"}} {
		c.h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", c.path, nil)) // no key: key_missing
	}
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

// TestObserversCompose wires the metrics and a log as two observers, each
// with its own WithObserver, and checks that both saw every event: the log
// has one line per event the counters counted, in the same order as a
// third observer saw them.
func TestObserversCompose(t *testing.T) {
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
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rec := &recorder{}
	idem, err := middleware.New(mem,
		middleware.WithObserver(met.Observer()),
		middleware.WithObserver(middleware.SlogObserver(logger)),
		middleware.WithObserver(rec.observe))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok"))
	})))
	for _, key := range []string{"a", "a", "", "b"} {
		r := httptest.NewRequest("POST", "/payments", strings.NewReader("{}"))
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		mux.ServeHTTP(httptest.NewRecorder(), r)
	}

	var seen []string
	for _, e := range rec.events {
		seen = append(seen, e.Kind.String())
	}
	if want := []string{"first_attempt", "kept", "replay", "key_missing", "first_attempt", "kept"}; !slices.Equal(seen, want) {
		t.Fatalf("events %q, want %q", seen, want)
	}
	var logged []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		for _, f := range strings.Fields(line) {
			if ev, ok := strings.CutPrefix(f, "event="); ok {
				logged = append(logged, ev)
			}
		}
	}
	if !slices.Equal(logged, seen) {
		t.Errorf("logged events %q, want %q", logged, seen)
	}
	counted := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "idemkey_events_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "event" {
					counted[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	want := map[string]float64{}
	for _, ev := range seen {
		want[ev]++
	}
	if !maps.Equal(counted, want) {
		t.Errorf("counted %v, want %v", counted, want)
	}
}

// TestDefaultSizeBuckets: without WithSizeBuckets the size histogram has
// DefaultSizeBuckets, 64 B to 4 MiB in steps of four.
func TestDefaultSizeBuckets(t *testing.T) {
	want := []float64{64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304}
	if !slices.Equal(prom.DefaultSizeBuckets, want) {
		t.Fatalf("DefaultSizeBuckets %v, want %v", prom.DefaultSizeBuckets, want)
	}
	reg := prometheus.NewRegistry()
	met, err := prom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	met.Observer()(httptest.NewRequest("POST", "/", nil), middleware.Event{Kind: middleware.EventKept, Size: 10})
	if got := bucketBounds(t, reg, "idemkey_kept_record_bytes"); !slices.Equal(got, want) {
		t.Errorf("size buckets %v, want %v", got, want)
	}
}

func TestSizeBuckets(t *testing.T) {
	reg := prometheus.NewRegistry()
	b := []float64{10, 100}
	met, err := prom.New(reg, prom.WithSizeBuckets(b...))
	if err != nil {
		t.Fatal(err)
	}
	b[0] = 50 // the option copied its buckets
	met.Observer()(httptest.NewRequest("POST", "/", nil), middleware.Event{Kind: middleware.EventKept, Size: 10})
	if got := bucketBounds(t, reg, "idemkey_kept_record_bytes"); !slices.Equal(got, []float64{10, 100}) {
		t.Errorf("size buckets %v, want [10 100]", got)
	}
}

func bucketBounds(t *testing.T, g prometheus.Gatherer, name string) []float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var got []float64
		for _, b := range mf.GetMetric()[0].GetHistogram().GetBucket() {
			got = append(got, b.GetUpperBound())
		}
		return got
	}
	t.Fatalf("no %s gathered", name)
	return nil
}

// TestNewErrors: New reports a nil registerer, every invalid option value
// and every nil option, all at once and without panicking.
func TestNewErrors(t *testing.T) {
	reg := prometheus.NewRegistry()
	for name, opt := range map[string]prom.Option{
		"nil option":           nil,
		"no latency buckets":   prom.WithLatencyBuckets(),
		"unsorted buckets":     prom.WithSizeBuckets(10, 5),
		"repeated bucket":      prom.WithLatencyBuckets(1, 1),
		"NaN bucket":           prom.WithSizeBuckets(math.NaN()),
		"empty label name":     prom.WithConstLabels(prometheus.Labels{"": "x"}),
		"reserved label name":  prom.WithConstLabels(prometheus.Labels{"__name__": "x"}),
		"label used by metric": prom.WithConstLabels(prometheus.Labels{"route": "x"}),
		"le label":             prom.WithConstLabels(prometheus.Labels{"le": "1"}), // client_golang panics on it
		"label value not UTF8": prom.WithConstLabels(prometheus.Labels{"service": "\xff"}),
	} {
		if _, err := prom.New(reg, opt); err == nil {
			t.Errorf("%s accepted", name)
		} else if !strings.HasPrefix(err.Error(), "idemkey: prom: ") {
			t.Errorf("%s: error %q without the package prefix", name, err)
		}
	}

	_, err := prom.New(nil, prom.WithLatencyBuckets(), nil, prom.WithSizeBuckets(2, 1))
	if err == nil {
		t.Fatal("nil registerer and invalid options accepted")
	}
	for _, want := range []string{"nil registerer", "latency buckets: none given", "option 2 is nil", "size buckets: not in strictly increasing order"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not report %q", err, want)
		}
	}

	if _, err := prom.New(reg, prom.WithConstLabels(nil)); err != nil {
		t.Fatalf("New with no const labels: %v", err)
	}
	_, err = prom.New(reg)
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		t.Errorf("second New on one registry: %v, want AlreadyRegisteredError", err)
	}
}

// TestConstLabelsCopied: a change to the map after New does not reach the
// metrics.
func TestConstLabelsCopied(t *testing.T) {
	reg := prometheus.NewRegistry()
	l := prometheus.Labels{"service": "pay"}
	met, err := prom.New(reg, prom.WithConstLabels(l))
	if err != nil {
		t.Fatal(err)
	}
	l["service"] = "other"
	met.Observer()(httptest.NewRequest("POST", "/", nil), middleware.Event{Kind: middleware.EventKeyMissing, Route: "POST /x"})
	want := `
# HELP idemkey_events_total Decisions of the idempotency middleware, by event and route.
# TYPE idemkey_events_total counter
idemkey_events_total{event="key_missing",route="POST /x",service="pay"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idemkey_events_total"); err != nil {
		t.Fatal(err)
	}
}
