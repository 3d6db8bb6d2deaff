package redis_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/redistest"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/redis"
)

// orderHandler counts its runs and answers 201 with the run number, slowly
// enough that concurrent repeats find the first request in flight.
func orderHandler(runs *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		time.Sleep(20 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"run":` + strconv.FormatInt(n, 10) + `}`))
	})
}

func TestMiddlewareExactlyOnce(t *testing.T) {
	for _, backend := range []string{"standalone", "cluster"} {
		t.Run(backend, func(t *testing.T) {
			var c goredis.UniversalClient
			if backend == "cluster" {
				cl := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: sharedCluster(t).Addrs(), ContextTimeoutEnabled: true, PoolSize: 64})
				t.Cleanup(func() { cl.Close() })
				c = cl
			} else {
				c = newClient(t, redistest.Start(t))
			}
			m, err := middleware.New(newStore(t, c))
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int64
			h := m.Required()(orderHandler(&runs))
			const racers, rounds = 64, 10
			statuses := make(map[int]int)
			for round := range rounds {
				key := "order-" + randomHex(8)
				before := runs.Load()
				codes := make([]int, racers)
				bodies := make([]string, racers)
				start := make(chan struct{})
				var wg sync.WaitGroup
				for i := range racers {
					wg.Go(func() {
						<-start
						r := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewBufferString(`{"sku":"abc","qty":1}`))
						r.Header.Set("Content-Type", "application/json")
						r.Header.Set("Idempotency-Key", key)
						w := httptest.NewRecorder()
						h.ServeHTTP(w, r)
						codes[i], bodies[i] = w.Code, w.Body.String()
					})
				}
				close(start)
				wg.Wait()
				if got := runs.Load() - before; got != 1 {
					t.Fatalf("round %d: handler ran %d times for one key", round, got)
				}
				for i, code := range codes {
					statuses[code]++
					switch code {
					case http.StatusCreated:
						if want := `{"run":` + strconv.FormatInt(before+1, 10) + `}`; bodies[i] != want {
							t.Fatalf("round %d: 201 with body %s, want %s", round, bodies[i], want)
						}
					case http.StatusConflict:
					default:
						t.Fatalf("round %d: status %d: %s", round, code, bodies[i])
					}
				}
			}
			t.Logf("%d rounds of %d concurrent requests: handler ran once per round; statuses %v", rounds, racers, statuses)
		})
	}
}

func TestMiddlewareRedisDown(t *testing.T) {
	srv := redistest.StartServer(t)
	st, _ := faultStore(t, srv.Addr, true)
	m, err := middleware.New(st)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	h := m.Required()(orderHandler(&runs))
	srv.Kill()

	r := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewBufferString(`{"sku":"abc"}`))
	r.Header.Set("Idempotency-Key", "order-"+randomHex(8))
	w := httptest.NewRecorder()
	d := timed(func() { h.ServeHTTP(w, r) })
	t.Logf("Redis down: %d after %v, Retry-After %q", w.Code, d.Round(time.Millisecond), w.Header().Get("Retry-After"))
	if runs.Load() != 0 {
		t.Fatal("handler ran while the store was down")
	}
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Fatalf("status %d, Retry-After %q; want 503 with Retry-After", w.Code, w.Header().Get("Retry-After"))
	}
	var p struct{ Code string }
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Code != middleware.CodeUnavailable {
		t.Fatalf("body %s: want code %q", w.Body.String(), middleware.CodeUnavailable)
	}
	if d > bound {
		t.Errorf("503 took %v, store budget %v", d, faultBudget)
	}
}

// TestMiddlewareWaitReplicasRefused shows the durability mode end to end:
// with no replica to acknowledge the claim, the request gets 503 and the
// handler does not run.
func TestMiddlewareWaitReplicasRefused(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	m, err := middleware.New(newStore(t, c, redis.WithWaitReplicas(1, 20*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	h := m.Required()(orderHandler(&runs))
	r := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewBufferString(`{}`))
	r.Header.Set("Idempotency-Key", "order-"+randomHex(8))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusServiceUnavailable || runs.Load() != 0 {
		t.Fatalf("status %d, handler runs %d; want 503 and no run", w.Code, runs.Load())
	}
}
