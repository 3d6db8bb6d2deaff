// Package keyctx holds the context key under which a request's
// idempotency key travels, so that the middleware can carry the key in a
// context of its own (one that costs no allocation per request) and
// idemkey.FromContext still finds it, and the context that carries it so
// for package middleware on HTTP and idemgrpc on gRPC.
package keyctx

import "context"

// Key is the context key. Its value is an idemkey.Key, or a pointer to one
// that never changes once the context is made.
type Key struct{}

// Carrier is a context that carries a request's key (K is idemkey.Key,
// which this package cannot name) to its handler, as idemkey.NewContext
// does, in one allocation instead of two: the key is kept in it and handed
// out by pointer, where context.WithValue would box a copy. Everything else
// it asks of Context. Make it with &Carrier[idemkey.Key]{Context: ctx,
// Key: k}, and do not change Key once it is made.
type Carrier[K any] struct {
	context.Context
	Key K
}

// Value returns a pointer to c.Key for Key, and what c.Context holds for
// any other key.
func (c *Carrier[K]) Value(k any) any {
	if k == (Key{}) {
		return &c.Key
	}
	return c.Context.Value(k)
}
