package redis_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/redistest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// TestSentinelFailover kills the master of a master+replica+sentinel set
// while claims stream in through a FailoverClient, and measures how long
// claims fail and how many acknowledged claims the promoted replica does not
// have: with asynchronous replication, and with WithWaitReplicas.
//
// With WAIT the new master has no replica to acknowledge claims, so claims
// fail until the old master is back (restarted empty, the sentinel makes it
// a replica of the new master); the recovery time includes that.
func TestSentinelFailover(t *testing.T) {
	for _, mode := range []struct {
		name string
		opts []redis.Option
	}{
		{"Async", nil},
		{"WaitReplicas", []redis.Option{redis.WithWaitReplicas(1, 100*time.Millisecond)}},
		{"AutoPipeline", []redis.Option{redis.WithAutoPipeline()}},
		{"WaitReplicasAutoPipeline", []redis.Option{redis.WithWaitReplicas(1, 100*time.Millisecond), redis.WithAutoPipeline()}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			ss := redistest.StartSentinel(t, redistest.SentinelConfig{DownAfter: time.Second, FailoverTimeout: 3 * time.Second})
			c := goredis.NewFailoverClient(&goredis.FailoverOptions{
				MasterName:            ss.MasterName,
				SentinelAddrs:         ss.SentinelAddrs(),
				ContextTimeoutEnabled: true,
				PoolSize:              32,
			})
			t.Cleanup(func() { c.Close() })
			st := newStore(t, c, append([]redis.Option{redis.WithCallTimeout(300 * time.Millisecond)}, mode.opts...)...)
			rep, err := st.Check(context.Background())
			if err != nil || len(rep.Nodes) != 1 || rep.Nodes[0].MaxmemoryPolicy != "noeviction" || rep.Persistent {
				t.Fatalf("Check through the FailoverClient: %+v, %v", rep, err)
			}
			runFailover(t, ss, st, strings.HasPrefix(mode.name, "WaitReplicas"))
		})
	}
}

func runFailover(t *testing.T, ss *redistest.Sentinel, st *redis.Store, restartOldMaster bool) {
	const writers = 8
	var (
		mu        sync.Mutex
		acked     []string
		failures  atomic.Int64
		killedAt  atomic.Int64 // unix nanos; 0 before the kill
		recovered atomic.Int64 // unix nanos of the first claim started after the kill and acknowledged
		stop      = make(chan struct{})
		wg        sync.WaitGroup
	)
	ctx := context.Background()
	for range writers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				key, c := newKey(), newClaim(1)
				c.TTL = 5 * time.Minute // outlives the test: a missing key was lost, not lapsed
				started := time.Now().UnixNano()
				res, err := st.Claim(ctx, key, c)
				if err != nil {
					failures.Add(1)
					time.Sleep(5 * time.Millisecond)
					continue
				}
				if res.State != store.Claimed {
					t.Errorf("claim of a fresh key: %v", res.State)
					return
				}
				mu.Lock()
				acked = append(acked, key)
				mu.Unlock()
				if k := killedAt.Load(); k != 0 && started > k {
					recovered.CompareAndSwap(0, time.Now().UnixNano())
				}
			}
		})
	}
	// Let claims flow for a while before the kill.
	var before int
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		before = len(acked)
		mu.Unlock()
		if before >= 500 {
			break
		}
	}
	if before == 0 {
		close(stop)
		wg.Wait()
		t.Fatalf("no claim acknowledged before the kill (%d failures)", failures.Load())
	}
	oldMaster := ss.Master
	killed := time.Now()
	oldMaster.Kill()
	killedAt.Store(killed.UnixNano())

	deadline := killed.Add(30 * time.Second)
	restarted := false
	var promoted time.Duration
	for recovered.Load() == 0 && time.Now().Before(deadline) {
		if addr, err := ss.CurrentMaster(); err == nil && addr != oldMaster.Addr && promoted == 0 {
			promoted = time.Since(killed)
		}
		if restartOldMaster && !restarted && promoted != 0 {
			// Back as a replica of the new master, as its configuration
			// would have it once the sentinel rewrote it.
			addr, _ := ss.CurrentMaster()
			host, port, _ := strings.Cut(addr, ":")
			if err := oldMaster.Restart("--replicaof", host, port); err != nil {
				t.Fatal(err)
			}
			restarted = true
		}
		time.Sleep(10 * time.Millisecond)
	}
	rec := recovered.Load()
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	if rec == 0 {
		t.Fatalf("claims did not succeed again within 30s of the kill (%d failures)", failures.Load())
	}
	recovery := time.Unix(0, rec).Sub(killed)

	// The master now: the promoted replica, or (after a second failover on
	// a loaded machine) the old master restarted as its replica, which has
	// everything the replica had.
	newMaster, err := ss.CurrentMaster()
	if err != nil {
		t.Fatalf("sentinel names no master after the failover: %v\n%s", err, ss.Sentinel.LogTail())
	}
	if newMaster == oldMaster.Addr && !restartOldMaster {
		t.Fatalf("sentinel names the killed master %s after the failover:\n%s", newMaster, ss.Sentinel.LogTail())
	}
	nc := goredis.NewClient(&goredis.Options{Addr: newMaster})
	defer nc.Close()
	mu.Lock()
	keys := append([]string(nil), acked...)
	mu.Unlock()
	pipe := nc.Pipeline()
	cmds := make([]*goredis.IntCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Exists(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	lost := 0
	for _, cmd := range cmds {
		if cmd.Val() != 1 {
			lost++
		}
	}
	t.Logf("failover: replica promoted %v after the kill; claims succeeded again %v after the kill (old master restarted: %v)",
		promoted.Round(time.Millisecond), recovery.Round(time.Millisecond), restarted)
	t.Logf("failover: %d claims acknowledged (%d before the kill), %d lost by the promoted replica, %d failed calls",
		len(keys), before, lost, failures.Load())
	if restartOldMaster && lost != 0 {
		t.Errorf("WAIT mode lost %d acknowledged claims", lost)
	}
}
