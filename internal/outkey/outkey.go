// Package outkey holds what a caller says about the key of the calls it
// makes downstream: a key of its own (WithKey) or a name (WithCallName)
// from which the key is derived from the key of the request being served.
// package client's Transport (HTTP) and idemgrpc's client interceptor
// (gRPC) both read it, under the same context keys, so that one
// client.WithCallName (or idemgrpc.WithCallName) names a call whichever
// way it goes out.
package outkey

import (
	"context"
	"fmt"

	"github.com/idemkey/idemkey"
)

type keyContextKey struct{}

type callNameContextKey struct{}

// WithKey returns a copy of ctx whose outbound calls send key. An empty
// key is the same as none.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContextKey{}, key)
}

// WithCallName returns a copy of ctx that names its outbound calls. An
// empty name is the same as none.
func WithCallName(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, callNameContextKey{}, name)
}

// Asked returns the key the caller asked an outbound call made with ctx to
// send: WithKey's, else, while serving a request that carries a key
// (idemkey.FromContext), the one derived from it with WithCallName's name
// (idemkey.Key.Derive), else "". A key from WithKey that idemkey.ValidKey
// refuses is an error wrapping idemkey.ErrKeyInvalid, which the caller
// prefixes with its package's name.
func Asked(ctx context.Context) (string, error) {
	if k, _ := ctx.Value(keyContextKey{}).(string); k != "" {
		if !idemkey.ValidKey(k) {
			return "", fmt.Errorf("key from WithKey: %w", idemkey.ErrKeyInvalid)
		}
		return k, nil
	}
	if name, _ := ctx.Value(callNameContextKey{}).(string); name != "" {
		if in, ok := idemkey.FromContext(ctx); ok {
			return in.Derive(name), nil
		}
	}
	return "", nil
}
