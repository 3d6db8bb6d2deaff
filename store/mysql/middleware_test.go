package mysql_test

import (
	"crypto/rand"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/mysql"
)

// The tests here run requests through the middleware on a Store: the
// handler inserts one payment through the request's transaction.

// payHandler inserts a payment for the request's key and answers 201.
// X-Block makes it wait for block after its insert (ignoring its
// context); X-Status answers that status instead.
type payHandler struct {
	pay      payments
	runs     atomic.Int64
	inserted chan int64 // the session's id, after each insert, when not nil
	block    chan struct{}
	unblockd sync.Once
}

// unblock lets the blocked handlers go on (once; later calls do nothing).
func (h *payHandler) unblock() { h.unblockd.Do(func() { close(h.block) }) }

// unblockAtEnd lets the blocked handlers go on when the test ends, also
// when it fails half way: a handler left blocked would hold the server's
// Close, and the test, for ever. Call it after server, whose Close then
// runs after it (cleanups run last first).
func (h *payHandler) unblockAtEnd(t testing.TB) { t.Cleanup(h.unblock) }

func (h *payHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.runs.Add(1)
	ctx := r.Context()
	key, _ := idemkey.FromContext(ctx)
	tx := mysql.Tx(ctx)
	if tx == nil {
		http.Error(w, "no transaction", http.StatusInternalServerError)
		return
	}
	res, err := tx.ExecContext(ctx, "INSERT INTO `"+h.pay.name+"` (k, made_by) VALUES (?, 'server')", key.Value)
	if err != nil {
		http.Error(w, "insert failed", http.StatusInternalServerError)
		return
	}
	id, _ := res.LastInsertId()
	if h.inserted != nil {
		var conn int64
		if err := tx.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&conn); err != nil {
			http.Error(w, "no session id", http.StatusInternalServerError)
			return
		}
		h.inserted <- conn
	}
	if r.Header.Get("X-Block") != "" {
		<-h.block
	}
	status := http.StatusCreated
	if s := r.Header.Get("X-Status"); s != "" {
		fmt.Sscan(s, &status)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"id":%d}`, id)
}

// server serves h behind the middleware on st, with the route's deadline.
func server(t testing.TB, st *mysql.Store, h http.Handler, deadline time.Duration) *httptest.Server {
	t.Helper()
	m, err := middleware.New(st)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(m.Required(middleware.Deadline(deadline))(h))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

type answer struct {
	status   int
	body     string
	replayed bool
	err      error
}

// post sends a payment request with key, a body, and extra headers (name,
// value, ...).
func post(url, key, body string, hdr ...string) answer {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: string(b), replayed: resp.Header.Get(idemkey.HeaderReplayed) == "true", err: err}
}

var client = &http.Client{Timeout: time.Minute}

const payBody = `{"amount":10,"currency":"EUR"}`

// TestMiddlewareOneKey: 32 concurrent tries of one request pay once; the
// others are replays or 409; a repeat after replays the first answer.
func TestMiddlewareOneKey(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	h := &payHandler{pay: newPayments(t, db)}
	srv := server(t, st, h, 30*time.Second)
	for round := range 3 {
		key := rand.Text()
		const n = 32
		answers := make([]answer, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				answers[i] = post(srv.URL, key, payBody)
			})
		}
		close(start)
		wg.Wait()
		count := map[string]int{}
		first := ""
		for _, a := range answers {
			if a.err != nil {
				t.Fatal(a.err)
			}
			if a.status == 201 && !a.replayed {
				first = a.body
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
		if a := post(srv.URL, key, payBody); a.status != 201 || !a.replayed || a.body != first {
			t.Fatalf("round %d: a repeat after the burst: %d replayed=%v %s, want the first answer %s", round, a.status, a.replayed, a.body, first)
		}
	}
}

// TestMiddlewareInFlight: while the first request runs, a repeat gets
// 409 and one with another body 422; after it, the repeat replays and the
// other body still gets 422.
func TestMiddlewareInFlight(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	h := &payHandler{pay: newPayments(t, db), inserted: make(chan int64, 1), block: make(chan struct{})}
	srv := server(t, st, h, 30*time.Second)
	h.unblockAtEnd(t)
	key := rand.Text()
	first := make(chan answer, 1)
	go func() { first <- post(srv.URL, key, payBody, "X-Block", "1") }()
	<-h.inserted
	if a := post(srv.URL, key, payBody); a.status != http.StatusConflict {
		t.Fatalf("a repeat in flight: %d %s, want 409", a.status, a.body)
	}
	if a := post(srv.URL, key, `{"amount":11,"currency":"EUR"}`); a.status != http.StatusUnprocessableEntity {
		t.Fatalf("another body in flight: %d %s, want 422", a.status, a.body)
	}
	h.unblock()
	a := <-first
	if a.status != 201 || a.replayed {
		t.Fatalf("the first request: %d replayed=%v", a.status, a.replayed)
	}
	if b := post(srv.URL, key, payBody); b.status != 201 || !b.replayed || b.body != a.body {
		t.Fatalf("a repeat after: %d replayed=%v %s, want %s replayed", b.status, b.replayed, b.body, a.body)
	}
	if b := post(srv.URL, key, `{"amount":11,"currency":"EUR"}`); b.status != http.StatusUnprocessableEntity {
		t.Fatalf("another body after: %d, want 422", b.status)
	}
	if n := h.pay.count(t, key); n != 1 || h.runs.Load() != 1 {
		t.Fatalf("%d payments in %d runs, want 1 and 1", n, h.runs.Load())
	}
}

// TestMiddlewareRollsBack: a 5xx after the insert leaves no payment and
// the key free: the retry runs and pays once.
func TestMiddlewareRollsBack(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	h := &payHandler{pay: newPayments(t, db)}
	srv := server(t, st, h, 30*time.Second)
	key := rand.Text()
	if a := post(srv.URL, key, payBody, "X-Status", "503"); a.status != 503 {
		t.Fatalf("the failing run: %d", a.status)
	}
	if n := h.pay.count(t, key); n != 0 {
		t.Fatalf("%d payments after a 503, want 0", n)
	}
	if a := post(srv.URL, key, payBody); a.status != 201 || a.replayed {
		t.Fatalf("the retry: %d replayed=%v, want a first 201", a.status, a.replayed)
	}
	if n := h.pay.count(t, key); n != 1 {
		t.Fatalf("%d payments after the retry, want 1", n)
	}
}

// TestMiddlewareKilledSession: the owner's session is killed while its
// handler runs; the retry runs at once, and the owner's client gets 503:
// one payment.
func TestMiddlewareKilledSession(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	h := &payHandler{pay: newPayments(t, db), inserted: make(chan int64, 2), block: make(chan struct{})}
	srv := server(t, st, h, 30*time.Second)
	h.unblockAtEnd(t)
	key := rand.Text()
	first := make(chan answer, 1)
	go func() { first <- post(srv.URL, key, payBody, "X-Block", "1") }()
	id := <-h.inserted
	if _, err := db.Exec(fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
		t.Fatal(err)
	}
	var retry answer
	for deadline := time.Now().Add(5 * time.Second); ; {
		if retry = post(srv.URL, key, payBody); retry.status != http.StatusConflict || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	<-h.inserted
	if retry.status != 201 || retry.replayed {
		t.Fatalf("the retry: %d replayed=%v %s, want a first 201", retry.status, retry.replayed, retry.body)
	}
	h.unblock()
	if a := <-first; a.status != http.StatusServiceUnavailable {
		t.Errorf("the killed owner's client got %d %s, want 503", a.status, a.body)
	}
	if n := h.pay.count(t, key); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
}

// TestMiddlewareLapse: a handler that ignores its context outlives its
// claim (the route's deadline, 1 s, plus ClaimMargin); the retry takes the
// key over at the claim's end and runs; the late owner's commit is fenced
// (its client gets 503), and the retry's payment is the only one. The
// deadline also bounds the retry, its claim and its handler's insert from
// the request's start: 100 ms, as it was, was outrun on a loaded machine
// (the insert failed on the ended context, a 500).
func TestMiddlewareLapse(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	h := &payHandler{pay: newPayments(t, db), inserted: make(chan int64, 2), block: make(chan struct{})}
	srv := server(t, st, h, time.Second)
	h.unblockAtEnd(t)
	key := rand.Text()
	first := make(chan answer, 1)
	go func() { first <- post(srv.URL, key, payBody, "X-Block", "1") }()
	<-h.inserted
	var retry answer
	for deadline := time.Now().Add(20 * time.Second); ; {
		if retry = post(srv.URL, key, payBody); retry.status != http.StatusConflict || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if retry.status != 201 || retry.replayed {
		t.Fatalf("the retry: %d replayed=%v %s, want a first 201", retry.status, retry.replayed, retry.body)
	}
	<-h.inserted
	h.unblock()
	if a := <-first; a.status != http.StatusServiceUnavailable {
		t.Errorf("the late owner's client got %d %s, want 503", a.status, a.body)
	}
	if n := h.pay.count(t, key); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
}
