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
	s, _ = New(c, WithCallTimeout(time.Second), WithWaitReplicas(2, 40*time.Millisecond))
	if s.timeout != time.Second || s.wait != 2 || s.waitTimeout != 40*time.Millisecond {
		t.Errorf("options not applied: %v %d %v", s.timeout, s.wait, s.waitTimeout)
	}
}

func TestContextTimeoutsDetected(t *testing.T) {
	mr := miniredis.RunT(t)
	for _, c := range []struct {
		client goredis.UniversalClient
		want   bool
	}{
		{goredis.NewClient(&goredis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true}), true},
		{goredis.NewClient(&goredis.Options{Addr: mr.Addr()}), false},
		{goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{mr.Addr()}, ContextTimeoutEnabled: true}), true},
		{goredis.NewFailoverClient(&goredis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{mr.Addr()}, ContextTimeoutEnabled: true}), true},
		{goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": mr.Addr()}, ContextTimeoutEnabled: true}), true},
	} {
		defer c.client.Close()
		if got := contextTimeouts(c.client); got != c.want {
			t.Errorf("%T: contextTimeouts = %v, want %v", c.client, got, c.want)
		}
	}
}
