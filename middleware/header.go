package middleware

import (
	"net/http"
	"strings"

	"github.com/idemkey/idemkey"
)

// neverKept lists, by canonical name, the headers DefaultKeepHeader refuses:
// hop-by-hop headers, per-response headers and trace context.
var neverKept = map[string]bool{
	"Connection":              true,
	"Keep-Alive":              true,
	"Proxy-Authenticate":      true,
	"Proxy-Authorization":     true,
	"Proxy-Connection":        true,
	"Te":                      true,
	"Trailer":                 true,
	"Transfer-Encoding":       true,
	"Upgrade":                 true,
	"Set-Cookie":              true,
	"Date":                    true,
	"Content-Length":          true,
	"X-Request-Id":            true,
	"Traceparent":             true,
	"Tracestate":              true,
	"Baggage":                 true,
	"Uber-Trace-Id":           true,
	"X-Amzn-Trace-Id":         true,
	"X-Cloud-Trace-Context":   true,
	"Server-Timing":           true,
	idemkey.HeaderReplayed:    true,
	idemkey.HeaderBodyOmitted: true,
}

// DefaultKeepHeader reports whether a response header, by canonical name, is
// kept and replayed. It refuses hop-by-hop headers, Set-Cookie, Date,
// Content-Length (recomputed on replay), X-Request-Id, trace context
// (traceparent, tracestate, baggage, B3, Jaeger, AWS, Google Cloud),
// Server-Timing, trailer values and idemkey's own headers; it keeps
// everything else.
func DefaultKeepHeader(name string) bool {
	return !neverKept[name] && !strings.HasPrefix(name, "X-B3-") && !strings.HasPrefix(name, http.TrailerPrefix)
}

// keptHeader returns the headers of h that keep accepts, leaving out any
// header h's Connection header names (hop-by-hop by declaration). The
// values are copied: later changes to h do not reach the result.
func keptHeader(h http.Header, keep func(string) bool) http.Header {
	var hop []string
	if c := h["Connection"]; len(c) > 0 {
		for _, v := range c {
			for f := range strings.SplitSeq(v, ",") {
				if f = strings.TrimSpace(f); f != "" {
					hop = append(hop, http.CanonicalHeaderKey(f))
				}
			}
		}
	}
	n, nv := 0, 0
	for k, v := range h {
		if keep(k) && !contains(hop, k) {
			n++
			nv += len(v)
		}
	}
	out := make(http.Header, n)
	values := make([]string, nv)
	for k, v := range h {
		if keep(k) && !contains(hop, k) {
			nv := copy(values, v)
			out[k] = values[:nv:nv]
			values = values[nv:]
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
