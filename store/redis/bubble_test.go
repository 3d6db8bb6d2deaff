package redis_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// bubbleClaims claims and completes a fresh key on st, and answers a
// repeat, from inside a synctest bubble. Fake time stands still during
// network I/O, so every bubble makes its calls at the same instant and
// their budgets end in the same deadline slot.
func bubbleClaims(t *testing.T, st *redis.Store) {
	t.Helper()
	ctx := context.Background()
	key := newKey()
	c := newClaim(1)
	mustClaim(t, st, key, c, store.Claimed)
	if err := st.Complete(ctx, key, c.Token, record("ok", 1), time.Minute); err != nil {
		t.Fatalf("complete: %v", err)
	}
	mustClaim(t, st, key, newClaim(1), store.Completed)
}

// TestStoreInSynctestBubbles: a service's tests may run the store inside
// testing/synctest bubbles, one after the other or side by side, with a
// Store made in each bubble or one made outside them all. A call must never
// get a deadline slot another bubble made (waiting on it is a fatal error,
// and its timer belongs to a bubble that may have ended).
func TestStoreInSynctestBubbles(t *testing.T) {
	m := miniredis.RunT(t)
	outside := newStore(t, newClient(t, m.Addr()))
	inBubble := func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := goredis.NewClient(&goredis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
			defer c.Close()
			st, err := redis.New(c)
			if err != nil {
				t.Fatal(err)
			}
			bubbleClaims(t, st)
			bubbleClaims(t, outside)
		})
	}
	t.Run("one after the other", func(t *testing.T) {
		for range 3 {
			inBubble(t)
		}
	})
	t.Run("side by side", func(t *testing.T) {
		for range 3 {
			t.Run("bubble", func(t *testing.T) {
				t.Parallel()
				inBubble(t)
			})
		}
	})
	// And outside any bubble again.
	bubbleClaims(t, outside)
}
