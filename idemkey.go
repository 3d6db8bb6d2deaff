// Package idemkey holds the protocol facts that the server half (package
// middleware), the client half (package client) and the gateway (package
// gateway) share, each written once:
//
//   - the Idempotency-Key header, its grammar and limits (ParseKey,
//     FormatKey, MaxKeyLength), the other header names, and the methods a
//     key covers (Mutation, Safe);
//   - the problem+json shape every error idemkey writes itself takes
//     (Problem), and the codes the packages share;
//   - the idempotency key of the request being served, carried in its
//     context (NewContext, FromContext), and the derivation of keys for the
//     outbound calls that request makes (Key.Derive).
//
// The middleware puts the incoming key into the request context; the
// client reads it to derive the keys it sends downstream. Neither imports
// the other: both import this package.
//
// A retried incoming request carries the same key, so every key derived from
// it is the same too, and the downstream service replays instead of acting
// twice. Two different downstream calls in one handler pass different names
// and get different keys.
package idemkey

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/idemkey/idemkey/internal/keyctx"
)

// Key is the idempotency key of an incoming request and the scope (the
// caller's namespace) it lives in.
type Key struct {
	// Scope is the caller's namespace: scope.Anonymous, or scope.Of a
	// signed-in caller's id.
	Scope string
	// Value is the key exactly as the client sent it, after unquoting.
	Value string
}

// NewContext returns a copy of ctx that carries k.
func NewContext(ctx context.Context, k Key) context.Context {
	return context.WithValue(ctx, keyctx.Key{}, k)
}

// FromContext returns the key carried by ctx, and whether there was one.
func FromContext(ctx context.Context) (Key, bool) {
	switch k := ctx.Value(keyctx.Key{}).(type) {
	case Key:
		return k, true
	case *Key:
		// The middleware's own context carries a pointer to the key it
		// keeps for the request, which never changes.
		if k != nil {
			return *k, true
		}
	}
	return Key{}, false
}

// Derive returns the key to send on an outbound call named name, made while
// serving the request that carries k. It is a SHA-256 over the
// length-prefixed scope, incoming key and name, as 64 lower-case hex digits:
// stable across retries of the incoming request, different for different
// names, scopes and keys, and revealing none of them downstream.
func (k Key) Derive(name string) string {
	h := sha256.New()
	var n [8]byte
	for _, s := range [...]string{"idemkey-derive-v1", k.Scope, k.Value, name} {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0]))
}
