package postgres_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/pgtest"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/postgres"
)

// The tests here run requests through the middleware on a Store: the
// handler inserts one payment through the request's transaction.

// payHandler is the handler every test uses: it inserts a payment for the
// request's key, made by by, and answers 201 with it. Headers of the
// request change what it does (they are not part of the fingerprint):
//
//	X-Block: wait for block to be closed after inserting (ignoring the
//	         request's context: a handler that outlives its deadline)
//	X-Status: answer this status instead of 201
//	X-Panic: panic after inserting
//	X-Flush: flush after a first part of the body, then try the
//	         transaction again (it must be closed) and write the rest
type payHandler struct {
	pay      payments
	by       string
	runs     atomic.Int64
	inserted chan uint32 // the backend pid, after each insert, when not nil
	block    chan struct{}
	after    func() // called after the insert, when not nil
	afterTx  error  // what the transaction said when used after a flush
}

func (h *payHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.runs.Add(1)
	ctx := r.Context()
	key, _ := idemkey.FromContext(ctx)
	tx := postgres.Tx(ctx)
	if tx == nil {
		http.Error(w, "no transaction", http.StatusInternalServerError)
		return
	}
	var id int64
	if err := tx.QueryRow(ctx, "INSERT INTO "+h.pay.name+" (key, made_by) VALUES ($1, $2) RETURNING id", key.Value, h.by).Scan(&id); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if h.inserted != nil {
		// The server's process id (through a pooler, the client's is the
		// pooler's).
		var pid uint32
		if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		h.inserted <- pid
	}
	if h.after != nil {
		h.after()
	}
	if r.Header.Get("X-Block") != "" {
		<-h.block
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
	if r.Header.Get("X-Flush") != "" {
		fmt.Fprintf(w, `{"id":%d,`, id)
		http.NewResponseController(w).Flush()
		_, h.afterTx = tx.Exec(ctx, "SELECT 1")
		fmt.Fprintf(w, `"by":%q}`, h.by)
		return
	}
	fmt.Fprintf(w, `{"id":%d,"by":%q}`, id, h.by)
}

// server serves h behind the middleware on st, with the route's deadline.
func server(t testing.TB, st *postgres.Store, h http.Handler, deadline time.Duration, opts ...middleware.Option) *httptest.Server {
	t.Helper()
	m, err := middleware.New(st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(m.Required(middleware.Deadline(deadline))(h))
	// A handler that panics is one of the cases: net/http logs it.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

type answer struct {
	status   int
	body     string
	replayed bool
	header   http.Header
	err      error
}

// post sends a payment request with key and the extra headers (name,
// value, ...).
func post(c *http.Client, url, key string, hdr ...string) answer {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":10,"currency":"EUR"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: string(b), replayed: resp.Header.Get(idemkey.HeaderReplayed) == "true", header: resp.Header, err: err}
}

var client = &http.Client{Timeout: time.Minute}

func TestMiddlewareOneKey64(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	h := &payHandler{pay: newPayments(t, pool, table), by: "server"}
	srv := server(t, st, h, 30*time.Second)
	for round := range 3 {
		key := rand.Text()
		const n = 64
		answers := make([]answer, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				answers[i] = post(client, srv.URL, key)
			})
		}
		close(start)
		wg.Wait()
		count := map[string]int{}
		for _, a := range answers {
			if a.err != nil {
				t.Fatal(a.err)
			}
			count[fmt.Sprint(a.status, map[bool]string{true: " replayed"}[a.replayed])]++
		}
		t.Logf("round %d: %v", round, count)
		if count["201"] != 1 || count["201"]+count["201 replayed"]+count["409"] != n {
			t.Fatalf("round %d: %v, want one first 201 and the rest replays or 409", round, count)
		}
		if got := h.pay.count(t, key); got != 1 {
			t.Fatalf("round %d: %d payments, want 1", round, got)
		}
		if a := post(client, srv.URL, key); a.status != 201 || !a.replayed {
			t.Fatalf("round %d: a repeat after the burst: %d replayed=%v", round, a.status, a.replayed)
		}
	}
}

// TestMiddlewareRollsBack: a handler that answers 5xx, or panics, after its
// insert leaves no payment, and the key free: the retry runs and pays
// once.
func TestMiddlewareRollsBack(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	h := &payHandler{pay: newPayments(t, pool, table), by: "server"}
	srv := server(t, st, h, 30*time.Second)
	for _, fail := range [][]string{{"X-Status", "500"}, {"X-Status", "503"}, {"X-Panic", "1"}} {
		key := rand.Text()
		a := post(client, srv.URL, key, fail...)
		if a.err == nil && a.status < 500 {
			t.Fatalf("%v: %d %s", fail, a.status, a.body)
		}
		t.Logf("%v: the client got %d %v", fail, a.status, a.err)
		if n := h.pay.count(t, key); n != 0 {
			t.Fatalf("%v: %d payments after the failure, want 0", fail, n)
		}
		if a := post(client, srv.URL, key); a.status != 201 || a.replayed {
			t.Fatalf("%v: the retry got %d replayed=%v %s, want a first 201", fail, a.status, a.replayed, a.body)
		}
		if n := h.pay.count(t, key); n != 1 {
			t.Fatalf("%v: %d payments after the retry, want 1", fail, n)
		}
	}
}

// TestMiddlewareTerminatedBackend: the owner's backend is terminated
// (pg_terminate_backend) while its handler runs; the retry runs at once,
// and the owner's client gets 503: one payment.
func TestMiddlewareTerminatedBackend(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	h := &payHandler{pay: newPayments(t, pool, table), by: "server", inserted: make(chan uint32, 2), block: make(chan struct{})}
	srv := server(t, st, h, 30*time.Second)
	key := rand.Text()
	first := make(chan answer, 1)
	go func() { first <- post(client, srv.URL, key, "X-Block", "1") }()
	pid := <-h.inserted
	var ok bool
	if err := pool.QueryRow(context.Background(), "SELECT pg_terminate_backend($1, 5000)", int32(pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend: %v %v", ok, err)
	}
	start := time.Now()
	retry := post(client, srv.URL, key)
	t.Logf("the retry answered %d after %v", retry.status, time.Since(start).Round(time.Microsecond))
	<-h.inserted
	if retry.status != 201 || retry.replayed {
		t.Fatalf("the retry: %d replayed=%v %s, want a first 201 at once", retry.status, retry.replayed, retry.body)
	}
	close(h.block)
	a := <-first
	t.Logf("the terminated owner's client got %d %s", a.status, a.body)
	if a.status != http.StatusServiceUnavailable {
		t.Errorf("the terminated owner's client got %d, want 503", a.status)
	}
	if who := h.pay.madeBy(t, key); len(who) != 1 {
		t.Fatalf("payments %v, want one", who)
	}
	if again := post(client, srv.URL, key); again.status != 201 || !again.replayed || again.body != retry.body {
		t.Fatalf("a repeat: %d replayed=%v %s, want the retry's answer", again.status, again.replayed, again.body)
	}
}

// TestMiddlewareLapse: a handler that ignores its context outlives its
// claim (route deadline 100 ms, plus ClaimMargin); the retry takes the key
// over and runs; the late owner's commit is fenced: its client gets 503,
// and the retry's payment is the only one.
func TestMiddlewareLapse(t *testing.T) {
	// Most of it is the claim's life waited out: alongside
	// TestStartUpIsBounded's wait.
	t.Parallel()
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	h := &payHandler{pay: newPayments(t, pool, table), by: "server", inserted: make(chan uint32, 2), block: make(chan struct{})}
	srv := server(t, st, h, 100*time.Millisecond)
	// A failure below must not leave the owner's handler blocked, which
	// would hold the server's Close (and the test) for ever.
	var unblock sync.Once
	release := func() { unblock.Do(func() { close(h.block) }) }
	t.Cleanup(release)
	key := rand.Text()
	first := make(chan answer, 1)
	go func() { first <- post(client, srv.URL, key, "X-Block", "1") }()
	owner := <-h.inserted
	if a := post(client, srv.URL, key); a.status != http.StatusConflict {
		t.Fatalf("a retry while the owner's claim lives: %d, want 409", a.status)
	}
	// At the claim's life (the route's deadline plus the margin) the
	// owner's transaction is ended, and its session with it: the key is
	// free from then on.
	waitBackendGone(t, pool, owner, 100*time.Millisecond+middleware.ClaimMargin+10*time.Second)
	retry := post(client, srv.URL, key)
	if retry.status != 201 || retry.replayed {
		t.Fatalf("the retry after the claim lapsed: %d replayed=%v %s", retry.status, retry.replayed, retry.body)
	}
	<-h.inserted
	release()
	a := <-first
	t.Logf("the late owner's client got %d", a.status)
	if a.status != http.StatusServiceUnavailable {
		t.Errorf("the late owner's client got %d %s, want 503", a.status, a.body)
	}
	if who := h.pay.madeBy(t, key); len(who) != 1 {
		t.Fatalf("payments %v, want one", who)
	}
	if again := post(client, srv.URL, key); !again.replayed || again.body != retry.body {
		t.Fatalf("a repeat: %d replayed=%v %s, want the retry's answer", again.status, again.replayed, again.body)
	}
}

// TestMiddlewareLostCommitReply: the server commits, and its replies are
// lost on the way back (a proxy drops them, from the end of the handler
// on). The client gets 503; the retry gets the replay; one payment.
func TestMiddlewareLostCommitReply(t *testing.T) {
	pool, proxy, _ := proxied(t)
	st, table := newStore(t, pool, postgres.WithCommitTimeout(faultBudget))
	h := &payHandler{pay: newPayments(t, sharedPool(t), table), by: "server"}
	srv := server(t, st, h, 30*time.Second)
	// Warm the pool's one connection: the commit's statements are
	// prepared, so the pipeline that runs them is all that is sent.
	if a := post(client, srv.URL, rand.Text()); a.status != 201 {
		t.Fatalf("warm-up: %d %s", a.status, a.body)
	}
	h.after = func() { proxy.DropReplies(true) }
	key := rand.Text()
	a := post(client, srv.URL, key)
	h.after = nil
	proxy.DropReplies(false)
	t.Logf("COMMIT's reply lost: the client got %d %s", a.status, a.body)
	if a.status != http.StatusServiceUnavailable {
		t.Fatalf("the client got %d, want 503", a.status)
	}
	retry := post(client, srv.URL, key)
	if retry.status != 201 || !retry.replayed {
		t.Fatalf("the retry: %d replayed=%v %s, want the committed 201 replayed", retry.status, retry.replayed, retry.body)
	}
	if who := h.pay.madeBy(t, key); len(who) != 1 {
		t.Fatalf("payments %v, want one", who)
	}
}

// TestMiddlewareFlush: on a transactional route a flush commits the record
// (body omitted) with the payment before anything goes out; the
// transaction refuses use after it; a repeat replays the status and
// headers.
func TestMiddlewareFlush(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	h := &payHandler{pay: newPayments(t, pool, table), by: "server"}
	srv := server(t, st, h, 30*time.Second)
	key := rand.Text()
	a := post(client, srv.URL, key, "X-Flush", "1")
	if a.status != 201 || !strings.HasSuffix(a.body, `"by":"server"}`) {
		t.Fatalf("the streamed answer: %d %s", a.status, a.body)
	}
	if !errors.Is(h.afterTx, pgx.ErrTxClosed) {
		t.Errorf("the transaction after the flush: %v, want pgx.ErrTxClosed", h.afterTx)
	}
	if n := h.pay.count(t, key); n != 1 {
		t.Fatalf("%d payments", n)
	}
	again := post(client, srv.URL, key, "X-Flush", "1")
	if again.status != 201 || !again.replayed || again.body != "" || again.header.Get(idemkey.HeaderBodyOmitted) != "true" {
		t.Fatalf("the repeat: %d replayed=%v %q %v", again.status, again.replayed, again.body, again.header)
	}
}

// TestMiddlewareTwoProcesses: two child processes serve the middleware on
// one database; 150 keys are sent 8 times each (4 to each process,
// shuffled, 32 at a time): each key is paid exactly once.
func TestMiddlewareTwoProcesses(t *testing.T) {
	url := sharedURL(t)
	pool := newPool(t, url, 8)
	_, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	var urls []string
	for range 2 {
		_, out := helper(t, "server", "URL="+url, "TABLE="+table)
		if !out.Scan() || !strings.HasPrefix(out.Text(), "listening ") {
			t.Fatalf("a child said %q", out.Text())
		}
		urls = append(urls, strings.TrimPrefix(out.Text(), "listening "))
	}
	type job struct{ key, url string }
	var jobs []job
	for range 150 {
		key := rand.Text()
		for i := range 8 {
			jobs = append(jobs, job{key, urls[i%2]})
		}
	}
	mrand.Shuffle(len(jobs), func(i, j int) { jobs[i], jobs[j] = jobs[j], jobs[i] })
	work := make(chan job)
	var firsts, replays, conflicts atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			for j := range work {
				for {
					a := post(client, j.url, j.key)
					if a.err != nil {
						errs <- a.err
						return
					}
					if a.status == http.StatusConflict {
						conflicts.Add(1)
						time.Sleep(5 * time.Millisecond)
						continue
					}
					if a.status != 201 {
						errs <- fmt.Errorf("%d %s", a.status, a.body)
						return
					}
					if a.replayed {
						replays.Add(1)
					} else {
						firsts.Add(1)
					}
					break
				}
			}
		})
	}
	for _, j := range jobs {
		work <- j
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("1200 requests: %d first runs, %d replays, %d answers of 409 retried", firsts.Load(), replays.Load(), conflicts.Load())
	var total, keys, wrong int
	if err := pool.QueryRow(context.Background(), "SELECT (SELECT count(*) FROM "+pay.name+"), count(*), count(*) FILTER (WHERE n <> 1) FROM (SELECT key, count(*) AS n FROM "+pay.name+" GROUP BY key) k").Scan(&total, &keys, &wrong); err != nil {
		t.Fatal(err)
	}
	if total != 150 || keys != 150 || wrong != 0 || firsts.Load() != 150 {
		t.Fatalf("%d payments for %d keys (%d not paid once), %d first runs; want 150", total, keys, wrong, firsts.Load())
	}
}

// TestMiddlewareCrash: a child process serving the middleware is killed
// (SIGKILL) after its handler inserted the payment, before the commit. The
// client's retry, sent to another server on the same database, runs at
// once (the claim's life is 35 s), and its payment is the only one. The
// takeover time is measured from the signal to the retry's answer.
func TestMiddlewareCrash(t *testing.T) {
	url := sharedURL(t)
	pool := newPool(t, url, 8)
	st, table := newStore(t, pool)
	h := &payHandler{pay: newPayments(t, pool, table), by: "survivor"}
	survivor := server(t, st, h, 30*time.Second)
	var times []time.Duration
	for round := range 5 {
		cmd, out := helper(t, "server", "URL="+url, "TABLE="+table)
		if !out.Scan() || !strings.HasPrefix(out.Text(), "listening ") {
			t.Fatalf("the child said %q", out.Text())
		}
		childURL := strings.TrimPrefix(out.Text(), "listening ")
		key := rand.Text()
		first := make(chan answer, 1)
		go func() { first <- post(client, childURL, key, "X-Crash", "1") }()
		if !out.Scan() || out.Text() != "inserted" {
			t.Fatalf("the child said %q", out.Text())
		}
		if a := post(client, survivor.URL, key); a.status != http.StatusConflict {
			t.Fatalf("round %d: a retry while the child runs: %d, want 409", round, a.status)
		}
		cmd.Process.Kill()
		start := time.Now()
		var retry answer
		for {
			retry = post(client, survivor.URL, key)
			if retry.status != http.StatusConflict || time.Since(start) > 30*time.Second {
				break
			}
		}
		d := time.Since(start)
		times = append(times, d)
		if a := <-first; a.err == nil {
			t.Fatalf("round %d: the killed child answered %d", round, a.status)
		}
		if retry.status != 201 || retry.replayed {
			t.Fatalf("round %d: the retry: %d replayed=%v %s", round, retry.status, retry.replayed, retry.body)
		}
		if who := h.pay.madeBy(t, key); len(who) != 1 || who[0] != "survivor" {
			t.Fatalf("round %d: payments %v, want the survivor's alone", round, who)
		}
		t.Logf("round %d: the retry ran %v after SIGKILL", round, d.Round(time.Microsecond))
		cmd.Wait()
	}
	slices.Sort(times)
	t.Logf("crash takeover through the middleware: median %v, max %v (claim life 35 s)", times[len(times)/2].Round(time.Microsecond), times[len(times)-1].Round(time.Microsecond))
}

// serveChild is the "server" mode of TestHelperProcess: the middleware on
// the store, with the payment handler, on a free port; a request with
// X-Crash says "inserted" on stdout after its insert and hangs.
func serveChild(st *postgres.Store, pool *pgxpool.Pool, table string) {
	h := &payHandler{pay: payments{pool: pool, name: pgx.Identifier{table + "_payments"}.Sanitize()}, by: fmt.Sprint(os.Getpid())}
	m, err := middleware.New(st)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	crash := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Crash") == "" {
			h.ServeHTTP(w, r)
			return
		}
		ctx := r.Context()
		key, _ := idemkey.FromContext(ctx)
		if _, err := postgres.Tx(ctx).Exec(ctx, "INSERT INTO "+h.pay.name+" (key, made_by) VALUES ($1, 'killed child')", key.Value); err != nil {
			fmt.Println("error:", err)
			return
		}
		fmt.Println("inserted")
		select {}
	})
	srv := httptest.NewServer(m.Required(middleware.Deadline(30 * time.Second))(crash))
	fmt.Println("listening " + srv.URL)
	select {}
}

// TestMiddlewareDatabaseDown: with the database killed, or frozen
// (SIGSTOP), a request is answered 503 within the store's budget and its
// handler does not run.
func TestMiddlewareDatabaseDown(t *testing.T) {
	for _, fault := range []string{"killed", "frozen"} {
		t.Run(fault, func(t *testing.T) {
			srv := pgtest.Start(t)
			st, _, pay := faultStore(t, srv.URL, 8)
			h := &payHandler{pay: pay, by: "server"}
			svc := server(t, st, h, 30*time.Second)
			if a := post(client, svc.URL, rand.Text()); a.status != 201 {
				t.Fatalf("with the database up: %d %s", a.status, a.body)
			}
			runs := h.runs.Load()
			if fault == "killed" {
				srv.Kill()
			} else {
				srv.Freeze()
				defer srv.Thaw()
			}
			for i := range 3 {
				var a answer
				d := timed(func() { a = post(client, svc.URL, rand.Text()) })
				t.Logf("database %s: request %d answered %d after %v", fault, i, a.status, d.Round(time.Millisecond))
				if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" {
					t.Errorf("database %s: %d %s, want 503 with Retry-After", fault, a.status, a.body)
				}
				if d > bound {
					t.Errorf("database %s: answered after %v, budget %v", fault, d, faultBudget)
				}
			}
			if n := h.runs.Load() - runs; n != 0 {
				t.Errorf("the handler ran %d times with the database %s", n, fault)
			}
		})
	}
}
