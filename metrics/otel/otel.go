// Package otel reports the idempotency middleware's decisions through the
// OpenTelemetry API (go.opentelemetry.io/otel): as metrics on a
// MeterProvider, and as attributes of the request's span. It uses the API
// alone; the service brings the SDK and exporters. It lives in its own
// package so that services that do not use OpenTelemetry never compile it.
//
//	tel, err := otel.New(otelglobal.GetMeterProvider())
//	if err != nil {
//		log.Fatal(err)
//	}
//	idem, err := middleware.New(tel.Store(st), middleware.WithObserver(tel.Observer()))
//
// Instruments, on the meter named ScopeName:
//
//   - idemkey.events (counter, {event}): every decision, with attributes
//     idemkey.event (first_attempt, replay, in_flight, key_reused,
//     key_missing, key_invalid, request_too_large, kept, released,
//     ownership_lost, store_error) and http.route;
//   - idemkey.store.duration (histogram, s): the store call behind each
//     event that made one, with idemkey.event;
//   - idemkey.kept_record.size (histogram, By): the size of each kept
//     response, body plus header names and values; fed only by a store
//     wrapped with Metrics.Store.
//
// On the span in the request's context (the one otelhttp or the service's
// own tracing started) each event sets idemkey.outcome (the event's name;
// later events of the request overwrite earlier ones, so a first run ends
// as kept, released or ownership_lost), idemkey.replayed (true on a
// replay) and idemkey.key_digest (the hex digest of the scope and key,
// never the key). The middleware must run inside the tracing middleware for
// the span to be there.
//
// http.route is the request's Pattern, else what WithRoute's function
// returns, else "unknown"; never the raw path. See package metrics/prom for
// where chi and http.ServeMux set the Pattern.
package otel

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

// ScopeName is the instrumentation scope of the meter.
const ScopeName = "github.com/idemkey/idemkey"

// UnknownRoute is the http.route of a request without a Pattern when no
// WithRoute function names it.
const UnknownRoute = "unknown"

// Attribute keys.
const (
	EventKey     = attribute.Key("idemkey.event")
	RouteKey     = attribute.Key("http.route")
	OutcomeKey   = attribute.Key("idemkey.outcome")
	ReplayedKey  = attribute.Key("idemkey.replayed")
	KeyDigestKey = attribute.Key("idemkey.key_digest")
)

// An Option configures Metrics.
type Option func(*config)

type config struct {
	route func(*http.Request) string
	errs  []error
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

// Metrics reports the middleware's events. Build it with New; it is safe
// for concurrent use.
type Metrics struct {
	route   func(*http.Request) string
	events  metric.Int64Counter
	latency metric.Float64Histogram
	size    metric.Int64Histogram
	// eventAttrs holds each event kind's attribute set, built once.
	eventAttrs map[middleware.EventKind]metric.MeasurementOption
}

// New creates the instruments on mp's meter named ScopeName. It returns an
// error for a nil mp, an invalid option, or an instrument mp refuses.
func New(mp metric.MeterProvider, opts ...Option) (*Metrics, error) {
	if mp == nil {
		return nil, errors.New("idemkey: otel: nil meter provider")
	}
	c := config{}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("idemkey: otel: nil option")
		}
		o(&c)
	}
	if len(c.errs) > 0 {
		return nil, fmt.Errorf("idemkey: otel: %w", errors.Join(c.errs...))
	}
	meter := mp.Meter(ScopeName)
	m := &Metrics{route: c.route, eventAttrs: map[middleware.EventKind]metric.MeasurementOption{}}
	var err, e error
	m.events, e = meter.Int64Counter("idemkey.events", metric.WithUnit("{event}"),
		metric.WithDescription("Decisions of the idempotency middleware, by event and route."))
	err = errors.Join(err, e)
	m.latency, e = meter.Float64Histogram("idemkey.store.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of the idempotency store call behind each event."),
		metric.WithExplicitBucketBoundaries(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1))
	err = errors.Join(err, e)
	m.size, e = meter.Int64Histogram("idemkey.kept_record.size", metric.WithUnit("By"),
		metric.WithDescription("Size of each kept response (body plus header names and values)."),
		metric.WithExplicitBucketBoundaries(64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304))
	err = errors.Join(err, e)
	if err != nil {
		return nil, fmt.Errorf("idemkey: otel: %w", err)
	}
	for k := middleware.EventFirstAttempt; k <= middleware.EventStoreError; k++ {
		m.eventAttrs[k] = metric.WithAttributeSet(attribute.NewSet(EventKey.String(k.String())))
	}
	return m, nil
}

// Observer returns the middleware.Observer that records each event, for
// middleware.WithObserver.
func (m *Metrics) Observer() middleware.Observer { return m.observe }

func (m *Metrics) observe(r *http.Request, e middleware.Event) {
	ctx := r.Context()
	event := e.Kind.String()
	m.events.Add(ctx, 1, metric.WithAttributes(EventKey.String(event), RouteKey.String(m.routeOf(r))))
	if e.StoreLatency > 0 {
		attrs, ok := m.eventAttrs[e.Kind]
		if !ok {
			attrs = metric.WithAttributes(EventKey.String(event))
		}
		m.latency.Record(ctx, e.StoreLatency.Seconds(), attrs)
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		attrs := []attribute.KeyValue{OutcomeKey.String(event), ReplayedKey.Bool(e.Kind == middleware.EventReplay)}
		if e.KeyDigest != "" {
			attrs = append(attrs, KeyDigestKey.String(e.KeyDigest))
		}
		span.SetAttributes(attrs...)
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
// idemkey.kept_record.size; give the result to middleware.New. Every call
// goes to st unchanged. Records that st refuses are not measured.
func (m *Metrics) Store(st store.Store) store.Store { return &sizedStore{Store: st, m: m} }

type sizedStore struct {
	store.Store
	m *Metrics
}

func (s *sizedStore) Complete(ctx context.Context, key, token string, rec *store.Record, retention time.Duration) error {
	err := s.Store.Complete(ctx, key, token, rec, retention)
	if err == nil {
		n := len(rec.Body)
		for k, vs := range rec.Header {
			n += len(k)
			for _, v := range vs {
				n += len(v)
			}
		}
		s.m.size.Record(ctx, int64(n))
	}
	return err
}
