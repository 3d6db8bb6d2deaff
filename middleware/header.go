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
	"B3":                      true, // B3's single-header form, b3
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
// values are copied: later changes to h do not reach the result. They are
// copied into slot when it has room for them, else into a new array.
func keptHeader(h http.Header, keep func(string) bool, slot []string) http.Header {
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
	// One pass over h asks keep of each name once; the names kept are
	// noted on the stack (a response rarely sets more than a few headers),
	// and only a longer list takes a second pass.
	var names [8]string
	n, nv := 0, 0
	for k, v := range h {
		if keep(k) && !contains(hop, k) {
			if n < len(names) {
				names[n] = k
			}
			n++
			nv += len(v)
		}
	}
	out := make(http.Header, n)
	values := slot
	if len(values) >= nv {
		values = values[:nv]
	} else {
		values = make([]string, nv)
	}
	put := func(k string) {
		nv := copy(values, h[k])
		out[k] = values[:nv:nv]
		values = values[nv:]
	}
	if n <= len(names) {
		for _, k := range names[:n] {
			put(k)
		}
		return out
	}
	for k := range h {
		if keep(k) && !contains(hop, k) {
			put(k)
		}
	}
	return out
}

// headerValue is h.Get(name) for a name already in canonical form: the map
// read directly, without canonicalising the name on every call.
func headerValue(h http.Header, name string) string {
	if v := h[name]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
