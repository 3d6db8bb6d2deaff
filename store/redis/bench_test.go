package redis_test

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/redistest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// The benchmarks run against a redis-server of their own on loopback, with
// many goroutines (RunParallel) on many keys. Every operation is a real
// round trip, so ns/op is bound by the server and the loopback as much as
// by the store; allocs/op is the store's and go-redis's share.

// benchParallelism times GOMAXPROCS goroutines run each benchmark, each
// with its own connection: the server sees many clients at once.
const benchParallelism = 8

func benchStore(b *testing.B) *redis.Store {
	b.Helper()
	c := goredis.NewClient(&goredis.Options{
		Addr:                  redistest.Start(b),
		ContextTimeoutEnabled: true,
		PoolSize:              128,
	})
	b.Cleanup(func() { c.Close() })
	st, err := redis.New(c)
	if err != nil {
		b.Fatal(err)
	}
	return st
}

func benchRecord() *store.Record {
	body := make([]byte, 1024)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	return &store.Record{
		Status:      201,
		Header:      http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/42"}},
		Body:        body,
		Fingerprint: [32]byte{1},
		CreatedAt:   time.Now(),
		CompletedAt: time.Now(),
	}
}

// BenchmarkFirstRun is the store's part of a first request: a claim on a
// fresh key, then complete with a 1 KiB response.
func BenchmarkFirstRun(b *testing.B) {
	st := benchStore(b)
	rec := benchRecord()
	scope := "bench-" + randomHex(4)
	var n atomic.Int64
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(int64(len(rec.Body)))
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := store.Claim{Token: randomHex(16), Fingerprint: rec.Fingerprint, TTL: 30 * time.Second}
		for pb.Next() {
			key := store.KeyName(scope, strconv.FormatInt(n.Add(1), 10))
			res, err := st.Claim(ctx, key, c)
			if err != nil || res.State != store.Claimed {
				b.Fatalf("claim: %v %v", res.State, err)
			}
			if err := st.Complete(ctx, key, c.Token, rec, time.Minute); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkReplay is the store's part of a repeat: one claim that finds a
// kept 1 KiB response, over 1024 keys.
func BenchmarkReplay(b *testing.B) {
	st := benchStore(b)
	rec := benchRecord()
	ctx := context.Background()
	const keys = 1024
	names := make([]string, keys)
	scope := "bench-" + randomHex(4)
	for i := range names {
		names[i] = store.KeyName(scope, strconv.Itoa(i))
		c := store.Claim{Token: randomHex(16), Fingerprint: rec.Fingerprint, TTL: time.Minute}
		if _, err := st.Claim(ctx, names[i], c); err != nil {
			b.Fatal(err)
		}
		if err := st.Complete(ctx, names[i], c.Token, rec, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	var n atomic.Int64
	b.ReportAllocs()
	b.SetBytes(int64(len(rec.Body)))
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := store.Claim{Token: randomHex(16), Fingerprint: rec.Fingerprint, TTL: time.Minute}
		for pb.Next() {
			res, err := st.Claim(ctx, names[n.Add(1)%keys], c)
			if err != nil || res.State != store.Completed {
				b.Fatalf("claim: %v %v", res.State, err)
			}
		}
	})
}

// BenchmarkInFlight is the store's part of a repeat that finds the first
// request still running: one claim that finds another's claim.
func BenchmarkInFlight(b *testing.B) {
	st := benchStore(b)
	ctx := context.Background()
	const keys = 1024
	names := make([]string, keys)
	scope := "bench-" + randomHex(4)
	for i := range names {
		names[i] = store.KeyName(scope, strconv.Itoa(i))
		if _, err := st.Claim(ctx, names[i], store.Claim{Token: randomHex(16), TTL: time.Hour}); err != nil {
			b.Fatal(err)
		}
	}
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := store.Claim{Token: randomHex(16), TTL: time.Minute}
		for pb.Next() {
			res, err := st.Claim(ctx, names[n.Add(1)%keys], c)
			if err != nil || res.State != store.InFlight {
				b.Fatalf("claim: %v %v", res.State, err)
			}
		}
	})
}
