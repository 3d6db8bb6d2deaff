package memory

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

var benchHeader = http.Header{"Content-Type": {"application/json"}}

// BenchmarkClaimComplete is the first run of a request: a claim on a new
// key, then keeping its response. Each op makes two allocations of its own,
// as the middleware would: the key and the record. Once the store reaches
// its bound (DefaultMaxRecords), each new claim also evicts the oldest
// record, as in a busy service.
func BenchmarkClaimComplete(b *testing.B) {
	s := mustNew(b)
	ctx := context.Background()
	body := []byte(`{"id":"ord_123","status":"created"}`)
	var worker atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		buf := fmt.Appendf(nil, "idem:v1:{w%d-", worker.Add(1))
		prefix := len(buf)
		c := store.Claim{Token: "token", TTL: 30 * time.Second}
		for i := 0; pb.Next(); i++ {
			key := string(strconv.AppendInt(buf[:prefix], int64(i), 10))
			res, err := s.Claim(ctx, key, c)
			if err != nil || res.State != store.Claimed {
				b.Fatalf("Claim: %v %v", res.State, err)
			}
			rec := &store.Record{Status: http.StatusCreated, Header: benchHeader, Body: body}
			if err := s.Complete(ctx, key, c.Token, rec, 24*time.Hour); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkClaimRelease is a request whose handler failed: a claim, then
// its release, each goroutine on its own key.
func BenchmarkClaimRelease(b *testing.B) {
	s := mustNew(b)
	ctx := context.Background()
	var worker atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		key := store.KeyName("bench", fmt.Sprint(worker.Add(1)))
		c := store.Claim{Token: "token", TTL: 30 * time.Second}
		for pb.Next() {
			res, err := s.Claim(ctx, key, c)
			if err != nil || res.State != store.Claimed {
				b.Fatalf("Claim: %v %v", res.State, err)
			}
			if err := s.Release(ctx, key, c.Token); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkClaimCompleted is a replay: a claim that finds a kept record.
// "one-key" has every goroutine on one key (one shard's lock); "many-keys"
// spreads them over 4096 keys.
func BenchmarkClaimCompleted(b *testing.B) {
	for _, n := range []int{1, 4096} {
		name := "many-keys"
		if n == 1 {
			name = "one-key"
		}
		b.Run(name, func(b *testing.B) {
			s := mustNew(b)
			ctx := context.Background()
			keys := make([]string, n)
			for i := range keys {
				keys[i] = store.KeyName("bench", fmt.Sprint(i))
				if _, err := s.Claim(ctx, keys[i], store.Claim{Token: "t", TTL: time.Minute}); err != nil {
					b.Fatal(err)
				}
				rec := &store.Record{Status: http.StatusCreated, Header: benchHeader, Body: []byte(`{"id":1}`)}
				if err := s.Complete(ctx, keys[i], "t", rec, time.Hour); err != nil {
					b.Fatal(err)
				}
			}
			var worker atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(worker.Add(1)) * 7919
				c := store.Claim{Token: "other", TTL: time.Minute}
				for pb.Next() {
					res, err := s.Claim(ctx, keys[i%n], c)
					if err != nil || res.State != store.Completed {
						b.Fatalf("Claim: %v %v", res.State, err)
					}
					i++
				}
			})
		})
	}
}
