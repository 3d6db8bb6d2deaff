package redis_test

import (
	"context"
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

// scriptCalls are the commands the store's scripts call inside Redis, and
// which the store never sends itself. INFO commandstats counts them too.
var scriptCalls = map[string]bool{"get": true, "set": true, "pttl": true, "getrange": true, "del": true, "pexpire": true}

// roundTrips runs f and returns how many commands the server received from
// clients meanwhile (commands called by scripts left out), and the count of
// every command by name, scripts' included.
func roundTrips(t *testing.T, addr string, f func()) (total int64, by map[string]int64) {
	t.Helper()
	before := commandCalls(t, addr)
	f()
	after := commandCalls(t, addr)
	by = make(map[string]int64)
	for name, n := range after {
		if d := n - before[name]; d != 0 {
			by[name] = d
			if !scriptCalls[name] {
				total += d
			}
		}
	}
	return total, by
}

func TestRoundTrips(t *testing.T) {
	addr := redistest.Start(t)
	// One connection, dialled before counting starts, so that no
	// handshake is counted.
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 1, MinIdleConns: 1})
	t.Cleanup(func() { c.Close() })
	st := newStore(t, c)
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	// A fresh server has none of the scripts cached: the first run of
	// each is EVALSHA, answered NOSCRIPT, then EVAL.
	warm := newClaim(1)
	n, by := roundTrips(t, addr, func() { mustClaim(t, st, newKey(), warm, store.Claimed) })
	t.Logf("claim on a server without the script: %d commands %v", n, by)
	if n != 2 || by["evalsha"] != 1 || by["eval"] != 1 {
		t.Errorf("claim on a cold server: %d commands %v, want EVALSHA then EVAL", n, by)
	}
	// Warm the other scripts.
	k := newKey()
	mustClaim(t, st, k, warm, store.Claimed)
	st.Extend(ctx, k, warm.Token, time.Minute)
	st.Release(ctx, k, warm.Token)
	mustClaim(t, st, k, warm, store.Claimed)
	st.Complete(ctx, k, warm.Token, record("warm", 1), time.Minute)

	key, held := newKey(), newKey()
	a, b := newClaim(1), newClaim(2)
	mustClaim(t, st, held, a, store.Claimed)
	paths := []struct {
		name string
		want int64
		run  func()
	}{
		{"first run (claim, complete)", 2, func() {
			mustClaim(t, st, key, a, store.Claimed)
			if err := st.Complete(ctx, key, a.Token, record("a", 1), time.Minute); err != nil {
				t.Fatal(err)
			}
		}},
		{"replay", 1, func() { mustClaim(t, st, key, newClaim(1), store.Completed) }},
		{"reused key, completed", 1, func() { mustClaim(t, st, key, b, store.Completed) }},
		{"in flight", 1, func() { mustClaim(t, st, held, newClaim(1), store.InFlight) }},
		{"reused key, in flight", 1, func() { mustClaim(t, st, held, b, store.InFlight) }},
		{"handler failed (claim, release)", 2, func() {
			k := newKey()
			mustClaim(t, st, k, a, store.Claimed)
			if err := st.Release(ctx, k, a.Token); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, p := range paths {
		n, by := roundTrips(t, addr, p.run)
		t.Logf("%s: %d round trips %v", p.name, n, by)
		if n != p.want || by["evalsha"] != p.want {
			t.Errorf("%s: %d round trips %v, want %d EVALSHA", p.name, n, by, p.want)
		}
	}
}
