package memory

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

var benchHeader = http.Header{"Content-Type": {"application/json"}}

// benchRing is how many keys each goroutine of a claim-and-complete
// benchmark cycles through. Their records are kept for benchLapse, far less
// than one lap takes, so each claim finds the key's previous record lapsed
// and takes its place: the store stays the same size however long the
// benchmark runs, as a busy service's does in its steady state.
const (
	benchRing  = 4096
	benchLapse = time.Microsecond
)

// benchKeys returns a ring of key names for each goroutine RunParallel
// starts, made with store.KeyName as the middleware makes them.
func benchKeys(prefix string) [][]string {
	rings := make([][]string, runtime.GOMAXPROCS(0))
	for w := range rings {
		rings[w] = make([]string, benchRing)
		for i := range rings[w] {
			rings[w][i] = store.KeyName(prefix, fmt.Sprint(w, "-", i))
		}
	}
	return rings
}

// claimComplete is one first run on key: a claim, then keeping rec. A claim
// that finds the key's last record not yet lapsed (a slow clock) skips the
// keep.
func claimComplete(b *testing.B, s *Store, key string, c store.Claim, rec *store.Record) {
	res, err := s.Claim(context.Background(), key, c)
	if err != nil {
		b.Fatalf("Claim: %v", err)
	}
	switch res.State {
	case store.Completed:
		return
	case store.Claimed:
	default:
		b.Fatalf("Claim: state %v", res.State)
	}
	if err := s.Complete(context.Background(), key, c.Token, rec, benchLapse); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkClaimComplete is the first run of a request: a claim on a key
// whose last record has lapsed, then keeping its response. Each op makes
// the record, as the middleware would.
func BenchmarkClaimComplete(b *testing.B) {
	s := mustNew(b)
	rings := benchKeys("bench")
	body := []byte(`{"id":"ord_123","status":"created"}`)
	var worker atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		keys := rings[worker.Add(1)-1]
		c := store.Claim{Token: "token", TTL: 30 * time.Second}
		for i := 0; pb.Next(); i++ {
			rec := &store.Record{Status: http.StatusCreated, Header: benchHeader, Body: body}
			claimComplete(b, s, keys[i%benchRing], c, rec)
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

// liveHeld is how many records BenchmarkLiveRecords keeps alive.
const liveHeld = 100_000

// liveGarbage is what each op of BenchmarkLiveRecords allocates and drops,
// standing in for the rest of a request's garbage (net/http, the
// middleware, the handler): it is what makes the collector run, and each
// run marks everything the store holds.
const liveGarbage = 8 << 10

var liveNote = strings.Repeat("x", 200)

// liveRecord returns a record the size of a typical JSON API answer: three
// headers and a body of about 300 bytes.
func liveRecord(i int) *store.Record {
	id := fmt.Sprintf("ord_%08d", i)
	return &store.Record{
		Status: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/orders/" + id},
			"Etag":         {`"` + id + `"`},
		},
		Body:        []byte(`{"id":"` + id + `","status":"created","amount":1250,"currency":"eur","note":"` + liveNote + `"}`),
		Fingerprint: [32]byte{byte(i), byte(i >> 8), byte(i >> 16)},
		CreatedAt:   time.Now(),
		CompletedAt: time.Now(),
	}
}

// BenchmarkLiveRecords is first runs on a store that holds 100,000 live
// records, so that the garbage collector's marking of what the store holds
// shows in the time per op. It reports the heap the held records take, per
// record, as heap-B/record.
func BenchmarkLiveRecords(b *testing.B) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	// Not mustNew: its cleanup would keep the store, and its records, alive
	// through the runs that follow.
	s, err := New(WithMaxRecords(2 * liveHeld))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for i := range liveHeld {
		key := store.KeyName("held", fmt.Sprint(i))
		if _, err := s.Claim(ctx, key, store.Claim{Token: "held-token-0123456789abcdef", TTL: time.Minute}); err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, key, "held-token-0123456789abcdef", liveRecord(i), 24*time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perRecord := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / liveHeld

	rings := benchKeys("churn")
	var worker atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		keys := rings[worker.Add(1)-1]
		var keep atomic.Pointer[[]byte]
		for i := 0; pb.Next(); i++ {
			garbage := make([]byte, liveGarbage)
			keep.Store(&garbage)
			c := store.Claim{Token: "churn-token-0123456789abcd", TTL: 30 * time.Second}
			claimComplete(b, s, keys[i%benchRing], c, liveRecord(i))
		}
	})
	b.StopTimer()
	b.ReportMetric(perRecord, "heap-B/record")
}

// BenchmarkWaitWake measures how long a repeat waiting on a claim (Wait)
// takes to be woken once the owner's Complete returns.
func BenchmarkWaitWake(b *testing.B) {
	s := mustNew(b)
	ctx := context.Background()
	fp := [32]byte{9}
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		key := fmt.Sprint("wake-", i)
		if _, err := s.Claim(ctx, key, store.Claim{Token: "owner", Fingerprint: fp, TTL: time.Minute}); err != nil {
			b.Fatal(err)
		}
		woke := make(chan time.Time, 1)
		ready := make(chan struct{})
		go func() {
			close(ready)
			s.Wait(ctx, key, store.Claim{Token: "repeat", Fingerprint: fp, TTL: time.Minute})
			woke <- time.Now()
		}()
		<-ready
		for s.waiting(key) == 0 {
			runtime.Gosched()
		}
		if err := s.Complete(ctx, key, "owner", &store.Record{Status: 201, Fingerprint: fp}, time.Hour); err != nil {
			b.Fatal(err)
		}
		done := time.Now()
		total += (<-woke).Sub(done)
		// Free the entry, so that the store's bound on entries is never
		// what ends the benchmark.
		if e, ok, err := s.Inspect(ctx, key); err != nil || !ok {
			b.Fatal(ok, err)
		} else if deleted, err := s.Delete(ctx, key, e); err != nil || !deleted {
			b.Fatal(deleted, err)
		}
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns-to-wake")
}
