package postgres_test

import (
	"crypto/rand"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/postgres"
)

// TestPoolOfOne: a store whose pool has one connection (pgxpool MaxConns
// 1, or sql.DB SetMaxOpenConns(1)), a call budget of 300 ms. While a
// request's handler holds the connection, concurrent requests with its
// key and with other keys are answered 503 within the budget (and a wide
// margin), none runs; once the owner is done, its key replays and each
// other key runs once. Every handler run is accounted for.
func TestPoolOfOne(t *testing.T) {
	for _, face := range []string{"pgx", "sql"} {
		t.Run(face, func(t *testing.T) {
			opts := []postgres.Option{postgres.WithCallTimeout(faultBudget)}
			var st *postgres.Store
			var table string
			if face == "sql" {
				db := sqlDB(t)
				db.SetMaxOpenConns(1)
				table = newTable(t, sharedPool(t))
				var err error
				st, err = postgres.NewDB(t.Context(), db, append([]postgres.Option{postgres.WithTable(table), postgres.WithSweepInterval(0)}, opts...)...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { st.Close() })
			} else {
				table = newTable(t, sharedPool(t))
				var err error
				st, err = postgres.New(t.Context(), newPool(t, sharedURL(t), 1), append([]postgres.Option{postgres.WithTable(table), postgres.WithSweepInterval(0)}, opts...)...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { st.Close() })
			}
			pay := newPayments(t, sharedPool(t), table)
			h := &gateHandler{table: pay.name, sql: face == "sql", gate: make(chan struct{}), ran: make(chan struct{}, 1)}
			m, err := middleware.New(st)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(m.Required(middleware.Deadline(10 * time.Second))(h))
			t.Cleanup(srv.Close)
			var unblock sync.Once
			release := func() { unblock.Do(func() { close(h.gate) }) }
			t.Cleanup(release)

			key := rand.Text()
			owner := make(chan answer, 1)
			go func() { owner <- post(client, srv.URL, key, "X-Block", "1") }()
			<-h.ran
			const n = 8
			others := make([]string, n)
			answers := make([]answer, 2*n)
			took := make([]time.Duration, 2*n)
			var wg sync.WaitGroup
			for i := range 2 * n {
				k := key
				if i >= n {
					k = rand.Text()
					others[i-n] = k
				}
				wg.Go(func() {
					start := time.Now()
					answers[i] = post(client, srv.URL, k)
					took[i] = time.Since(start)
				})
			}
			wg.Wait()
			for i, a := range answers {
				if a.status != http.StatusServiceUnavailable {
					t.Fatalf("request %d while the one connection is held: %d replayed=%v %s, want 503", i, a.status, a.replayed, a.body)
				}
				if took[i] > bound {
					t.Errorf("request %d answered 503 after %v, budget %v", i, took[i], faultBudget)
				}
			}
			if r := h.runs.Load(); r != 1 {
				t.Fatalf("%d runs while the connection was held, want 1", r)
			}
			release()
			if a := <-owner; a.status != 201 || a.replayed {
				t.Fatalf("the owner: %d %s", a.status, a.body)
			}
			if a := post(client, srv.URL, key); a.status != 201 || !a.replayed {
				t.Fatalf("the owner's key after: %d replayed=%v %s", a.status, a.replayed, a.body)
			}
			// The other keys at once, on the one connection: some wait
			// their turn, some may be answered 503; each runs at most once,
			// and a retry of each after runs it or replays it.
			var mu sync.Mutex
			count := map[int]int{}
			for _, k := range others {
				wg.Go(func() {
					a := post(client, srv.URL, k)
					mu.Lock()
					count[a.status]++
					mu.Unlock()
				})
			}
			wg.Wait()
			for _, k := range others {
				if a := post(client, srv.URL, k); a.status != 201 {
					t.Fatalf("another key after: %d %s", a.status, a.body)
				}
				if a := post(client, srv.URL, k); a.status != 201 || !a.replayed {
					t.Fatalf("another key's repeat: %d replayed=%v", a.status, a.replayed)
				}
			}
			for _, k := range append(others, key) {
				if c := pay.count(t, k); c != 1 {
					t.Fatalf("%d payments for a key, want 1", c)
				}
			}
			// One new key, sixteen at once, on the one connection: it
			// runs once.
			burst, runs := rand.Text(), h.runs.Load()
			spread := maps.Clone(count)
			clear(count)
			for range 16 {
				wg.Go(func() {
					a := post(client, srv.URL, burst)
					mu.Lock()
					count[a.status]++
					mu.Unlock()
				})
			}
			wg.Wait()
			if a := post(client, srv.URL, burst); a.status != 201 {
				t.Fatalf("the burst's key after: %d %s", a.status, a.body)
			}
			if r := h.runs.Load() - runs; r != 1 || pay.count(t, burst) != 1 {
				t.Fatalf("one key sixteen times at once: %v; %d runs, %d payments, want 1", count, r, pay.count(t, burst))
			}
			t.Logf("one key sixteen times at once: %v, one run", count)
			t.Logf("held: %d requests answered 503, slowest after %v; then the other keys at once: %v; runs %d for %d keys", 2*n, slices.Max(took), spread, h.runs.Load(), n+2)
		})
	}
}
