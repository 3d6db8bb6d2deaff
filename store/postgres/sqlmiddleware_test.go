package postgres_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/postgres"
)

// The tests here run requests through the middleware on a Store made
// with NewDB: the handler inserts a payment through the request's
// *sql.Tx, and may end that transaction itself.

// sqlPayHandler inserts a payment for the request's key through SQLTx.
// Request headers change what it does next:
//
//	X-Commit: the handler commits the transaction itself
//	X-Rollback: the handler rolls it back itself
//	X-Status: answer this status instead of 201
//	X-Panic: panic
type sqlPayHandler struct {
	table string // the payments table, quoted
	by    string
	runs  atomic.Int64
}

func (h *sqlPayHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.runs.Add(1)
	ctx := r.Context()
	key, _ := idemkey.FromContext(ctx)
	tx := postgres.SQLTx(ctx)
	if tx == nil {
		http.Error(w, "no transaction", http.StatusInternalServerError)
		return
	}
	var id int64
	if err := tx.QueryRowContext(ctx, "INSERT INTO "+h.table+" (key, made_by) VALUES ($1, $2) RETURNING id", key.Value, h.by).Scan(&id); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if r.Header.Get("X-Commit") != "" {
		if err := tx.Commit(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	if r.Header.Get("X-Rollback") != "" {
		tx.Rollback()
	}
	if r.Header.Get("X-Panic") != "" {
		panic("the handler failed after its insert")
	}
	status := http.StatusCreated
	if s := r.Header.Get("X-Status"); s != "" {
		fmt.Sscan(s, &status)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"id":%d,"by":%q}`, id, h.by)
}

// sqlServer is a middleware on a fresh NewDB store with the payment
// handler.
func sqlServer(t *testing.T) (*httptest.Server, *sqlPayHandler, payments, string) {
	t.Helper()
	st, table := newSQLStore(t, sqlDB(t))
	pay := newPayments(t, sharedPool(t), table)
	h := &sqlPayHandler{table: pay.name, by: "server"}
	return server(t, st, h, 30*time.Second), h, pay, table
}

func TestSQLMiddlewareOneKey64(t *testing.T) {
	srv, h, pay, _ := sqlServer(t)
	for round := range 3 {
		key := rand.Text()
		var wg sync.WaitGroup
		answers := make([]answer, 64)
		for i := range answers {
			wg.Go(func() { answers[i] = post(client, srv.URL, key) })
		}
		wg.Wait()
		created := 0
		for _, a := range answers {
			switch {
			case a.err != nil:
				t.Fatal(a.err)
			case a.status == 201 && !a.replayed:
				created++
			case a.status == 201, a.status == http.StatusConflict:
			default:
				t.Fatalf("round %d: %d %s", round, a.status, a.body)
			}
		}
		if created != 1 || pay.count(t, key) != 1 {
			t.Fatalf("round %d: %d first answers and %d payments, want 1 and 1", round, created, pay.count(t, key))
		}
	}
	t.Logf("handler runs: %d for 3 keys", h.runs.Load())
}

// TestSQLMiddlewareHandlerEndsTx: a *sql.Tx is the handler's to commit or
// roll back. Whatever it does, one key makes one payment: a commit then
// 201 is kept and replayed; a commit then a 5xx or a panic leaves the key
// held (409), never freed for a second payment; a rollback then 201 is
// 503, with nothing kept and the key free.
func TestSQLMiddlewareHandlerEndsTx(t *testing.T) {
	srv, h, pay, _ := sqlServer(t)
	cases := []struct {
		name       string
		hdr        []string
		first      int
		retry      int // the retry's status, without the headers
		payments   int // after the retry
		retryRuns  bool
		retryReply bool
	}{
		{"commit then 201", []string{"X-Commit", "1"}, 201, 201, 1, false, true},
		{"commit then 500", []string{"X-Commit", "1", "X-Status", "500"}, 500, http.StatusConflict, 1, false, false},
		// The connection the handler's panic aborts is retried by
		// net/http's transport (a request with an Idempotency-Key is
		// idempotent to it): that retry is what answers first, 409.
		{"commit then panic", []string{"X-Commit", "1", "X-Panic", "1"}, http.StatusConflict, http.StatusConflict, 1, false, false},
		{"rollback then 201", []string{"X-Rollback", "1"}, http.StatusServiceUnavailable, 201, 1, true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key := rand.Text()
			a := post(client, srv.URL, key, c.hdr...)
			if a.err != nil {
				t.Fatal(a.err)
			}
			if a.status != c.first {
				t.Fatalf("first: %d %s, want %d", a.status, a.body, c.first)
			}
			runs := h.runs.Load()
			r := post(client, srv.URL, key)
			if r.status != c.retry || r.replayed != c.retryReply {
				t.Fatalf("retry: %d replayed=%v %s, want %d replayed=%v", r.status, r.replayed, r.body, c.retry, c.retryReply)
			}
			if ran := h.runs.Load() > runs; ran != c.retryRuns {
				t.Errorf("the retry ran the handler: %v, want %v", ran, c.retryRuns)
			}
			if c.retryReply && r.body != a.body {
				t.Errorf("replay %q, want the first answer %q", r.body, a.body)
			}
			if n := pay.count(t, key); n != c.payments {
				t.Errorf("payments for the key: %d, want %d", n, c.payments)
			}
		})
	}
}

// TestSQLMiddlewareCrash: a child serving the middleware on NewDB is
// killed (SIGKILL) after its handler inserted, before any commit (the
// retry runs at once, and its payment is the only one), and after its
// handler committed the transaction itself (the key stays held: the
// retry gets 409, and the child's payment is the only one).
func TestSQLMiddlewareCrash(t *testing.T) {
	url := sharedURL(t)
	srv, h, pay, table := sqlServer(t)
	h.by = "survivor"
	var times []time.Duration
	for round := range 4 {
		committed := round%2 == 1
		cmd, out := helper(t, "sqlserver", "URL="+url, "TABLE="+table)
		if !out.Scan() || !strings.HasPrefix(out.Text(), "listening ") {
			t.Fatalf("the child said %q", out.Text())
		}
		childURL := strings.TrimPrefix(out.Text(), "listening ")
		key := rand.Text()
		hdr := []string{"X-Crash", "1"}
		want := "inserted"
		if committed {
			hdr, want = []string{"X-Crash", "1", "X-Commit", "1"}, "committed"
		}
		first := make(chan answer, 1)
		go func() { first <- post(client, childURL, key, hdr...) }()
		if !out.Scan() || out.Text() != want {
			t.Fatalf("the child said %q, want %q", out.Text(), want)
		}
		cmd.Process.Kill()
		start := time.Now()
		var retry answer
		for {
			retry = post(client, srv.URL, key)
			if retry.status != http.StatusConflict || time.Since(start) > 2*time.Second {
				break
			}
		}
		if a := <-first; a.err == nil {
			t.Fatalf("round %d: the killed child answered %d", round, a.status)
		}
		who := pay.madeBy(t, key)
		if committed {
			if retry.status != http.StatusConflict || !slices.Equal(who, []string{"killed child"}) {
				t.Fatalf("round %d, killed after its own commit: the retry %d %s, payments %v; want 409 and the child's alone", round, retry.status, retry.body, who)
			}
		} else {
			times = append(times, time.Since(start))
			if retry.status != 201 || retry.replayed || !slices.Equal(who, []string{"survivor"}) {
				t.Fatalf("round %d: the retry %d replayed=%v %s, payments %v; want 201 and the survivor's alone", round, retry.status, retry.replayed, retry.body, who)
			}
		}
		cmd.Wait()
	}
	slices.Sort(times)
	t.Logf("crash takeover through the middleware on database/sql: %v (claim life 35 s)", times)
}

// serveSQLChild is the "sqlserver" mode of TestHelperProcess: the
// middleware on a NewDB store, on a free port; a request with X-Crash
// says "inserted" after its insert (or "committed" after committing the
// transaction itself, with X-Commit) and hangs.
func serveSQLChild(url, table string) {
	fail := func(err error) {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		fail(err)
	}
	st, err := postgres.NewDB(context.Background(), db, postgres.WithTable(table), postgres.WithSweepInterval(0), postgres.WithCallTimeout(10*time.Second))
	if err != nil {
		fail(err)
	}
	m, err := middleware.New(st)
	if err != nil {
		fail(err)
	}
	pay := `"` + table + `_payments"`
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		key, _ := idemkey.FromContext(ctx)
		tx := postgres.SQLTx(ctx)
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+pay+" (key, made_by) VALUES ($1, 'killed child')", key.Value); err != nil {
			fmt.Println("error:", err)
			return
		}
		said := "inserted"
		if r.Header.Get("X-Commit") != "" {
			if err := tx.Commit(); err != nil {
				fmt.Println("error:", err)
				return
			}
			said = "committed"
		}
		fmt.Println(said)
		select {}
	})
	srv := httptest.NewServer(m.Required(middleware.Deadline(30 * time.Second))(h))
	fmt.Println("listening " + srv.URL)
	select {}
}
