package redis_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/redistest"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
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
	for _, run := range []struct {
		backend string
		cfg     clientConfig
	}{{"standalone", recommended}, {"cluster", recommended}, {"standalone", pipelined}, {"cluster", pipelined}} {
		backend, cfg := run.backend, run.cfg
		t.Run(backend+"/"+cfg.name, func(t *testing.T) {
			var rc goredis.UniversalClient
			if backend == "cluster" {
				cl := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: sharedCluster(t).Addrs(), ContextTimeoutEnabled: true, PoolSize: 64})
				t.Cleanup(func() { cl.Close() })
				rc = cl
			} else {
				rc = newClient(t, redistest.Start(t))
			}
			m, err := middleware.New(newStore(t, rc, cfg.options()...))
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
	st, _ := faultStore(t, srv.Addr, recommended)
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
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Code != idemkey.CodeUnavailable {
		t.Fatalf("body %s: want code %q", w.Body.String(), idemkey.CodeUnavailable)
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

// TestMiddlewareLostCompleteReply drops the reply to the keep of a first
// run's response, after Redis kept it: go-redis resends the complete, which
// finds the record kept under its own token. The middleware reports the
// response kept, not ownership lost, and repeats replay it.
func TestMiddlewareLostCompleteReply(t *testing.T) {
	marker := "lost-reply-" + randomHex(8)
	p := newDropProxy(t, redistest.Start(t), marker)
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	var mu sync.Mutex
	var events []middleware.Event
	m, err := middleware.New(newStore(t, c), middleware.WithObserver(func(_ *http.Request, e middleware.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, e)
	}))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	h := m.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(marker)) // the keep's request carries the marker
	}))
	key := "order-" + randomHex(8)
	send := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewBufferString(`{}`))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	// Load the scripts, so that the dropped reply is the script's own and
	// not a NOSCRIPT.
	st := newStore(t, c)
	k, w := newKey(), newClaim(1)
	mustClaim(t, st, k, w, store.Claimed)
	if err := st.Complete(context.Background(), k, w.Token, record("warm", 1), time.Minute); err != nil {
		t.Fatal(err)
	}
	p.DropNextReply()
	if w := send(); w.Code != http.StatusCreated || w.Body.String() != marker {
		t.Fatalf("first run: %d %q", w.Code, w.Body.String())
	}
	if p.Dropped() == 0 {
		t.Fatal("proxy dropped no reply")
	}
	mu.Lock()
	kinds := make([]middleware.EventKind, len(events))
	for i, e := range events {
		kinds[i] = e.Kind
	}
	mu.Unlock()
	t.Logf("events after a lost keep reply: %v", kinds)
	if !slices.Contains(kinds, middleware.EventKept) || slices.Contains(kinds, middleware.EventOwnershipLost) {
		t.Errorf("events %v, want kept and no ownership lost", kinds)
	}
	if w := send(); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
		t.Errorf("repeat: %d replayed %q, handler runs %d; want a replay and one run", w.Code, w.Header().Get("Idempotent-Replayed"), runs.Load())
	}
}
