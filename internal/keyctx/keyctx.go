// Package keyctx holds the context key under which a request's
// idempotency key travels, so that the middleware can carry the key in a
// context of its own (one that costs no allocation per request) and
// idemkey.FromContext still finds it.
package keyctx

// Key is the context key. Its value is an idemkey.Key, or a pointer to one
// that never changes once the context is made.
type Key struct{}
