package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/redistest"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/scope"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// BenchmarkRecordMemory keeps b.N responses through the real middleware on
// a redis-server of its own and reports what each kept record costs the
// server: the mean MEMORY USAGE of the keys (what idemctl stats reports),
// and the growth of INFO used_memory divided by the records (which adds the
// keyspace's and the expiry table's entries). Each response is a 201 with
// Content-Type and Location headers and a JSON body of the given size; the
// claim case holds b.N claims of requests in flight instead. Run it with a
// fixed count, so that every case holds as many keys:
//
//	go test -run '^$' -bench RecordMemory -benchtime 5000x ./cmd/idemctl
func BenchmarkRecordMemory(b *testing.B) {
	b.Run("claim", func(b *testing.B) {
		addr := redistest.Start(b)
		rdb := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
		defer rdb.Close()
		st, err := redis.New(rdb)
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		before := usedMemory(b, rdb)
		i := 0
		for b.Loop() {
			key := store.KeyName("user_2x7Qk9", "0b6f1c9e-4d2a-4f53-9c1e-"+fmt.Sprintf("%012d", i))
			// The middleware's claim: a rand.Text token, the default
			// deadline plus the margin.
			c := store.Claim{Token: rand.Text(), Fingerprint: [32]byte{1}, TTL: 30*time.Second + middleware.ClaimMargin}
			if _, err := st.Claim(ctx, key, c); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.StopTimer()
		report(b, rdb, before, i, func(s summary) int64 { return s.InFlight })
	})
	for _, size := range []int{200, 1024} {
		b.Run(fmt.Sprintf("body=%d", size), func(b *testing.B) {
			addr := redistest.Start(b)
			rdb := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
			defer rdb.Close()
			st, err := redis.New(rdb)
			if err != nil {
				b.Fatal(err)
			}
			idem, err := middleware.New(st)
			if err != nil {
				b.Fatal(err)
			}
			body := jsonBody(size)
			h := idem.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Location", "/payments/pay_"+r.Header.Get("Idempotency-Key"))
				w.WriteHeader(http.StatusCreated)
				w.Write(body)
			}))
			before := usedMemory(b, rdb)

			b.ReportAllocs()
			i := 0
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":10,"currency":"EUR"}`))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Idempotency-Key", "0b6f1c9e-4d2a-4f53-9c1e-"+fmt.Sprintf("%012d", i))
				r = r.WithContext(scope.NewContext(r.Context(), "user_2x7Qk9"))
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != http.StatusCreated {
					b.Fatalf("status %d", w.Code)
				}
				i++
			}
			b.StopTimer()

			report(b, rdb, before, i, func(s summary) int64 { return s.Records })
		})
	}
}

// report measures the n keys made since used_memory was before, checks
// that count finds them all in the scan, and reports the bytes per key.
func report(b *testing.B, rdb *goredis.Client, before int64, n int, count func(summary) int64) {
	b.Helper()
	after := usedMemory(b, rdb)
	st, err := redis.New(rdb, redis.WithScan(1000, int64(n)))
	if err != nil {
		b.Fatal(err)
	}
	stats, err := st.Stats(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	s := redisSummary(stats, stats.Detail.(*redis.Memory))
	if count(s) != int64(n) || s.Sampled != int64(n) {
		b.Fatalf("%+v: want %d keys of the kind, all measured", s, n)
	}
	b.ReportMetric(float64(s.SampledBytes)/float64(n), "memory-usage-B/key")
	b.ReportMetric(float64(after-before)/float64(n), "used-memory-B/key")
}

// jsonBody returns a JSON object of exactly n bytes (n at least 64).
func jsonBody(n int) []byte {
	head := `{"id":"pay_3Jd8f2Lk","amount":1000,"currency":"EUR","status":"succeeded","note":"`
	tail := `"}`
	return []byte(head + strings.Repeat("x", n-len(head)-len(tail)) + tail)
}

func usedMemory(b *testing.B, rdb *goredis.Client) int64 {
	b.Helper()
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("no used_memory in INFO memory")
	return 0
}
