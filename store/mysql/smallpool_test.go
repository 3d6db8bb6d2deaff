package mysql_test

import (
	"crypto/rand"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store/mysql"
)

// TestPoolOfTwo: a store on the smallest pool it takes (SetMaxOpenConns(2):
// one refuses at New), a call budget of 300 ms, and two requests whose
// handlers hold both connections. Concurrent requests with their keys and
// with other keys are answered 503 within the budget and a wide margin,
// none runs; once the owners are done, their keys replay, the other keys
// each run once, and one key sent sixteen times at once runs once.
func TestPoolOfTwo(t *testing.T) {
	if _, err := mysql.New(t.Context(), openDB(t, sharedURL(), 1)); err == nil {
		t.Fatal("New took a pool of one connection")
	}
	const budget = 300 * time.Millisecond
	db := openDB(t, sharedURL(), 2)
	st, _ := newStore(t, db, mysql.WithCallTimeout(budget))
	h := &payHandler{pay: newPayments(t, sharedDB(t)), inserted: make(chan int64, 2), block: make(chan struct{})}
	srv := server(t, st, h, 10*time.Second)
	var unblock sync.Once
	release := func() { unblock.Do(func() { close(h.block) }) }
	t.Cleanup(release)

	keys := []string{rand.Text(), rand.Text()}
	owners := make(chan answer, 2)
	for _, k := range keys {
		go func() { owners <- post(srv.URL, k, payBody, "X-Block", "1") }()
		<-h.inserted
	}
	const n = 8
	others := make([]string, n)
	answers := make([]answer, 2*n)
	took := make([]time.Duration, 2*n)
	var wg sync.WaitGroup
	for i := range 2 * n {
		k := keys[i%2]
		if i >= n {
			k = rand.Text()
			others[i-n] = k
		}
		wg.Go(func() {
			start := time.Now()
			answers[i] = post(srv.URL, k, payBody)
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	for i, a := range answers {
		if a.status != http.StatusServiceUnavailable {
			t.Fatalf("request %d while both connections are held: %d replayed=%v %s, want 503", i, a.status, a.replayed, a.body)
		}
		if took[i] > budget+2*time.Second {
			t.Errorf("request %d answered 503 after %v, budget %v", i, took[i], budget)
		}
	}
	if r := h.runs.Load(); r != 2 {
		t.Fatalf("%d runs while the connections were held, want 2", r)
	}
	h.inserted = nil
	release()
	for range keys {
		if a := <-owners; a.status != 201 || a.replayed {
			t.Fatalf("an owner: %d %s", a.status, a.body)
		}
	}
	for _, k := range keys {
		if a := post(srv.URL, k, payBody); a.status != 201 || !a.replayed {
			t.Fatalf("an owner's key after: %d replayed=%v %s", a.status, a.replayed, a.body)
		}
	}
	var mu sync.Mutex
	spread := map[int]int{}
	for _, k := range others {
		wg.Go(func() {
			a := post(srv.URL, k, payBody)
			mu.Lock()
			spread[a.status]++
			mu.Unlock()
		})
	}
	wg.Wait()
	burst, runs := rand.Text(), h.runs.Load()
	count := map[int]int{}
	for range 16 {
		wg.Go(func() {
			a := post(srv.URL, burst, payBody)
			mu.Lock()
			count[a.status]++
			mu.Unlock()
		})
	}
	wg.Wait()
	for _, k := range append(others, burst) {
		if a := post(srv.URL, k, payBody); a.status != 201 {
			t.Fatalf("a key after: %d %s", a.status, a.body)
		}
		if a := post(srv.URL, k, payBody); a.status != 201 || !a.replayed {
			t.Fatalf("a key's repeat: %d replayed=%v", a.status, a.replayed)
		}
	}
	if r := h.runs.Load() - runs; r != 1 {
		t.Fatalf("one key sixteen times at once: %v; %d runs, want 1", count, r)
	}
	for _, k := range append(append(others, burst), keys...) {
		if c := h.pay.count(t, k); c != 1 {
			t.Fatalf("%d payments for a key, want 1", c)
		}
	}
	t.Logf("held: %d requests answered 503, slowest after %v; then the other keys at once: %v; one key sixteen times: %v; runs %d for %d keys",
		2*n, slices.Max(took), spread, count, h.runs.Load(), n+3)
}
