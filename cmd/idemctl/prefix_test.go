package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/redistest"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// TestRedisPrefix: a service whose store has WithKeyPrefix keeps its keys
// under the prefix; idemctl given the same --redis-prefix shows, counts and
// deletes them, and without it finds nothing.
func TestRedisPrefix(t *testing.T) {
	addr := redistest.Start(t)
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	url := "redis://" + addr + "/0"
	ctl := func(stdin string, args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append([]string{"--redis", url}, args...), strings.NewReader(stdin), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	// Two services on one database: billing with a prefix, another without.
	for _, opts := range [][]redis.Option{{redis.WithKeyPrefix("billing:")}, nil} {
		st, err := redis.New(rdb, opts...)
		if err != nil {
			t.Fatal(err)
		}
		idem, err := middleware.New(st)
		if err != nil {
			t.Fatal(err)
		}
		h := idem.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
		}))
		for _, k := range []string{"k1", "k2"} {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, paymentRequest("alice", k))
			if w.Code != http.StatusCreated {
				t.Fatalf("payment %s: %d", k, w.Code)
			}
		}
		if len(opts) == 0 {
			// The unprefixed service keeps only k1.
			rdb.Del(context.Background(), store.KeyName("alice", "k2"))
		}
	}
	name := "billing:" + store.KeyName("alice", "k1")

	code, out, errOut := ctl("", "--redis-prefix", "billing:", "--json", "show", "--scope", "alice", "--key", "k1")
	if code != 0 {
		t.Fatalf("show with the prefix: exit %d: %s", code, errOut)
	}
	e := decodeEntry(t, out)
	if !e.Found || e.State != "completed" || e.Key != name || e.Digest != store.DigestOf(store.KeyName("alice", "k1")) {
		t.Errorf("show with the prefix: %+v", e)
	}
	code, out, errOut = ctl("", "--redis-prefix", "billing:", "--json", "show", "--digest", e.Digest)
	if e := decodeEntry(t, out); code != 0 || e.Key != name {
		t.Errorf("show --digest with the prefix: exit %d %+v %s", code, e, errOut)
	}
	// Another prefix finds nothing.
	code, out, _ = ctl("", "--redis-prefix", "shipping:", "--json", "show", "--scope", "alice", "--key", "k1")
	if e := decodeEntry(t, out); code != 1 || e.Found {
		t.Errorf("show with another prefix: exit %d %+v", code, e)
	}

	// Without the prefix, show finds k2 (which only billing keeps) under it
	// and says which --redis-prefix names it, rather than only "not found".
	name2 := "billing:" + store.KeyName("alice", "k2")
	code, out, _ = ctl("", "--json", "show", "--scope", "alice", "--key", "k2")
	if e := decodeEntry(t, out); code != 1 || e.Found || len(e.Elsewhere) != 1 || e.Elsewhere[0] != name2 {
		t.Errorf("show without the prefix: exit %d %+v, want not found, and found under %s", code, e, name2)
	}
	code, out, _ = ctl("", "show", "--scope", "alice", "--key", "k2")
	if code != 1 || !strings.Contains(out, `--redis-prefix "billing:"`) || !strings.Contains(out, name2) {
		t.Errorf("show without the prefix, text: exit %d:\n%s\nwant the key under billing: and the flag that names it", code, out)
	}
	// A key nobody holds is only not found.
	code, out, _ = ctl("", "--json", "show", "--scope", "alice", "--key", "k3")
	if e := decodeEntry(t, out); code != 1 || e.Found || len(e.Elsewhere) != 0 {
		t.Errorf("show of an unknown key: exit %d %+v", code, e)
	}

	// stats counts the prefix's keys only; without it, the unprefixed ones.
	for prefix, want := range map[string]int64{"billing:": 2, "": 1} {
		code, out, errOut = ctl("", "--redis-prefix", prefix, "--json", "stats")
		var sum summary
		if err := json.Unmarshal([]byte(out), &sum); code != 0 || err != nil {
			t.Fatalf("stats %q: exit %d %v: %s", prefix, code, err, errOut)
		}
		if sum.Keys != want || sum.Records != want {
			t.Errorf("stats with prefix %q: %d keys, %d records; want %d", prefix, sum.Keys, sum.Records, want)
		}
	}

	// delete removes the prefixed key, not the unprefixed one of the
	// same name.
	if code, _, errOut = ctl("", "--redis-prefix", "billing:", "delete", "--scope", "alice", "--key", "k1", "--yes"); code != 0 {
		t.Fatalf("delete: exit %d: %s", code, errOut)
	}
	if n := rdb.Exists(context.Background(), name, store.KeyName("alice", "k1")).Val(); n != 1 {
		t.Errorf("%d of the prefixed and unprefixed keys left, want the unprefixed one", n)
	}
	if rdb.Exists(context.Background(), name).Val() != 0 {
		t.Error("the prefixed key is still there")
	}

	// A prefix the store would refuse is a usage error.
	for _, bad := range []string{"{billing}:", "bill*"} {
		if code, _, errOut = ctl("", "--redis-prefix", bad, "stats"); code != exitUsage || !strings.Contains(errOut, "--redis-prefix") {
			t.Errorf("--redis-prefix %q: exit %d: %s", bad, code, errOut)
		}
	}
}
