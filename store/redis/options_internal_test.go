package redis

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"
)

func TestDefaults(t *testing.T) {
	mr := miniredis.RunT(t)
	c := goredis.NewClient(&goredis.Options{Addr: mr.Addr()})
	defer c.Close()
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	if s.timeout != DefaultCallTimeout || DefaultCallTimeout != 300*time.Millisecond {
		t.Errorf("call timeout = %v, want the 300ms default", s.timeout)
	}
	if s.wait != 0 || s.evictWarn {
		t.Errorf("WAIT mode or eviction warning on by default: %d %v", s.wait, s.evictWarn)
	}
	if s.ctxTimeouts {
		t.Error("client without ContextTimeoutEnabled taken as honouring deadlines")
	}
	if s.prefix != "" || s.name("idem:v1:{x}") != "idem:v1:{x}" {
		t.Errorf("key prefix %q by default, want none", s.prefix)
	}
	s, _ = New(c, WithCallTimeout(time.Second), WithWaitReplicas(2, 40*time.Millisecond))
	if s.timeout != time.Second || s.wait != 2 || s.waitTimeout != 40*time.Millisecond {
		t.Errorf("options not applied: %v %d %v", s.timeout, s.wait, s.waitTimeout)
	}
}

// embedded is an instrumentation wrapper that embeds the go-redis client:
// its Options and Conn methods are the client's.
type embedded struct{ *goredis.Client }

// delegating is a wrapper that keeps the client behind the UniversalClient
// interface: New cannot ask it about deadlines.
type delegating struct{ goredis.UniversalClient }

func TestContextTimeoutsDetected(t *testing.T) {
	mr := miniredis.RunT(t)
	on := goredis.NewClient(&goredis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer on.Close()
	off := goredis.NewClient(&goredis.Options{Addr: mr.Addr()})
	defer off.Close()
	for _, c := range []struct {
		name   string
		client goredis.UniversalClient
		opts   []Option
		want   bool
	}{
		{"Client", on, nil, true},
		{"Client without", off, nil, false},
		{"ClusterClient", goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{mr.Addr()}, ContextTimeoutEnabled: true}), nil, true},
		{"FailoverClient", goredis.NewFailoverClient(&goredis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{mr.Addr()}, ContextTimeoutEnabled: true}), nil, true},
		{"Ring", goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": mr.Addr()}, ContextTimeoutEnabled: true}), nil, true},
		{"embedding wrapper", embedded{on}, nil, true},
		{"embedding wrapper without", embedded{off}, nil, false},
		{"delegating wrapper", delegating{on}, nil, false},
		{"delegating wrapper, told", delegating{on}, []Option{WithContextTimeouts(true)}, true},
		{"Client, told not to trust it", on, []Option{WithContextTimeouts(false)}, false},
		{"Client without, last option wins", off, []Option{WithContextTimeouts(false), WithContextTimeouts(true)}, true},
	} {
		s, err := build(c.client, c.opts) // what New decides before it asks the server
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if s.ctxTimeouts != c.want {
			t.Errorf("%s (%T): context timeouts %v, want %v", c.name, c.client, s.ctxTimeouts, c.want)
		}
	}
}

// TestWaitReplicasPins checks which clients the WAIT mode accepts: those
// that can pin a connection to a key's master, wrappers included.
func TestWaitReplicasPins(t *testing.T) {
	mr := miniredis.RunT(t)
	c := goredis.NewClient(&goredis.Options{Addr: mr.Addr()})
	defer c.Close()
	cl := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{mr.Addr()}})
	defer cl.Close()
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": mr.Addr()}})
	defer ring.Close()
	wait := WithWaitReplicas(1, time.Second)
	for _, ok := range []goredis.UniversalClient{c, cl, embedded{c}} {
		if _, err := build(ok, []Option{wait}); err != nil {
			t.Errorf("%T refused for WAIT: %v", ok, err)
		}
	}
	for _, bad := range []goredis.UniversalClient{ring, delegating{c}} {
		if _, err := build(bad, []Option{wait}); err == nil {
			t.Errorf("%T accepted for WAIT, which it cannot pin a connection for", bad)
		}
	}
}
