// Package otel reports the idempotency middleware's decisions through the
// OpenTelemetry API (go.opentelemetry.io/otel): as metrics on a
// MeterProvider, and as attributes of the request's span. It is a plain
// middleware.Observer that uses the API alone; the service brings the SDK
// and exporters. It lives in its own package so that services that do not
// use OpenTelemetry never compile it.
//
// Wire it once, as one of the middleware's observers (each WithObserver
// adds one; every observer sees every event, in the order given):
//
//	tel, err := otel.New(otelglobal.GetMeterProvider())
//	if err != nil {
//		log.Fatal(err)
//	}
//	idem, err := middleware.New(st,
//		middleware.WithObserver(tel.Observer()),
//		middleware.WithObserver(middleware.SlogObserver(logger)))
//
// Instruments, on the meter named ScopeName:
//
//   - idemkey.events (counter, {event}): every decision, with attributes
//     idemkey.event (first_attempt, replay, in_flight, key_reused,
//     key_missing, key_invalid, request_too_large, body_unreadable, kept,
//     released, ownership_lost, store_error, store_full, scope_missing,
//     route_invalid) and http.route;
//   - idemkey.store.duration (histogram, s): the store call behind each
//     event that made one, with idemkey.event;
//   - idemkey.kept_record.size (histogram, By): the size of each kept
//     response (Event.Size of each kept event: body plus header names and
//     values). Replays are not recorded in it.
//
// On the span in the request's context (the one otelhttp or the service's
// own tracing started) each event sets idemkey.outcome (the event's name;
// later events of the request overwrite earlier ones, so a first run ends
// as kept, released or ownership_lost), idemkey.replayed (true on a
// replay) and idemkey.key_digest (the hex digest of the scope and key,
// never the key). The middleware must run inside the tracing middleware for
// the span to be there.
//
// http.route is the event's Route (the request's Pattern, else the name
// middleware.WithRouteName gives it), or "unknown" when it is empty; never
// the raw path. See package metrics/prom for where chi and http.ServeMux
// set the Pattern.
package otel

import (
	"errors"
	"fmt"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkey/idemkey/internal/buckets"
	"github.com/idemkey/idemkey/internal/option"
	"github.com/idemkey/idemkey/middleware"
)

// ScopeName is the instrumentation scope of the meter.
const ScopeName = "github.com/idemkey/idemkey"

// Attribute keys.
const (
	EventKey     = attribute.Key("idemkey.event")
	RouteKey     = attribute.Key("http.route")
	OutcomeKey   = attribute.Key("idemkey.outcome")
	ReplayedKey  = attribute.Key("idemkey.replayed")
	KeyDigestKey = attribute.Key("idemkey.key_digest")
)

// Default histogram bucket boundaries, the same as package metrics/prom's.
// They are advice to the SDK, which a View can override.
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
}

// WithLatencyBuckets sets the bucket boundaries, in seconds, advised for
// idemkey.store.duration, in strictly increasing order; at least one.
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

// WithSizeBuckets sets the bucket boundaries, in bytes, advised for
// idemkey.kept_record.size, in strictly increasing order; at least one.
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

// Metrics reports the middleware's events. Build it with New; it is safe
// for concurrent use.
type Metrics struct {
	events  metric.Int64Counter
	latency metric.Float64Histogram
	size    metric.Int64Histogram
	// eventAttrs holds the attribute set of each event kind an EventKind
	// (a uint8) can hold, built once.
	eventAttrs [256]metric.MeasurementOption
}

// New creates the instruments on mp's meter named ScopeName. It returns an
// error naming a nil mp and every invalid option, or the errors of the
// instruments mp refuses.
func New(mp metric.MeterProvider, opts ...Option) (*Metrics, error) {
	const prefix = "idemkey: otel"
	c := config{}
	err := option.Apply(prefix, &c, opts)
	if mp == nil {
		err = errors.Join(errors.New(prefix+": nil meter provider"), err)
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
	meter := mp.Meter(ScopeName)
	m := &Metrics{}
	var e error
	m.events, e = meter.Int64Counter("idemkey.events", metric.WithUnit("{event}"),
		metric.WithDescription("Decisions of the idempotency middleware, by event and route."))
	err = errors.Join(err, e)
	m.latency, e = meter.Float64Histogram("idemkey.store.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of the idempotency store call behind each event."),
		metric.WithExplicitBucketBoundaries(c.latencyBuckets...))
	err = errors.Join(err, e)
	m.size, e = meter.Int64Histogram("idemkey.kept_record.size", metric.WithUnit("By"),
		metric.WithDescription("Size of each kept response (body plus header names and values)."),
		metric.WithExplicitBucketBoundaries(c.sizeBuckets...))
	err = errors.Join(err, e)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", prefix, err)
	}
	for k := range m.eventAttrs {
		m.eventAttrs[k] = metric.WithAttributeSet(attribute.NewSet(EventKey.String(middleware.EventKind(k).String())))
	}
	return m, nil
}

// Observer returns the middleware.Observer that records each event, for
// middleware.WithObserver.
func (m *Metrics) Observer() middleware.Observer { return m.observe }

func (m *Metrics) observe(r *http.Request, e middleware.Event) {
	ctx := r.Context()
	event, route := e.Kind.String(), e.Route
	if route == "" {
		route = buckets.UnknownRoute
	}
	m.events.Add(ctx, 1, metric.WithAttributes(EventKey.String(event), RouteKey.String(route)))
	if e.StoreLatency > 0 {
		var attrs metric.MeasurementOption
		if int(e.Kind) < len(m.eventAttrs) {
			attrs = m.eventAttrs[e.Kind]
		} else {
			attrs = metric.WithAttributes(EventKey.String(event))
		}
		m.latency.Record(ctx, e.StoreLatency.Seconds(), attrs)
	}
	if e.Kind == middleware.EventKept {
		m.size.Record(ctx, int64(e.Size))
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		attrs := []attribute.KeyValue{OutcomeKey.String(event), ReplayedKey.Bool(e.Kind == middleware.EventReplay)}
		if e.KeyDigest != "" {
			attrs = append(attrs, KeyDigestKey.String(e.KeyDigest))
		}
		span.SetAttributes(attrs...)
	}
}
