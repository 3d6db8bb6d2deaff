// Package prom counts the idempotency middleware's decisions as Prometheus
// metrics, through github.com/prometheus/client_golang. It lives in its own
// package so that services that do not use Prometheus never compile it.
//
// Wire it as the middleware's observer:
//
//	met, err := prom.New(prometheus.DefaultRegisterer)
//	if err != nil {
//		log.Fatal(err)
//	}
//	idem, err := middleware.New(met.Store(st), middleware.WithObserver(met.Observer()))
//
// It exports three metrics:
//
//   - idemkey_events_total{event, route}: a counter of every decision, by
//     event (first_attempt, replay, in_flight, key_reused, key_missing,
//     key_invalid, request_too_large, kept, released, ownership_lost,
//     store_error; see middleware.EventKind) and route;
//   - idemkey_store_latency_seconds{event}: a histogram of the store call
//     behind each event that made one (first_attempt: the claim; kept: the
//     keep; released: the release; store_error and ownership_lost: the call
//     that failed), in seconds;
//   - idemkey_kept_record_bytes: a histogram of the size of each response
//     kept, body plus header names and values, in bytes. Only a store
//     wrapped with Metrics.Store feeds it.
//
// The route label is the request's Pattern, else what WithRoute's function
// returns, else "unknown". http.ServeMux sets the Pattern to the route
// ("POST /payments"); chi v5.2 and later set it once the router has matched
// ("/payments/{id}" for middleware on the route, "/api/*" for middleware in
// a mounted sub-router's Use), but middleware in the root router's Use runs
// before any match and counts as "unknown". The label is never the raw
// path: paths carry ids, and a series per id would grow without bound. With
// chi, put the middleware on the route: r.With(idem.Required()).Post(...).
package prom

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

// UnknownRoute is the route label of a request without a Pattern when no
// WithRoute function names it.
const UnknownRoute = "unknown"

// Default histogram buckets.
var (
	// DefaultLatencyBuckets, in seconds, span 0.5 ms to 1 s: a store call
	// on a healthy local network takes well under a millisecond, and the
	// Redis store gives up at 300 ms by default.
	DefaultLatencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}
	// DefaultSizeBuckets, in bytes, span 64 B to 4 MiB in steps of four.
	DefaultSizeBuckets = prometheus.ExponentialBuckets(64, 4, 9)
)

// An Option configures Metrics.
type Option func(*config)

type config struct {
	route          func(*http.Request) string
	latencyBuckets []float64
	sizeBuckets    []float64
	constLabels    prometheus.Labels
	errs           []error
}

// WithRoute sets the function that names the route of a request whose
// Pattern is empty. It must return a value from a small fixed set (a route
// template, never a raw path). An empty result counts as "unknown".
// Default: none, every such request counts as "unknown".
func WithRoute(f func(*http.Request) string) Option {
	return func(c *config) {
		if f == nil {
			c.errs = append(c.errs, errors.New("nil route function"))
		}
		c.route = f
	}
}

// WithLatencyBuckets sets the upper bounds, in seconds, of the store
// latency histogram's buckets, in increasing order. Default:
// DefaultLatencyBuckets.
func WithLatencyBuckets(b ...float64) Option {
	return func(c *config) {
		if err := checkBuckets(b); err != nil {
			c.errs = append(c.errs, fmt.Errorf("latency buckets: %w", err))
		}
		c.latencyBuckets = b
	}
}

// WithSizeBuckets sets the upper bounds, in bytes, of the kept record size
// histogram's buckets, in increasing order. Default: DefaultSizeBuckets.
func WithSizeBuckets(b ...float64) Option {
	return func(c *config) {
		if err := checkBuckets(b); err != nil {
			c.errs = append(c.errs, fmt.Errorf("size buckets: %w", err))
		}
		c.sizeBuckets = b
	}
}

// WithConstLabels adds labels with fixed values to every metric, for
// example the name of the service when several share a registry. Default:
// none.
func WithConstLabels(l prometheus.Labels) Option {
	return func(c *config) { c.constLabels = l }
}

func checkBuckets(b []float64) error {
	if len(b) == 0 {
		return errors.New("none given")
	}
	for i := 1; i < len(b); i++ {
		if b[i] <= b[i-1] {
			return errors.New("not in increasing order")
		}
	}
	return nil
}

// Metrics holds the middleware's metrics. Build it with New; it is safe for
// concurrent use.
type Metrics struct {
	route   func(*http.Request) string
	events  *prometheus.CounterVec
	latency *prometheus.HistogramVec
	size    prometheus.Histogram
}

// New builds the metrics and registers them with reg. It returns an error
// for a nil reg, an invalid option, or metrics that reg already holds (a
// second New on the same registry).
func New(reg prometheus.Registerer, opts ...Option) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("idemkey: prom: nil registerer")
	}
	c := config{}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("idemkey: prom: nil option")
		}
		o(&c)
	}
	if len(c.errs) > 0 {
		return nil, fmt.Errorf("idemkey: prom: %w", errors.Join(c.errs...))
	}
	if c.latencyBuckets == nil {
		c.latencyBuckets = DefaultLatencyBuckets
	}
	if c.sizeBuckets == nil {
		c.sizeBuckets = DefaultSizeBuckets
	}
	m := &Metrics{
		route: c.route,
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "idemkey_events_total",
			Help:        "Decisions of the idempotency middleware, by event and route.",
			ConstLabels: c.constLabels,
		}, []string{"event", "route"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:        "idemkey_store_latency_seconds",
			Help:        "Duration of the idempotency store call behind each event, in seconds.",
			ConstLabels: c.constLabels,
			Buckets:     c.latencyBuckets,
		}, []string{"event"}),
		size: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "idemkey_kept_record_bytes",
			Help:        "Size of each kept response (body plus header names and values), in bytes.",
			ConstLabels: c.constLabels,
			Buckets:     c.sizeBuckets,
		}),
	}
	var done []prometheus.Collector
	for _, col := range []prometheus.Collector{m.events, m.latency, m.size} {
		if err := reg.Register(col); err != nil {
			for _, d := range done {
				reg.Unregister(d)
			}
			return nil, fmt.Errorf("idemkey: prom: %w", err)
		}
		done = append(done, col)
	}
	return m, nil
}

// Observer returns the middleware.Observer that counts each event, for
// middleware.WithObserver. To log the events as well, call both:
//
//	obs, logObs := met.Observer(), middleware.SlogObserver(logger)
//	middleware.WithObserver(func(r *http.Request, e middleware.Event) { obs(r, e); logObs(r, e) })
func (m *Metrics) Observer() middleware.Observer {
	return m.observe
}

func (m *Metrics) observe(r *http.Request, e middleware.Event) {
	event := e.Kind.String()
	m.events.WithLabelValues(event, m.routeOf(r)).Inc()
	if e.StoreLatency > 0 {
		m.latency.WithLabelValues(event).Observe(e.StoreLatency.Seconds())
	}
}

func (m *Metrics) routeOf(r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	if m.route != nil {
		if s := m.route(r); s != "" {
			return s
		}
	}
	return UnknownRoute
}

// Store wraps st so that each response it keeps is measured into
// idemkey_kept_record_bytes; give the result to middleware.New. Every call
// goes to st unchanged. Records that st refuses (Complete returns an error)
// are not measured.
func (m *Metrics) Store(st store.Store) store.Store {
	return &sizedStore{Store: st, m: m}
}

// RecordSize returns the size idemkey_kept_record_bytes measures: the
// length of the body plus the lengths of the header names and values, in
// bytes. A store adds its own framing on top (store/redis: 56 bytes, plus
// 4 per header name and 4 per header value).
func RecordSize(rec *store.Record) int {
	n := len(rec.Body)
	for k, vs := range rec.Header {
		n += len(k)
		for _, v := range vs {
			n += len(v)
		}
	}
	return n
}

type sizedStore struct {
	store.Store
	m *Metrics
}

func (s *sizedStore) Complete(ctx context.Context, key, token string, rec *store.Record, retention time.Duration) error {
	err := s.Store.Complete(ctx, key, token, rec, retention)
	if err == nil {
		s.m.size.Observe(float64(RecordSize(rec)))
	}
	return err
}
