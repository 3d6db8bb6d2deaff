package redis_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/redistest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

func TestWithKeyPrefixValidates(t *testing.T) {
	c := newClient(t, miniredis.RunT(t).Addr())
	for _, p := range []string{"", "billing:", "a", "svc.v2/eu-west_1:", strings.Repeat("x", redis.MaxKeyPrefixLen)} {
		if _, err := redis.New(c, redis.WithKeyPrefix(p)); err != nil {
			t.Errorf("WithKeyPrefix(%q) refused: %v", p, err)
		}
	}
	for _, p := range []string{"{billing}:", "a}", "a{", "a*", "a?", "a[b]", `a\b`, "a b", "a\n", "é", strings.Repeat("x", redis.MaxKeyPrefixLen+1)} {
		_, err := redis.New(c, redis.WithKeyPrefix(p))
		if err == nil || !strings.HasPrefix(err.Error(), "idemkey: redis: ") || !strings.Contains(err.Error(), "WithKeyPrefix") {
			t.Errorf("WithKeyPrefix(%q): error %v, want a refusal", p, err)
		}
		if redis.ValidateKeyPrefix(p) == nil {
			t.Errorf("ValidateKeyPrefix(%q) accepted it", p)
		}
	}
}

// keysOn returns the keys of the server at addr that match pattern, sorted.
func keysOn(t *testing.T, addr, pattern string) []string {
	t.Helper()
	reply, err := redistest.Do(addr, "KEYS", pattern)
	if err != nil {
		t.Fatal(err)
	}
	if reply == "" {
		return nil
	}
	keys := strings.Split(reply, "\n")
	slices.Sort(keys)
	return keys
}

// TestKeyPrefixSeparatesServices: two services on one Redis database, each
// with a prefix of its own, never see each other's keys: the same key
// claimed, completed, extended and released in one is untouched in the
// other, and every Redis key either writes starts with its prefix.
func TestKeyPrefixSeparatesServices(t *testing.T) {
	addr := redistest.Start(t)
	c := newClient(t, addr)
	ctx := context.Background()
	a := newStore(t, c, redis.WithKeyPrefix("billing:"))
	b := newStore(t, c, redis.WithKeyPrefix("shipping:"))
	bare := newStore(t, c)

	key := newKey()
	ca, cb := newClaim(1), newClaim(2)
	mustClaim(t, a, key, ca, store.Claimed)
	mustClaim(t, b, key, cb, store.Claimed) // another fingerprint: no 422 across services
	mustClaim(t, bare, key, newClaim(3), store.Claimed)
	if err := a.Extend(ctx, key, ca.Token, time.Hour); err != nil {
		t.Fatalf("extend in a: %v", err)
	}
	if err := a.Complete(ctx, key, ca.Token, record("billed", 1), time.Hour); err != nil {
		t.Fatalf("complete in a: %v", err)
	}
	// b's claim is still b's: in flight for others, Mine for its token.
	mustClaim(t, b, key, newClaim(2), store.InFlight)
	mustClaim(t, b, key, cb, store.Mine)
	if err := b.Release(ctx, key, cb.Token); err != nil {
		t.Fatalf("release in b: %v", err)
	}
	res := mustClaim(t, a, key, newClaim(1), store.Completed)
	if string(res.Record.Body) != "billed" {
		t.Errorf("a replays %q", res.Record.Body)
	}
	mustClaim(t, b, key, newClaim(2), store.Claimed) // b's key was freed, a's record is not b's

	if got, want := keysOn(t, addr, "billing:*"), []string{"billing:" + key}; !slices.Equal(got, want) {
		t.Errorf("billing keys %q, want %q", got, want)
	}
	if got, want := keysOn(t, addr, "shipping:*"), []string{"shipping:" + key}; !slices.Equal(got, want) {
		t.Errorf("shipping keys %q, want %q", got, want)
	}
	if got, want := keysOn(t, addr, store.KeyPrefix+"*"), []string{key}; !slices.Equal(got, want) {
		t.Errorf("unprefixed keys %q, want %q", got, want)
	}
	ttl, err := c.PTTL(ctx, "billing:"+key).Result()
	if err != nil || ttl < 59*time.Minute {
		t.Errorf("billing record's life %v, %v: want the retention", ttl, err)
	}
}

// TestKeyPrefixCluster: a prefix never moves a key's slot (the hash tag is
// the key's own "{<64 hex>}"), so every command and script reaches the
// master of the tag's slot, in the WAIT mode too.
func TestKeyPrefixCluster(t *testing.T) {
	cl := sharedCluster(t)
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	const prefix = "svc-a:"
	st := newStore(t, c, redis.WithKeyPrefix(prefix))
	for range 8 {
		key := newKey()
		if got, want := redistest.Slot(prefix+key), redistest.Slot(key); got != want {
			t.Fatalf("slot of %q is %d, the tag's is %d", prefix+key, got, want)
		}
		cm := newClaim(1)
		mustClaim(t, st, key, cm, store.Claimed)
		if err := st.Complete(ctx, key, cm.Token, record("ok", 1), time.Minute); err != nil {
			t.Fatalf("complete: %v", err)
		}
		node := cl.NodeForSlot(redistest.Slot(key)).Addr
		if n, _ := redistest.Do(node, "EXISTS", prefix+key); n != "1" {
			t.Errorf("%s not on the master of its tag's slot %s", prefix+key, node)
		}
	}
	// The WAIT mode pins a connection to the prefixed key's master, and
	// releases there when no replica answers.
	w := newStore(t, c, redis.WithKeyPrefix(prefix), redis.WithWaitReplicas(1, 20*time.Millisecond))
	key := newKey()
	if _, err := w.Claim(ctx, key, newClaim(1)); err == nil {
		t.Fatal("claim acknowledged by replicas the cluster does not have")
	}
	if n, _ := redistest.Do(cl.NodeForSlot(redistest.Slot(key)).Addr, "EXISTS", prefix+key); n != "0" {
		t.Error("unacknowledged prefixed claim was not released")
	}
}
