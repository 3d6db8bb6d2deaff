package outkey

import (
	"context"
	"errors"
	"testing"

	"github.com/idemkey/idemkey"
)

// TestAsked: WithKey's key wins over a call name; a name derives from the
// incoming key and is nothing without one; an invalid key is an error.
func TestAsked(t *testing.T) {
	in := idemkey.Key{Scope: "alice", Value: "incoming-1"}
	served := idemkey.NewContext(context.Background(), in)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want string
	}{
		{"nothing", served, ""},
		{"key", WithKey(served, "k-1"), "k-1"},
		{"key over name", WithCallName(WithKey(served, "k-1"), "charge"), "k-1"},
		{"name", WithCallName(served, "charge"), in.Derive("charge")},
		{"name without an incoming key", WithCallName(context.Background(), "charge"), ""},
		{"empty key and name", WithCallName(WithKey(served, ""), ""), ""},
	} {
		got, err := Asked(tc.ctx)
		if err != nil || got != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	if _, err := Asked(WithKey(served, "bad\x01key")); !errors.Is(err, idemkey.ErrKeyInvalid) {
		t.Errorf("invalid key: %v, want ErrKeyInvalid", err)
	}
}
