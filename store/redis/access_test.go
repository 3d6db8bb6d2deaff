package redis_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/redistest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// storeRules are the ACL rules of a user that may run everything the store
// sends on its keys, and INFO, which Check reads.
var storeRules = []string{
	"+set", "+get", "+pttl", "+eval", "+evalsha",
	"+getrange", "+pexpire", "+setrange", "+del", "+info",
	"~idem:*",
}

func without(rules []string, drop ...string) []string {
	return slices.DeleteFunc(slices.Clone(rules), func(r string) bool { return slices.Contains(drop, r) })
}

// TestNewRefusesUsersThatCannotKeep: New refuses, with ErrPermission
// naming what was refused, every Redis user that may not run each command
// the store sends, on keys named as the store names them; Check refuses
// them too, and a user that may not read INFO. Without the check, a user
// that may SET but not run the scripts claims every key, runs every
// handler and keeps nothing: each retry runs its handler again.
func TestNewRefusesUsersThatCannotKeep(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		rules []string
		opts  []redis.Option
		want  string // in New's error; "" when New must pass
		check string // in Check's error, when New passes; "" when Check must pass
	}{
		{"every command", storeRules, nil, "", ""},
		{"claim but not keep", []string{"+set", "+get", "+pttl", "+info", "~idem:*"}, nil, "EVAL", ""},
		{"no EVAL", without(storeRules, "+eval"), nil, "EVAL", ""},
		{"no EVALSHA", without(storeRules, "+evalsha"), nil, "EVALSHA", ""},
		{"no SET", without(storeRules, "+set"), nil, "SET", ""},
		{"no GET", without(storeRules, "+get"), nil, "GET", ""},
		{"no PTTL", without(storeRules, "+pttl"), nil, "PTTL", ""},
		{"scripts may not GETRANGE", without(storeRules, "+getrange"), nil, "EVAL", ""},
		{"scripts may not PEXPIRE", without(storeRules, "+pexpire"), nil, "extend", ""},
		{"scripts may not SETRANGE", without(storeRules, "+setrange"), nil, "SETRANGE", ""},
		{"scripts may not DEL", without(storeRules, "+del"), nil, "release", ""},
		{"no INFO", without(storeRules, "+info"), nil, "", "INFO"},
		{"keys of another pattern", append(without(storeRules, "~idem:*"), "~other:*"), nil, "EVAL", ""},
		{"read-only keys", append(without(storeRules, "~idem:*"), "%R~idem:*"), nil, "EVAL", ""},
		{"write-only keys", append(without(storeRules, "~idem:*"), "%W~idem:*"), nil, "EVAL", ""},
		{"a prefix the pattern covers", append(without(storeRules, "~idem:*"), "~billing:idem:*"), []redis.Option{redis.WithKeyPrefix("billing:")}, "", ""},
		{"a prefix the pattern does not cover", storeRules, []redis.Option{redis.WithKeyPrefix("billing:")}, "EVAL", ""},
		{"WAIT mode without WAIT", storeRules, []redis.Option{redis.WithWaitReplicas(1, 10*time.Millisecond)}, "WAIT", ""},
		{"WAIT mode with WAIT", append(slices.Clone(storeRules), "+wait"), []redis.Option{redis.WithWaitReplicas(1, 10*time.Millisecond)}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user := strings.NewReplacer(" ", "-").Replace(tc.name)
			args := append([]string{"ACL", "SETUSER", user, "reset", "on", ">pw"}, tc.rules...)
			if _, err := redistest.Do(srv.Addr, args...); err != nil {
				t.Fatal(err)
			}
			c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, Username: user, Password: "pw", ContextTimeoutEnabled: true})
			t.Cleanup(func() { c.Close() })
			st, err := redis.New(c, append([]redis.Option{redis.WithCallTimeout(testBudget)}, tc.opts...)...)
			t.Logf("New: %v", err)
			if tc.want != "" {
				if !errors.Is(err, redis.ErrPermission) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), srv.Addr) {
					t.Fatalf("New: %v, want ErrPermission naming %s and the server", err, tc.want)
				}
				if errors.Is(err, store.ErrUnavailable) {
					t.Errorf("a refusal reported as the server being unavailable: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("New refused a user that may run every command: %v", err)
			}
			_, err = st.Check(ctx)
			t.Logf("Check: %v", err)
			if tc.check != "" {
				if !errors.Is(err, redis.ErrPermission) || !strings.Contains(err.Error(), tc.check) {
					t.Fatalf("Check: %v, want ErrPermission naming %s", err, tc.check)
				}
				return
			}
			if err != nil {
				t.Fatalf("Check refused a user that may run every command: %v", err)
			}
			if tc.opts != nil {
				checkProbeLeftovers(t, srv.Addr, "billing:*", 0)
				return
			}
			// And the store works for that user.
			key := newKey()
			cm := newClaim(1)
			mustClaim(t, st, key, cm, store.Claimed)
			if err := st.Extend(ctx, key, cm.Token, time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := st.Complete(ctx, key, cm.Token, record("ok", 1), time.Minute); err != nil {
				t.Fatal(err)
			}
			mustClaim(t, st, key, newClaim(1), store.Completed)
		})
	}
}

// TestNewProbeTouchesNoRealKey: New's probe writes only a key of its own,
// which it deletes, and leaves the store's keys as they were: a claim in
// flight and a kept record.
func TestNewProbeTouchesNoRealKey(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := context.Background()
	prefix := "real-" + randomHex(4) + ":"
	c := newClient(t, srv.Addr)
	st := newStore(t, c, redis.WithKeyPrefix(prefix))
	claimed, kept := newKey(), newKey()
	mustClaim(t, st, claimed, newClaim(1), store.Claimed)
	cm := newClaim(2)
	mustClaim(t, st, kept, cm, store.Claimed)
	if err := st.Complete(ctx, kept, cm.Token, record("kept", 2), time.Hour); err != nil {
		t.Fatal(err)
	}
	before := make(map[string]string)
	for _, k := range keysOn(t, srv.Addr, prefix+"*") {
		before[k], _ = redistest.Do(srv.Addr, "GET", k)
	}
	if len(before) != 2 {
		t.Fatalf("keys %q, want the test's two", before)
	}
	newStore(t, c, redis.WithKeyPrefix(prefix))
	after := keysOn(t, srv.Addr, prefix+"*")
	if len(after) != 2 {
		t.Fatalf("after New: keys %q, want the test's two", after)
	}
	for _, k := range after {
		if now, _ := redistest.Do(srv.Addr, "GET", k); now != before[k] {
			t.Errorf("New's probe changed %s", k)
		}
	}
}

// checkProbeLeftovers checks that the probes left want keys matching
// pattern, each a record that lapses within a second.
func checkProbeLeftovers(t *testing.T, addr, pattern string, want int) {
	t.Helper()
	keys := keysOn(t, addr, pattern)
	if len(keys) != want {
		t.Fatalf("the probes left %q, want %d keys", keys, want)
	}
	for _, k := range keys {
		v, _ := redistest.Do(addr, "GET", k)
		if st, err := redis.StateOf(v); err != nil || st != store.Completed {
			t.Errorf("the probe left %s holding %q", k, v)
		}
		if ttl, _ := redistest.Do(addr, "PTTL", k); len(ttl) > 4 {
			t.Errorf("%s lives %s ms", k, ttl)
		}
	}
}

// TestCheckAtMaxmemory: a server out of memory (noeviction) refuses the
// probe's writes; Check then says it could not check the permissions and
// does not refuse the server, which still serves replays.
func TestCheckAtMaxmemory(t *testing.T) {
	srv := redistest.StartServer(t)
	c := newClient(t, srv.Addr)
	if err := c.ConfigSet(context.Background(), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	rep, err := newStore(t, c).Check(context.Background())
	if err != nil {
		t.Fatalf("Check at maxmemory: %v", err)
	}
	if !slices.ContainsFunc(rep.Warnings, func(w string) bool { return strings.Contains(w, "out of memory") }) {
		t.Errorf("warnings %q do not say the permissions went unchecked", rep.Warnings)
	}
}

// TestCheckProbesEveryMaster: in a cluster, ACLs are set node by node, so
// New and Check probe each master, with a key in one of its slots: a user
// that may not run EVALSHA on one master is refused, with that master
// named, whichever it is.
func TestCheckProbesEveryMaster(t *testing.T) {
	cl := sharedCluster(t)
	ctx := context.Background()
	for i, bad := range cl.Addrs() {
		user := fmt.Sprintf("cluster-%d-%s", i, randomHex(4))
		for _, addr := range cl.Addrs() {
			rules := append(slices.Clone(storeRules), "+cluster", "+ping")
			if addr == bad {
				rules = without(rules, "+evalsha")
			}
			if _, err := redistest.Do(addr, append([]string{"ACL", "SETUSER", user, "reset", "on", ">pw"}, rules...)...); err != nil {
				t.Fatal(err)
			}
		}
		c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs(), Username: user, Password: "pw", ContextTimeoutEnabled: true})
		_, err := redis.New(c, redis.WithCallTimeout(testBudget))
		c.Close()
		if !errors.Is(err, redis.ErrPermission) || !strings.Contains(err.Error(), "EVALSHA") || !strings.Contains(err.Error(), bad) {
			t.Errorf("EVALSHA refused on %s: New: %v, want ErrPermission naming EVALSHA and the master", bad, err)
		}
	}

	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	prefix := "probe-" + randomHex(4) + ":"
	st := newStore(t, c, redis.WithKeyPrefix(prefix))
	if _, err := st.Check(ctx); err != nil {
		t.Fatal(err)
	}
	for _, addr := range cl.Addrs() {
		if keys := keysOn(t, addr, prefix+"*"); len(keys) != 0 {
			t.Errorf("master %s holds probe keys %q after New and Check, want none", addr, keys)
		}
	}
}

// TestNewRefusesThroughSentinel: through a FailoverClient, New probes the
// master the sentinels name, and refuses a user there that may SET but
// not EVALSHA, as it does on a standalone server.
func TestNewRefusesThroughSentinel(t *testing.T) {
	ss := redistest.StartSentinel(t, redistest.SentinelConfig{})
	for _, tc := range []struct {
		user  string
		rules []string
		want  string
	}{
		{"sentinel-no-evalsha", without(storeRules, "+evalsha"), "EVALSHA"},
		{"sentinel-every-command", storeRules, ""},
	} {
		// Set on the replica too: a failover must not change the answer.
		for _, srv := range []*redistest.Server{ss.Master, ss.Replica} {
			if _, err := redistest.Do(srv.Addr, append([]string{"ACL", "SETUSER", tc.user, "reset", "on", ">pw"}, tc.rules...)...); err != nil {
				t.Fatal(err)
			}
		}
		c := goredis.NewFailoverClient(&goredis.FailoverOptions{
			MasterName:            ss.MasterName,
			SentinelAddrs:         ss.SentinelAddrs(),
			Username:              tc.user,
			Password:              "pw",
			ContextTimeoutEnabled: true,
		})
		_, err := redis.New(c, redis.WithCallTimeout(testBudget))
		c.Close()
		t.Logf("%s: New: %v", tc.user, err)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: New refused a user that may run every command: %v", tc.user, err)
		case tc.want != "" && (!errors.Is(err, redis.ErrPermission) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: New: %v, want ErrPermission naming %s", tc.user, err, tc.want)
		}
	}
}
