// Package prom counts the idempotency middleware's decisions as Prometheus
// metrics, through github.com/prometheus/client_golang. It is a plain
// middleware.Observer: it reads each Event and nothing else, and lives in
// its own package so that services that do not use Prometheus never compile
// it.
//
// Wire it once, as one of the middleware's observers (each WithObserver
// adds one; every observer sees every event, in the order given):
//
//	met, err := prom.New(prometheus.DefaultRegisterer)
//	if err != nil {
//		log.Fatal(err)
//	}
//	idem, err := middleware.New(st,
//		middleware.WithObserver(met.Observer()),
//		middleware.WithObserver(middleware.SlogObserver(logger)))
//
// It exports three metrics:
//
//   - idemkey_events_total{event, route}: a counter of every decision, by
//     event (first_attempt, replay, in_flight, key_reused, key_missing,
//     key_invalid, request_too_large, body_unreadable, kept, released,
//     ownership_lost, store_error, store_full, scope_missing, route_invalid; see middleware.EventKind)
//     and route;
//   - idemkey_store_latency_seconds{event}: a histogram of the store call
//     behind each event that made one (first_attempt: the claim; kept: the
//     keep; released: the release; store_error and ownership_lost: the call
//     that failed), in seconds;
//   - idemkey_kept_record_bytes: a histogram of the size of each response
//     kept (Event.Size of each kept event: body plus header names and
//     values), in bytes. Replays are not counted in it.
//
// The route label is the event's Route, or "unknown" when it is empty. The
// middleware sets Route to the request's Pattern: http.ServeMux sets it to
// the route ("POST /payments"); chi v5.2 and later set it once the router
// has matched ("/payments/{id}" for middleware on the route, "/api/*" for
// middleware in a mounted sub-router's Use), but middleware in the root
// router's Use runs before any match and counts as "unknown". With chi, put
// the middleware on the route: r.With(idem.Required()).Post(...). Where the
// Pattern is empty (a router that does not set it, middleware that runs
// before the match), middleware.WithRouteName names the route. The label
// is never the raw path: paths carry ids, and a series per id would grow
// without bound.
package prom

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkey/idemkey/internal/buckets"
	"github.com/idemkey/idemkey/internal/option"
	"github.com/idemkey/idemkey/middleware"
)

// Default histogram buckets.
var (
	// DefaultLatencyBuckets, in seconds, span 0.5 ms to 1 s: a store call
	// on a healthy local network takes well under a millisecond, and the
	// Redis store gives up at 300 ms by default.
	DefaultLatencyBuckets = buckets.Latency()
	// DefaultSizeBuckets, in bytes, span 64 B to 4 MiB in steps of four.
	DefaultSizeBuckets = buckets.Size()
)

// An Option configures Metrics. New applies options in order (a later
// option of a kind overrides an earlier one), fills in the defaults of
// what no option set, and returns an error naming every invalid value and
// nil option. No option panics.
type Option func(*config) error

type config struct {
	latencyBuckets []float64
	sizeBuckets    []float64
	constLabels    prometheus.Labels
}

// WithLatencyBuckets sets the upper bounds, in seconds, of the store
// latency histogram's buckets, in strictly increasing order; at least one.
// Default: DefaultLatencyBuckets (0.5 ms to 1 s).
func WithLatencyBuckets(b ...float64) Option {
	return func(c *config) error {
		if err := buckets.Check(b); err != nil {
			return fmt.Errorf("latency buckets: %w", err)
		}
		c.latencyBuckets = append([]float64(nil), b...)
		return nil
	}
}

// WithSizeBuckets sets the upper bounds, in bytes, of the kept record size
// histogram's buckets, in strictly increasing order; at least one.
// Default: DefaultSizeBuckets (64 B to 4 MiB).
func WithSizeBuckets(b ...float64) Option {
	return func(c *config) error {
		if err := buckets.Check(b); err != nil {
			return fmt.Errorf("size buckets: %w", err)
		}
		c.sizeBuckets = append([]float64(nil), b...)
		return nil
	}
}

// WithConstLabels sets labels with fixed values on every metric, for
// example the name of the service when several share a registry. A label
// name must be non-empty UTF-8, must not start with "__" (reserved by
// Prometheus), and must not be one the metrics use themselves (event,
// route, le); a value must be UTF-8. The map is copied. Default (and nil
// or empty l): none.
func WithConstLabels(l prometheus.Labels) Option {
	return func(c *config) error {
		var errs []error
		for name, value := range l {
			switch {
			case name == "" || !utf8.ValidString(name) || strings.HasPrefix(name, "__"):
				errs = append(errs, fmt.Errorf("const label name %q is not valid", name))
			case name == "event" || name == "route" || name == "le":
				errs = append(errs, fmt.Errorf("const label name %q is used by the metrics themselves", name))
			case !utf8.ValidString(value):
				errs = append(errs, fmt.Errorf("const label %s: value %q is not UTF-8", name, value))
			}
		}
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		c.constLabels = make(prometheus.Labels, len(l))
		for name, value := range l {
			c.constLabels[name] = value
		}
		return nil
	}
}

// Metrics holds the middleware's metrics. Build it with New; it is safe for
// concurrent use.
type Metrics struct {
	events  *prometheus.CounterVec
	latency *prometheus.HistogramVec
	size    prometheus.Histogram
}

// New builds the metrics and registers them with reg. It returns an error
// naming a nil reg and every invalid option, or the error reg gives for
// metrics it already holds (a second New on the same registry).
func New(reg prometheus.Registerer, opts ...Option) (*Metrics, error) {
	const prefix = "idemkey: prom"
	c := config{}
	err := option.Apply(prefix, &c, opts)
	if reg == nil {
		err = errors.Join(errors.New(prefix+": nil registerer"), err)
	}
	if err != nil {
		return nil, err
	}
	if c.latencyBuckets == nil {
		c.latencyBuckets = DefaultLatencyBuckets
	}
	if c.sizeBuckets == nil {
		c.sizeBuckets = DefaultSizeBuckets
	}
	m := &Metrics{
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
			return nil, fmt.Errorf("%s: %w", prefix, err)
		}
		done = append(done, col)
	}
	return m, nil
}

// Observer returns the middleware.Observer that counts each event, for
// middleware.WithObserver.
func (m *Metrics) Observer() middleware.Observer {
	return m.observe
}

func (m *Metrics) observe(_ *http.Request, e middleware.Event) {
	event, route := e.Kind.String(), e.Route
	if route == "" {
		route = buckets.UnknownRoute
	}
	m.events.WithLabelValues(event, route).Inc()
	if e.StoreLatency > 0 {
		m.latency.WithLabelValues(event).Observe(e.StoreLatency.Seconds())
	}
	if e.Kind == middleware.EventKept {
		m.size.Observe(float64(e.Size))
	}
}
