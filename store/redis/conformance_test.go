package redis_test

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/redistest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
	"github.com/idemkey/idemkey/store/storetest"
)

func TestConformanceMiniredis(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		mr := newMini(t)
		return storetest.Harness{Store: mr.store(t), Advance: mr.FastForward}
	})
}

func TestConformanceRedis(t *testing.T) {
	st := newStore(t, newClient(t, redistest.Start(t)))
	storetest.Run(t, func(*testing.T) storetest.Harness {
		return storetest.Harness{Store: st}
	})
}

// TestConformanceKeyPrefix runs the suite with WithKeyPrefix on miniredis
// (whose clock the suite moves) and on a redis-server.
func TestConformanceKeyPrefix(t *testing.T) {
	t.Run("Miniredis", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) storetest.Harness {
			mr := newMini(t)
			return storetest.Harness{Store: mr.store(t, redis.WithKeyPrefix("svc:")), Advance: mr.FastForward}
		})
	})
	t.Run("Redis", func(t *testing.T) {
		st := newStore(t, newClient(t, redistest.Start(t)), redis.WithKeyPrefix("svc:"))
		storetest.Run(t, func(*testing.T) storetest.Harness {
			return storetest.Harness{Store: st}
		})
	})
}

// TestConformanceAutoPipeline runs the suite with WithAutoPipeline, on
// miniredis, a redis-server and a Cluster.
func TestConformanceAutoPipeline(t *testing.T) {
	t.Run("Miniredis", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) storetest.Harness {
			mr := newMini(t)
			return storetest.Harness{Store: mr.store(t, redis.WithAutoPipeline()), Advance: mr.FastForward}
		})
	})
	t.Run("Redis", func(t *testing.T) {
		st := newStore(t, newClient(t, redistest.Start(t)), redis.WithAutoPipeline())
		storetest.Run(t, func(*testing.T) storetest.Harness {
			return storetest.Harness{Store: st}
		})
	})
	t.Run("Cluster", func(t *testing.T) {
		c := goredis.NewClusterClient(&goredis.ClusterOptions{
			Addrs:                 sharedCluster(t).Addrs(),
			ContextTimeoutEnabled: true,
			PoolSize:              64,
		})
		t.Cleanup(func() { c.Close() })
		st := newStore(t, c, redis.WithAutoPipeline())
		storetest.Run(t, func(*testing.T) storetest.Harness {
			return storetest.Harness{Store: st}
		})
	})
}

// TestConformanceSharedRedis runs the suite against the Redis that
// REDIS_URL names (CI's shared server), under the suite's random key names:
// it writes nothing else and deletes nothing it did not write. Without
// REDIS_URL it skips.
func TestConformanceSharedRedis(t *testing.T) {
	u := os.Getenv("REDIS_URL")
	if u == "" {
		t.Skip("REDIS_URL not set")
	}
	opt, err := goredis.ParseURL(u)
	if err != nil {
		t.Fatalf("REDIS_URL: %v", err)
	}
	opt.ContextTimeoutEnabled, opt.PoolSize = true, 64
	c := goredis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	st := newStore(t, c)
	storetest.Run(t, func(*testing.T) storetest.Harness {
		return storetest.Harness{Store: st}
	})
}

// TestConformanceRedisNoContextTimeouts runs the suite through a client
// without ContextTimeoutEnabled, where the store bounds each call itself.
func TestConformanceRedisNoContextTimeouts(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: redistest.Start(t), PoolSize: 64})
	t.Cleanup(func() { c.Close() })
	st := newStore(t, c)
	storetest.Run(t, func(*testing.T) storetest.Harness {
		return storetest.Harness{Store: st}
	})
}

func TestConformanceCluster(t *testing.T) {
	cl := sharedCluster(t)
	c := goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs:                 cl.Addrs(),
		ContextTimeoutEnabled: true,
		PoolSize:              64,
	})
	t.Cleanup(func() { c.Close() })
	rec := &keyRecorder{Store: newStore(t, c)}
	storetest.Run(t, func(*testing.T) storetest.Harness {
		return storetest.Harness{Store: rec}
	})

	// The suite's keys spread over every master, and each master holds
	// the slots its keys hash to (a node asked about another's slot answers
	// MOVED).
	perNode := make(map[string]int)
	for key := range rec.keys {
		slot := redistest.Slot(key)
		node := cl.NodeForSlot(slot)
		perNode[node.Addr]++
		if got, err := redistest.Do(node.Addr, "CLUSTER", "KEYSLOT", key); err != nil || got != strconv.Itoa(slot) {
			t.Fatalf("CLUSTER KEYSLOT %s = %q, %v; want %d", key, got, err, slot)
		}
		if _, err := redistest.Do(node.Addr, "EXISTS", key); err != nil {
			t.Fatalf("EXISTS %s on %s: %v", key, node.Addr, err)
		}
	}
	for _, node := range cl.Nodes {
		if perNode[node.Addr] == 0 {
			t.Errorf("no key of the suite landed on master %s: %v", node.Addr, perNode)
		}
	}
	t.Logf("keys per master: %v", perNode)
}

// keyRecorder is a store.Store that remembers the keys it was asked about.
type keyRecorder struct {
	store.Store
	mu   sync.Mutex
	keys map[string]bool
}

func (r *keyRecorder) note(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.keys == nil {
		r.keys = make(map[string]bool)
	}
	r.keys[key] = true
}

func (r *keyRecorder) Claim(ctx context.Context, key string, c store.Claim) (store.Result, error) {
	r.note(key)
	return r.Store.Claim(ctx, key, c)
}

func (r *keyRecorder) Complete(ctx context.Context, key, token string, rec *store.Record, retention time.Duration) error {
	r.note(key)
	return r.Store.Complete(ctx, key, token, rec, retention)
}
