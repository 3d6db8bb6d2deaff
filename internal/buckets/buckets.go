// Package buckets holds what the metrics adapters (metrics/prom and
// metrics/otel) share: the default histogram buckets, the one rule for
// buckets a service gives, and the route name of an event without one.
package buckets

import (
	"errors"
	"math"
)

// Latency, in seconds, spans 0.5 ms to 1 s: a store call on a healthy
// local network takes well under a millisecond, and the stores give up at
// 300 ms by default.
func Latency() []float64 {
	return []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}
}

// Size, in bytes, spans 64 B to 4 MiB in steps of four.
func Size() []float64 {
	return []float64{64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304}
}

// UnknownRoute names the route of an event that has none.
const UnknownRoute = "unknown"

// Check reports what is wrong with upper bounds b: none given, a bound
// that is not finite (the adapters add the +Inf bucket themselves), or
// bounds not in strictly increasing order.
func Check(b []float64) error {
	if len(b) == 0 {
		return errors.New("none given")
	}
	for i := range b {
		if math.IsNaN(b[i]) || math.IsInf(b[i], 0) {
			return errors.New("not finite")
		}
		if i > 0 && b[i] <= b[i-1] {
			return errors.New("not in strictly increasing order")
		}
	}
	return nil
}
