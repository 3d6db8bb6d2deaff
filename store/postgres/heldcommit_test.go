package postgres_test

import (
	"crypto/rand"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkey/idemkey/internal/faultproxy"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/postgres"
)

// TestCommitHeldThenDropped: the owner's commit is held at a proxy (the
// server never sees it), a repeat meanwhile gets 409, then the connection
// is cut: the owner's client gets 503, nothing committed, and the retry
// runs once. With the commit delivered and its reply lost instead, the
// owner's client gets 503 and the retry replays what committed. Both
// faces; one payment every time.
func TestCommitHeldThenDropped(t *testing.T) {
	for _, face := range []string{"pgx", "sql"} {
		for _, deliver := range []bool{false, true} {
			name := face + map[bool]string{false: "/held", true: "/delivered"}[deliver]
			t.Run(name, func(t *testing.T) {
				url := sharedURL(t)
				cfg, err := pgxpool.ParseConfig(url)
				if err != nil {
					t.Fatal(err)
				}
				proxy := faultproxy.Start(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
				host, port, _ := net.SplitHostPort(proxy.Addr)
				n, _ := strconv.Atoi(port)
				cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(n)
				var st *postgres.Store
				var table string
				opts := []postgres.Option{postgres.WithCommitTimeout(10 * time.Second)}
				match := "" // the next write of any kind: the pipeline of the keep and COMMIT
				if face == "sql" {
					match = "commit"
					sharedPool(t) // skips, or fails under CI, without a server
					db := stdlib.OpenDB(*cfg.ConnConfig)
					db.SetMaxOpenConns(4)
					t.Cleanup(func() { db.Close() })
					st, table = newSQLStore(t, db, opts...)
				} else {
					cfg.MaxConns = 4
					pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(pool.Close)
					st, table = newStore(t, pool, opts...)
				}
				pay := newPayments(t, sharedPool(t), table)
				// The handler arms the proxy after its insert, so that
				// the next write on its connection is the commit's.
				taking := make(chan *faultproxy.Take, 1)
				h := &gateHandler{table: pay.name, sql: face == "sql", afterInsert: func(r *http.Request) {
					if r.Header.Get("X-Arm") != "" {
						taking <- proxy.Take(match, deliver)
					}
				}}
				m, err := middleware.New(st)
				if err != nil {
					t.Fatal(err)
				}
				srv := httptest.NewServer(m.Required(middleware.Deadline(10 * time.Second))(h))
				t.Cleanup(srv.Close)
				// Warm: the statements are prepared on the connections.
				for range 3 {
					if a := post(client, srv.URL, rand.Text()); a.status != 201 {
						t.Fatalf("warm-up: %d %s", a.status, a.body)
					}
				}
				key := rand.Text()
				owner := make(chan answer, 1)
				go func() { owner <- post(client, srv.URL, key, "X-Arm", "1") }()
				take := <-taking
				<-take.Taken()
				during := post(client, srv.URL, key)
				t.Logf("a repeat while the commit is taken: %d replayed=%v", during.status, during.replayed)
				if deliver {
					// Committed or about to: in flight, or the record.
					if during.status != http.StatusConflict && !(during.status == 201 && during.replayed) {
						t.Fatalf("a repeat while the commit's reply is lost: %d %s", during.status, during.body)
					}
				} else if during.status != http.StatusConflict {
					t.Fatalf("a repeat while the commit is held: %d replayed=%v %s, want 409", during.status, during.replayed, during.body)
				}
				take.Cut()
				first := <-owner
				t.Logf("the owner's client got %d", first.status)
				if first.status != http.StatusServiceUnavailable {
					t.Fatalf("the owner's client got %d %s, want 503", first.status, first.body)
				}
				var retry answer
				for i := 0; i < 100; i++ {
					retry = post(client, srv.URL, key)
					if retry.status != http.StatusConflict {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				t.Logf("the retry got %d replayed=%v; runs %d, payments %d", retry.status, retry.replayed, h.runs.Load(), pay.count(t, key))
				if retry.status != 201 || retry.replayed != deliver {
					t.Fatalf("the retry: %d replayed=%v %s, want 201 replayed=%v", retry.status, retry.replayed, retry.body, deliver)
				}
				if again := post(client, srv.URL, key); again.status != 201 || !again.replayed {
					t.Fatalf("a repeat after: %d replayed=%v", again.status, again.replayed)
				}
				if n := pay.count(t, key); n != 1 {
					t.Fatalf("%d payments, want 1", n)
				}
			})
		}
	}
}
