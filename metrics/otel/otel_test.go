package otel_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	idemotel "github.com/idemkey/idemkey/metrics/otel"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// recorder is a MeterProvider that keeps every measurement, by instrument
// name and attribute set.
type recorder struct {
	metricnoop.MeterProvider
	mu      sync.Mutex
	meters  []string
	sums    map[string]float64   // "name{attrs}" -> sum of values
	counts  map[string]int       // "name{attrs}" -> number of measurements
	buckets map[string][]float64 // histogram name -> advised boundaries
}

func newRecorder() *recorder {
	return &recorder{sums: map[string]float64{}, counts: map[string]int{}, buckets: map[string][]float64{}}
}

func (p *recorder) Meter(name string, _ ...metric.MeterOption) metric.Meter {
	p.mu.Lock()
	p.meters = append(p.meters, name)
	p.mu.Unlock()
	return meter{p: p}
}

func (p *recorder) add(name string, set attribute.Set, v float64) {
	var kv []string
	for _, a := range set.ToSlice() {
		kv = append(kv, fmt.Sprintf("%s=%s", a.Key, a.Value.String()))
	}
	k := name + "{" + strings.Join(kv, ",") + "}"
	p.mu.Lock()
	p.sums[k] += v
	p.counts[k]++
	p.mu.Unlock()
}

type meter struct {
	metricnoop.Meter
	p *recorder
}

func (m meter) Int64Counter(name string, _ ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return counter{p: m.p, name: name}, nil
}

func (m meter) Float64Histogram(name string, opts ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	m.p.mu.Lock()
	m.p.buckets[name] = metric.NewFloat64HistogramConfig(opts...).ExplicitBucketBoundaries()
	m.p.mu.Unlock()
	return fhist{p: m.p, name: name}, nil
}

func (m meter) Int64Histogram(name string, opts ...metric.Int64HistogramOption) (metric.Int64Histogram, error) {
	m.p.mu.Lock()
	m.p.buckets[name] = metric.NewInt64HistogramConfig(opts...).ExplicitBucketBoundaries()
	m.p.mu.Unlock()
	return ihist{p: m.p, name: name}, nil
}

type counter struct {
	metricnoop.Int64Counter
	p    *recorder
	name string
}

func (c counter) Add(_ context.Context, v int64, opts ...metric.AddOption) {
	c.p.add(c.name, metric.NewAddConfig(opts).Attributes(), float64(v))
}

type fhist struct {
	metricnoop.Float64Histogram
	p    *recorder
	name string
}

func (h fhist) Record(_ context.Context, v float64, opts ...metric.RecordOption) {
	h.p.add(h.name, metric.NewRecordConfig(opts).Attributes(), v)
}

type ihist struct {
	metricnoop.Int64Histogram
	p    *recorder
	name string
}

func (h ihist) Record(_ context.Context, v int64, opts ...metric.RecordOption) {
	h.p.add(h.name, metric.NewRecordConfig(opts).Attributes(), float64(v))
}

// span is a recording span that keeps its attributes.
type span struct {
	tracenoop.Span
	mu    sync.Mutex
	attrs map[attribute.Key]attribute.Value
}

func (s *span) IsRecording() bool { return true }

func (s *span) SetAttributes(kv ...attribute.KeyValue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range kv {
		s.attrs[a.Key] = a.Value
	}
}

// TestScriptedSession counts a fixed sequence of requests through a real
// middleware exactly, and checks the span attributes each request ends
// with.
func TestScriptedSession(t *testing.T) {
	rec := newRecorder()
	tel, err := idemotel.New(rec)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rec.meters, []string{idemotel.ScopeName}) {
		t.Errorf("meters %v", rec.meters)
	}
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	var seen []middleware.Event
	idem, err := middleware.New(mem, middleware.WithObserver(tel.Observer()),
		middleware.WithObserver(func(_ *http.Request, e middleware.Event) { seen = append(seen, e) }))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		w.Write([]byte(`{"id":1}`))
	})))
	mux.Handle("PUT /profile", idem.Optional()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(500)
	})))

	send := func(method, path, key, body string, want int) map[attribute.Key]attribute.Value {
		t.Helper()
		sp := &span{attrs: map[attribute.Key]attribute.Value{}}
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r = r.WithContext(trace.ContextWithSpan(r.Context(), sp))
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		if w.Code != want {
			t.Fatalf("%s %s %q: %d, want %d", method, path, key, w.Code, want)
		}
		return sp.attrs
	}
	first := send("POST", "/payments", "k1", `{"a":1}`, 201)
	replay := send("POST", "/payments", "k1", `{"a":1}`, 201)
	reused := send("POST", "/payments", "k1", `{"a":2}`, 422)
	missing := send("POST", "/payments", "", `{}`, 400)
	released := send("PUT", "/profile", "p1", `{}`, 500)
	none := send("PUT", "/profile", "", `{}`, 500)

	digest := store.DigestOf(store.KeyName("anonymous", "k1"))
	for name, c := range map[string]struct {
		got      map[attribute.Key]attribute.Value
		outcome  string
		replayed bool
		digest   string
	}{
		"first":    {first, "kept", false, digest},
		"replay":   {replay, "replay", true, digest},
		"reused":   {reused, "key_reused", false, digest},
		"missing":  {missing, "key_missing", false, ""},
		"released": {released, "released", false, store.DigestOf(store.KeyName("anonymous", "p1"))},
	} {
		if c.got[idemotel.OutcomeKey].AsString() != c.outcome || c.got[idemotel.ReplayedKey].AsBool() != c.replayed ||
			c.got[idemotel.KeyDigestKey].AsString() != c.digest {
			t.Errorf("%s: span attributes %v, want outcome %s replayed %v digest %q", name, c.got, c.outcome, c.replayed, c.digest)
		}
	}
	if len(none) != 0 {
		t.Errorf("a request without a key on an optional route set %v", none)
	}

	wantEvents := map[string]float64{
		"idemkey.events{http.route=POST /payments,idemkey.event=first_attempt}": 1,
		"idemkey.events{http.route=POST /payments,idemkey.event=kept}":          1,
		"idemkey.events{http.route=POST /payments,idemkey.event=replay}":        1,
		"idemkey.events{http.route=POST /payments,idemkey.event=key_reused}":    1,
		"idemkey.events{http.route=POST /payments,idemkey.event=key_missing}":   1,
		"idemkey.events{http.route=PUT /profile,idemkey.event=first_attempt}":   1,
		"idemkey.events{http.route=PUT /profile,idemkey.event=released}":        1,
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	gotEvents := map[string]float64{}
	for k, v := range rec.sums {
		if strings.HasPrefix(k, "idemkey.events{") {
			gotEvents[k] = v
		}
	}
	if fmt.Sprint(gotEvents) != fmt.Sprint(wantEvents) {
		t.Errorf("events:\n got %v\nwant %v", gotEvents, wantEvents)
	}
	// Every event that follows a store call carries its latency; a
	// refusal made before any store call carries none.
	for _, ev := range []string{"first_attempt", "kept", "released", "replay", "key_reused"} {
		if n := rec.counts["idemkey.store.duration{idemkey.event="+ev+"}"]; n == 0 {
			t.Errorf("no store duration for %s", ev)
		}
	}
	for _, ev := range []string{"key_missing"} {
		if n := rec.counts["idemkey.store.duration{idemkey.event="+ev+"}"]; n != 0 {
			t.Errorf("%d store durations for %s, which carries none", n, ev)
		}
	}
	// Both observers saw every event.
	if len(seen) != 7 {
		t.Errorf("the second observer saw %d events, want 7", len(seen))
	}
	// One kept record, measured from its kept event; the replay, which
	// carries a size too, is not.
	size := len(`{"id":1}`) + len("Content-Type") + len("application/json")
	if rec.counts["idemkey.kept_record.size{}"] != 1 || rec.sums["idemkey.kept_record.size{}"] != float64(size) {
		t.Errorf("kept size: %d records, %v bytes, want 1 and %d", rec.counts["idemkey.kept_record.size{}"], rec.sums["idemkey.kept_record.size{}"], size)
	}
}

// TestRouteAndLatency: http.route is the event's Route, "unknown" when it
// is empty; the duration goes under the event's name.
func TestRouteAndLatency(t *testing.T) {
	rec := newRecorder()
	tel, err := idemotel.New(rec)
	if err != nil {
		t.Fatal(err)
	}
	obs := tel.Observer()
	obs(httptest.NewRequest("POST", "/orders/7", nil), middleware.Event{Kind: middleware.EventFirstAttempt, Route: "/orders/{id}", StoreLatency: 2 * time.Millisecond})
	obs(httptest.NewRequest("POST", "/x/8", nil), middleware.Event{Kind: middleware.EventStoreError, StoreLatency: 300 * time.Millisecond})
	obs(httptest.NewRequest("POST", "/x/9", nil), middleware.Event{Kind: middleware.EventBodyUnreadable, Route: "POST /x/{id}"})
	for k, want := range map[string]float64{
		"idemkey.events{http.route=/orders/{id},idemkey.event=first_attempt}":   1,
		"idemkey.events{http.route=unknown,idemkey.event=store_error}":          1,
		"idemkey.events{http.route=POST /x/{id},idemkey.event=body_unreadable}": 1,
		"idemkey.store.duration{idemkey.event=first_attempt}":                   0.002,
		"idemkey.store.duration{idemkey.event=store_error}":                     0.3,
	} {
		if got := rec.sums[k]; got != want {
			t.Errorf("%s = %v, want %v", k, got, want)
		}
	}
}

// TestRouteName: a route the router leaves without a Pattern is recorded
// under the name middleware.WithRouteName gives it.
func TestRouteName(t *testing.T) {
	rec := newRecorder()
	tel, err := idemotel.New(rec)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	idem, err := middleware.New(mem, middleware.WithObserver(tel.Observer()),
		middleware.WithRouteName(func(*http.Request) string { return "/orders/{id}" }))
	if err != nil {
		t.Fatal(err)
	}
	h := idem.Required()(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/orders/1", nil))
	if got := rec.sums["idemkey.events{http.route=/orders/{id},idemkey.event=key_missing}"]; got != 1 {
		t.Errorf("events %v, want one key_missing under /orders/{id}", rec.sums)
	}
}

// TestBuckets: the histograms advise DefaultLatencyBuckets and
// DefaultSizeBuckets unless an option sets others.
func TestBuckets(t *testing.T) {
	rec := newRecorder()
	if _, err := idemotel.New(rec); err != nil {
		t.Fatal(err)
	}
	wantLatency := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}
	wantSize := []float64{64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304}
	if got := rec.buckets["idemkey.store.duration"]; !slices.Equal(got, wantLatency) || !slices.Equal(idemotel.DefaultLatencyBuckets, wantLatency) {
		t.Errorf("default latency buckets %v, want %v", got, wantLatency)
	}
	if got := rec.buckets["idemkey.kept_record.size"]; !slices.Equal(got, wantSize) || !slices.Equal(idemotel.DefaultSizeBuckets, wantSize) {
		t.Errorf("default size buckets %v, want %v", got, wantSize)
	}

	rec = newRecorder()
	if _, err := idemotel.New(rec, idemotel.WithLatencyBuckets(0.1, 1), idemotel.WithSizeBuckets(100)); err != nil {
		t.Fatal(err)
	}
	if got := rec.buckets["idemkey.store.duration"]; !slices.Equal(got, []float64{0.1, 1}) {
		t.Errorf("latency buckets %v, want [0.1 1]", got)
	}
	if got := rec.buckets["idemkey.kept_record.size"]; !slices.Equal(got, []float64{100}) {
		t.Errorf("size buckets %v, want [100]", got)
	}
}

// TestNewErrors: New reports a nil provider, every invalid option value
// and every nil option, all at once.
func TestNewErrors(t *testing.T) {
	for name, opt := range map[string]idemotel.Option{
		"nil option":         nil,
		"no latency buckets": idemotel.WithLatencyBuckets(),
		"unsorted buckets":   idemotel.WithSizeBuckets(10, 5),
		"repeated bucket":    idemotel.WithLatencyBuckets(1, 1),
		"infinite bucket":    idemotel.WithSizeBuckets(1, math.Inf(1)),
		"NaN bucket":         idemotel.WithLatencyBuckets(math.NaN()),
	} {
		if _, err := idemotel.New(newRecorder(), opt); err == nil {
			t.Errorf("%s accepted", name)
		} else if !strings.HasPrefix(err.Error(), "idemkey: otel: ") {
			t.Errorf("%s: error %q without the package prefix", name, err)
		}
	}
	_, err := idemotel.New(nil, idemotel.WithLatencyBuckets(), nil)
	if err == nil {
		t.Fatal("nil provider and invalid options accepted")
	}
	for _, want := range []string{"nil meter provider", "latency buckets: none given", "option 2 is nil"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not report %q", err, want)
		}
	}
}
