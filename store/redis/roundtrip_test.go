package redis_test

import (
	"context"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/redistest"
	"github.com/idemkey/idemkey/store"
)

// commandCalls returns the server's command counts from INFO commandstats,
// leaving out INFO itself.
func commandCalls(t *testing.T, addr string) map[string]int64 {
	t.Helper()
	f, err := redistest.Info(addr, "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	calls := make(map[string]int64)
	for k, v := range f {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok || name == "info" {
			continue
		}
		for _, field := range strings.Split(v, ",") {
			if n, ok := strings.CutPrefix(field, "calls="); ok {
				calls[name], _ = strconv.ParseInt(n, 10, 64)
			}
		}
	}
	return calls
}

// commands runs f and returns the count, by name, of every command the
// server ran meanwhile: those clients sent and those scripts called.
func commands(t *testing.T, addr string, f func()) map[string]int64 {
	t.Helper()
	before := commandCalls(t, addr)
	f()
	after := commandCalls(t, addr)
	by := make(map[string]int64)
	for name, n := range after {
		if d := n - before[name]; d != 0 {
			by[name] = d
		}
	}
	return by
}

// tally counts command names.
func tally(names ...string) map[string]int64 {
	m := make(map[string]int64)
	for _, n := range names {
		m[n]++
	}
	return m
}

func TestRoundTrips(t *testing.T) {
	addr := redistest.Start(t)
	// One connection, dialled before counting starts, so that no
	// handshake is counted.
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 1, MinIdleConns: 1})
	t.Cleanup(func() { c.Close() })
	st := newStore(t, c)
	ctx := context.Background()
	// New's probe ran the scripts: forget them.
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	// A fresh server has none of the scripts cached: the first run of
	// each is EVALSHA, answered NOSCRIPT, then EVAL.
	k, warm := newKey(), newClaim(1)
	mustClaim(t, st, k, warm, store.Claimed)
	by := commands(t, addr, func() {
		if err := st.Complete(ctx, k, warm.Token, record("warm", 1), time.Minute); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("complete on a server without the script: %v", by)
	if want := tally("evalsha", "eval", "getrange", "set"); !maps.Equal(by, want) {
		t.Errorf("complete on a cold server: %v, want %v (EVALSHA, then EVAL)", by, want)
	}
	// Warm the other scripts.
	k = newKey()
	mustClaim(t, st, k, warm, store.Claimed)
	st.Extend(ctx, k, warm.Token, time.Minute)
	st.Release(ctx, k, warm.Token)

	key, held := newKey(), newKey()
	a, b := newClaim(1), newClaim(2)
	mustClaim(t, st, held, a, store.Claimed)
	// sent is what the store sends, one round trip each; inside is what the
	// scripts call in the server (a keep and a release read whether a
	// waiter marked the claim, and publish the key only then: nobody waits
	// here).
	paths := []struct {
		name         string
		sent, inside []string
		run          func()
	}{
		{"first run (claim, complete)", []string{"set", "evalsha"}, []string{"getrange", "set"}, func() {
			mustClaim(t, st, key, a, store.Claimed)
			if err := st.Complete(ctx, key, a.Token, record("a", 1), time.Minute); err != nil {
				t.Fatal(err)
			}
		}},
		{"replay", []string{"set"}, nil, func() { mustClaim(t, st, key, newClaim(1), store.Completed) }},
		{"reused key, completed", []string{"set"}, nil, func() { mustClaim(t, st, key, b, store.Completed) }},
		{"in flight", []string{"set"}, nil, func() { mustClaim(t, st, held, newClaim(1), store.InFlight) }},
		{"reused key, in flight", []string{"set"}, nil, func() { mustClaim(t, st, held, b, store.InFlight) }},
		{"claim resent (mine)", []string{"set"}, nil, func() { mustClaim(t, st, held, a, store.Mine) }},
		{"extend", []string{"evalsha"}, []string{"getrange", "setrange", "pexpire"}, func() {
			if err := st.Extend(ctx, held, a.Token, time.Minute); err != nil {
				t.Fatal(err)
			}
		}},
		{"handler failed (claim, release)", []string{"set", "evalsha"}, []string{"getrange", "del"}, func() {
			k := newKey()
			mustClaim(t, st, k, a, store.Claimed)
			if err := st.Release(ctx, k, a.Token); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, p := range paths {
		by := commands(t, addr, p.run)
		want := tally(append(append([]string(nil), p.sent...), p.inside...)...)
		t.Logf("%s: %d round trips %v, ran %v", p.name, len(p.sent), p.sent, by)
		if !maps.Equal(by, want) {
			t.Errorf("%s: server ran %v, want %v", p.name, by, want)
		}
	}
}
