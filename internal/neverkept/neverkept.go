// Package neverkept names the response headers that belong to one
// response, which neither front door keeps for replay by default: the
// per-call values (Date, Set-Cookie, X-Request-Id, Server-Timing) and the
// trace context, written once so that package middleware (DefaultKeepHeader)
// and idemgrpc (DefaultKeepMetadata) refuse the same ones. Each adds what
// only its protocol has: middleware hop-by-hop headers, Content-Length and
// trailers; idemgrpc gRPC's reserved entries.
//
// The names are in lower case, as gRPC metadata carries them; middleware
// puts them in canonical form once, when the package is loaded.
//
// It uses only the standard library.
package neverkept

// Names returns the headers refused by their whole name, in lower case.
func Names() []string {
	return []string{
		// Per-call values.
		"date",
		"set-cookie",
		"x-request-id",
		"server-timing",
		// Trace context: W3C Trace Context (with its response header) and
		// Baggage, B3's single-header form, Jaeger, AWS X-Ray, Google
		// Cloud, OpenCensus over gRPC and Sentry.
		"traceparent",
		"tracestate",
		"traceresponse",
		"baggage",
		"b3",
		"uber-trace-id",
		"x-amzn-trace-id",
		"x-cloud-trace-context",
		"grpc-trace-bin",
		"sentry-trace",
	}
}

// Prefixes returns the prefixes, in lower case, of the headers refused
// by the start of their name: B3's multi-header form (x-b3-traceid,
// x-b3-spanid, x-b3-parentspanid, x-b3-sampled, x-b3-flags).
func Prefixes() []string {
	return []string{"x-b3-"}
}
