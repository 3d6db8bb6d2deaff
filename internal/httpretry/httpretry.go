// Package httpretry holds what the client and the gateway must know of the
// resends net/http's Transport makes on its own.
package httpretry

import "net/http"

// LooksIdempotent reports whether net/http's Transport counts a request
// with header h as idempotent whatever its method: it does when h has an
// Idempotency-Key or X-Idempotency-Key entry, of any value (see
// http.Transport). Such a request, when it has no body or has GetBody, is
// resent by the Transport itself, on a new connection, when a kept-alive
// connection it was written to breaks before the response. That is right
// for a key the server honours, and wrong for any other: a blank or
// invalid key, a route that ignores keys, another header's name. The
// Transport resends only on a connection it had used before, so a request
// that must reach its server at most once and that looks idempotent goes
// out, without GetBody, on a Transport without keep-alives (Once).
func LooksIdempotent(h http.Header) bool {
	_, a := h["Idempotency-Key"]
	_, b := h["X-Idempotency-Key"]
	return a || b
}

// Once returns a copy of t that never keeps a connection alive, so that
// it never resends a request on its own.
func Once(t *http.Transport) *http.Transport {
	o := t.Clone()
	o.DisableKeepAlives = true
	return o
}
