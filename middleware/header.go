package middleware

import (
	"net/http"
	"strings"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/neverkept"
)

// neverKept lists, by canonical name, the headers DefaultKeepHeader refuses
// by their whole name: hop-by-hop headers, Content-Length, idemkey's own,
// and the per-call and trace-context headers both front doors refuse
// (package neverkept).
var neverKept = func() map[string]bool {
	m := map[string]bool{
		"Connection":              true,
		"Keep-Alive":              true,
		"Proxy-Authenticate":      true,
		"Proxy-Authorization":     true,
		"Proxy-Connection":        true,
		"Te":                      true,
		"Trailer":                 true,
		"Transfer-Encoding":       true,
		"Upgrade":                 true,
		"Content-Length":          true,
		idemkey.HeaderReplayed:    true,
		idemkey.HeaderBodyOmitted: true,
	}
	for _, n := range neverkept.Names() {
		m[http.CanonicalHeaderKey(n)] = true
	}
	return m
}()

// neverKeptPrefixes are package neverkept's prefixes in canonical form
// (X-B3-), and the trailer values' (Trailer:).
var neverKeptPrefixes = func() []string {
	var ps []string
	for _, p := range neverkept.Prefixes() {
		ps = append(ps, http.CanonicalHeaderKey(p))
	}
	return append(ps, http.TrailerPrefix)
}()

// DefaultKeepHeader reports whether a response header, by canonical name, is
// kept and replayed. It refuses hop-by-hop headers, Set-Cookie, Date,
// Content-Length (recomputed on replay), X-Request-Id, Server-Timing, trace
// context (traceparent, tracestate, traceresponse, baggage, B3 in both
// forms, Jaeger's uber-trace-id, AWS X-Ray, Google Cloud, gRPC's
// grpc-trace-bin, Sentry), trailer values and idemkey's own headers; it
// keeps everything else. idemgrpc's DefaultKeepMetadata refuses the same
// per-call and trace-context entries.
func DefaultKeepHeader(name string) bool {
	if neverKept[name] {
		return false
	}
	for _, p := range neverKeptPrefixes {
		if strings.HasPrefix(name, p) {
			return false
		}
	}
	return true
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
