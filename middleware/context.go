package middleware

import (
	"context"

	"github.com/idemkey/idemkey"
)

// KeyFromContext returns the idempotency key and scope of the request being
// served, inside a handler the middleware runs as the key's owner. It is
// idemkey.FromContext, here for discovery: the client package reads the
// same value to derive keys for outbound calls.
func KeyFromContext(ctx context.Context) (idemkey.Key, bool) {
	return idemkey.FromContext(ctx)
}
