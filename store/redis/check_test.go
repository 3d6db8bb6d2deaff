package redis_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/redistest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

func TestCheck(t *testing.T) {
	srv := redistest.StartServer(t)
	c := newClient(t, srv.Addr)
	st := newStore(t, c)
	ctx := context.Background()
	config := func(kv ...string) {
		t.Helper()
		for i := 0; i < len(kv); i += 2 {
			if err := c.ConfigSet(ctx, kv[i], kv[i+1]).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}

	// The spawned server: noeviction (the default), nothing on disk.
	rep, err := st.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Nodes) != 1 || rep.Nodes[0].Addr != srv.Addr || rep.Nodes[0].MaxmemoryPolicy != "noeviction" || rep.Nodes[0].Version == "" {
		t.Errorf("nodes = %+v", rep.Nodes)
	}
	if !rep.EvictionSafe || rep.Persistent || rep.Nodes[0].AOF || rep.Nodes[0].RDBSave != "" {
		t.Errorf("report = %+v, want eviction-safe and not persistent", rep)
	}
	if len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "persistence is off") {
		t.Errorf("warnings = %q", rep.Warnings)
	}

	config("save", "900 1 300 10")
	if rep, err = st.Check(ctx); err != nil || !rep.Persistent || rep.Nodes[0].RDBSave != "900 1 300 10" || len(rep.Warnings) != 0 {
		t.Errorf("with RDB: %+v, %v", rep, err)
	}
	config("save", "", "appendonly", "yes")
	if rep, err = st.Check(ctx); err != nil || !rep.Persistent || !rep.Nodes[0].AOF || rep.Nodes[0].RDBSave != "" {
		t.Errorf("with AOF: %+v, %v", rep, err)
	}

	config("maxmemory-policy", "allkeys-lru")
	rep, err = st.Check(ctx)
	if !errors.Is(err, redis.ErrEvictionPolicy) || !strings.Contains(err.Error(), "allkeys-lru") {
		t.Errorf("allkeys-lru: err = %v, want ErrEvictionPolicy", err)
	}
	if rep.EvictionSafe || rep.Nodes[0].MaxmemoryPolicy != "allkeys-lru" {
		t.Errorf("allkeys-lru: report %+v", rep)
	}

	// Warn-only: no error, a warning in the report and in the log.
	var logged bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	defer slog.SetDefault(old)
	warn := newStore(t, c, redis.WithEvictionWarning())
	rep, err = warn.Check(ctx)
	if err != nil {
		t.Errorf("WithEvictionWarning: err = %v", err)
	}
	if rep.EvictionSafe || len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "allkeys-lru") {
		t.Errorf("WithEvictionWarning: report %+v", rep)
	}
	if !strings.Contains(logged.String(), "level=WARN") || !strings.Contains(logged.String(), "allkeys-lru") {
		t.Errorf("WithEvictionWarning: log %q", logged.String())
	}

	srv.Kill()
	_, err = st.Check(ctx)
	checkUnavailable(t, "check", err)
}

// clusterWrapper is an instrumentation wrapper that embeds a ClusterClient.
type clusterWrapper struct{ *goredis.ClusterClient }

func TestCheckCluster(t *testing.T) {
	cl := sharedCluster(t)
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	for _, client := range []goredis.UniversalClient{c, clusterWrapper{c}} {
		t.Run(fmt.Sprintf("%T", client), func(t *testing.T) { checkEveryNode(t, cl, client) })
	}
}

// checkEveryNode checks that Check asked every master of cl, through client.
func checkEveryNode(t *testing.T, cl *redistest.Cluster, client goredis.UniversalClient) {
	rep, err := newStore(t, client).Check(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := make(map[string]bool)
	for _, n := range rep.Nodes {
		got[n.Addr] = n.MaxmemoryPolicy == "noeviction"
	}
	for _, addr := range cl.Addrs() {
		if !got[addr] {
			t.Errorf("node %s not checked or not noeviction: %+v", addr, rep.Nodes)
		}
	}
	if !rep.EvictionSafe || rep.Persistent {
		t.Errorf("report %+v", rep)
	}
}

func TestWaitReplicas(t *testing.T) {
	master := redistest.StartServer(t)
	ctx := context.Background()

	// Without a replica nothing acknowledges: the claim is refused and
	// released.
	c := newClient(t, master.Addr)
	st := newStore(t, c, redis.WithWaitReplicas(1, 50*time.Millisecond))
	key := newKey()
	_, err := st.Claim(ctx, key, newClaim(1))
	t.Logf("WAIT 1 with no replica: %v", err)
	checkUnavailable(t, "claim", err)
	if !errors.Is(err, redis.ErrNotReplicated) {
		t.Errorf("claim err = %v, want ErrNotReplicated", err)
	}
	if n, _ := redistest.Do(master.Addr, "EXISTS", key); n != "0" {
		t.Error("unacknowledged claim was not released")
	}

	replica := redistest.StartReplica(t, master)
	// Wide enough for a loaded machine: WAIT returns as soon as the replica
	// acknowledges.
	st = newStore(t, c, redis.WithWaitReplicas(1, 5*time.Second))
	a := newClaim(1)
	by := commands(t, master.Addr, func() { mustClaim(t, st, key, a, store.Claimed) })
	t.Logf("WAIT 1 with a replica: claim ran %v on the master", by)
	if by["wait"] != 1 || by["set"] != 1 || by["evalsha"]+by["eval"] != 0 {
		t.Errorf("claim in WAIT mode: %v, want one SET and one WAIT", by)
	}
	// The claim is on the replica before Claim returns.
	if got, err := redistest.Do(replica.Addr, "EXISTS", key); err != nil || got != "1" {
		t.Errorf("claim not on the replica: %q, %v", got, err)
	}
	// Other answers need no WAIT.
	by = commands(t, master.Addr, func() { mustClaim(t, st, key, newClaim(2), store.InFlight) })
	if by["set"] != 1 || by["wait"] != 0 {
		t.Errorf("in-flight answer in WAIT mode: %v, want one SET and no WAIT", by)
	}
	mustClaim(t, st, key, a, store.Mine)

	// Two replicas asked for, one there.
	st2 := newStore(t, c, redis.WithWaitReplicas(2, 50*time.Millisecond))
	key2 := newKey()
	if _, err := st2.Claim(ctx, key2, newClaim(1)); !errors.Is(err, redis.ErrNotReplicated) {
		t.Errorf("WAIT 2 with one replica: %v, want ErrNotReplicated", err)
	}
	if n, _ := redistest.Do(master.Addr, "EXISTS", key2); n != "0" {
		t.Error("unacknowledged claim was not released")
	}
}

func TestWaitReplicasCluster(t *testing.T) {
	cl := sharedCluster(t)
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	// The cluster has no replicas, so WAIT (sent to each key's master on the
	// connection that wrote the claim) always falls short.
	st := newStore(t, c, redis.WithWaitReplicas(1, 20*time.Millisecond))
	for range 6 {
		key := newKey()
		_, err := st.Claim(context.Background(), key, newClaim(1))
		if !errors.Is(err, redis.ErrNotReplicated) || !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("claim: %v, want ErrNotReplicated", err)
		}
		if n, _ := redistest.Do(cl.NodeForSlot(redistest.Slot(key)).Addr, "EXISTS", key); n != "0" {
			t.Fatal("unacknowledged claim was not released")
		}
	}
}
