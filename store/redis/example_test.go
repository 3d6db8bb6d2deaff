package redis_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// A store on a standalone server. An in-process miniredis stands in for
// Redis here, so the example runs anywhere.
func ExampleNew() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()

	rdb := goredis.NewClient(&goredis.Options{
		Addr:                  mr.Addr(),
		ContextTimeoutEnabled: true, // let each call's time budget reach the socket
		PoolSize:              128,  // about the number of requests served at once
	})
	defer rdb.Close()
	st, err := redis.New(rdb, redis.WithCallTimeout(250*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}

	ctx := context.Background()
	key := store.KeyName("user-42", "order-7f3a")
	first := store.Claim{Token: "token-a", Fingerprint: [32]byte{1}, TTL: 35 * time.Second}
	res, err := st.Claim(ctx, key, first)
	fmt.Println(res.State, err)

	// A second request with the same key while the first runs.
	res, _ = st.Claim(ctx, key, store.Claim{Token: "token-b", Fingerprint: [32]byte{1}, TTL: 35 * time.Second})
	fmt.Println(res.State, res.TTL.Round(time.Second))

	// The first request keeps its response; repeats replay it.
	rec := &store.Record{Status: 201, Body: []byte(`{"id":7}`), Fingerprint: [32]byte{1}}
	if err := st.Complete(ctx, key, first.Token, rec, 24*time.Hour); err != nil {
		log.Fatal(err)
	}
	res, _ = st.Claim(ctx, key, store.Claim{Token: "token-c", Fingerprint: [32]byte{1}, TTL: 35 * time.Second})
	fmt.Println(res.State, res.Record.Status, string(res.Record.Body))

	// The store going away is ErrUnavailable: the middleware answers 503.
	mr.Close()
	_, err = st.Claim(ctx, store.KeyName("user-42", "order-8"), first)
	fmt.Println(errors.Is(err, store.ErrUnavailable))
	// Output:
	// claimed <nil>
	// in flight 35s
	// completed 201 {"id":7}
	// true
}

// A store behind Sentinel: the client asks the sentinels for the master and
// follows it through a failover. WithWaitReplicas keeps a failover from
// forgetting a claim whose handler runs.
func ExampleNew_sentinel() {
	rdb := goredis.NewFailoverClient(&goredis.FailoverOptions{
		MasterName:            "mymaster",
		SentinelAddrs:         []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"},
		ContextTimeoutEnabled: true,
		PoolSize:              128,
	})
	defer rdb.Close()
	st, err := redis.New(rdb, redis.WithWaitReplicas(1, 50*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	_ = st
}

// A store on Redis Cluster: every key's script runs on the master of its
// slot. Check asks every node.
func ExampleNew_cluster() {
	rdb := goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs:                 []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"},
		ContextTimeoutEnabled: true,
		PoolSize:              128,
	})
	defer rdb.Close()
	st, err := redis.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	rep, err := st.Check(context.Background())
	if err != nil {
		log.Fatal(err) // a node may evict claims, or cannot be asked
	}
	for _, w := range rep.Warnings {
		log.Print(w) // for example: persistence is off
	}
}
