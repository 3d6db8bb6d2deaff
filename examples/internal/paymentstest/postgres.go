package paymentstest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/examples/internal/payments"
	"github.com/idemkey/idemkey/internal/pgtest"
)

// pgBackend is the PostgreSQL store on the server at url. Each call of
// its database function makes a schema of the test's own (dropped when
// the test ends) and an environment whose DATABASE_URL puts the service's
// tables there (search_path), with a pool of poolSize connections.
func pgBackend(url string, poolSize int) backend {
	return backend{
		name:   "postgres",
		shared: true,
		database: func(t *testing.T) map[string]string {
			t.Helper()
			var b [6]byte
			rand.Read(b[:])
			schema := "idemkey_example_" + hex.EncodeToString(b[:])
			exec(t, url, "CREATE SCHEMA "+schema)
			t.Cleanup(func() { exec(nil, url, "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
			sep := "?"
			if strings.Contains(url, "?") {
				sep = "&"
			}
			return map[string]string{"DATABASE_URL": url + sep + "search_path=" + schema + "&pool_max_conns=" + strconv.Itoa(poolSize)}
		},
	}
}

// exec runs sql on a connection of its own to url, failing t (when not
// nil) if it fails.
func exec(t *testing.T, url, sql string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err == nil {
		_, err = c.Exec(ctx, sql)
		c.Close(ctx)
	}
	if err != nil && t != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// twoAtOnce sends q twice at once to a service whose payments take a few
// seconds (PAYMENT_DELAY): one runs, and the other finds it in flight and
// answers 409 at once. It returns the 409, and a channel that gets the
// first's answer; during is called between the two.
func twoAtOnce(t *testing.T, s *service, q req, during func()) reply {
	t.Helper()
	answers := make(chan reply, 2)
	for range 2 {
		go func() {
			rep, err := try(s.client, s.Service, q)
			if err != nil {
				t.Error(err)
			}
			answers <- rep
		}()
	}
	conflict := <-answers
	if conflict.Status != http.StatusConflict || conflict.problem(t).Code != idemkey.CodeConflict {
		t.Fatalf("of two tries at once, the first to answer got %d %s, want 409 (the other pays for seconds)", conflict.Status, conflict.Body)
	}
	during()
	first := <-answers
	if first.Status != http.StatusCreated || first.replayed() {
		t.Fatalf("the try that ran: %d replayed=%v %s", first.Status, first.replayed(), first.Body)
	}
	return first
}

// A repeat while a slow payment runs (PAYMENT_DELAY) gets 409; once the
// first answers, it replays it; one payment.
func testPaymentDelay(t *testing.T, routes payments.Routes, b backend) {
	s := start(t, routes, with(b.environ(t), "PAYMENT_DELAY", "2s"), payments.Options{})
	q := req{method: http.MethodPost, path: "/payments", user: "alice", key: newKey(), body: payment(10, "EUR")}
	first := twoAtOnce(t, s, q, func() {})
	if again := s.do(q); again.Status != http.StatusCreated || !again.replayed() || !bytes.Equal(again.Body, first.Body) {
		t.Fatalf("a repeat after the payment: %d replayed=%v", again.Status, again.replayed())
	}
	if ps := s.payments(); len(ps) != 1 {
		t.Errorf("GET /payments = %+v, want one", ps)
	}
}

// A payment whose delay outlives the route's deadline (5 s) is undone and
// answered 503, which is not kept: no payment is left.
func testPaymentPastDeadline(t *testing.T, routes payments.Routes, b backend) {
	s := start(t, routes, with(b.environ(t), "PAYMENT_DELAY", "7s"), payments.Options{})
	rep := s.do(req{method: http.MethodPost, path: "/payments", user: "alice", key: newKey(), body: payment(10, "EUR")})
	if rep.Status != http.StatusServiceUnavailable || rep.problem(t).Code != payments.CodeUnavailable {
		t.Fatalf("a payment past its deadline: %d %s, want 503 %s", rep.Status, rep.Body, payments.CodeUnavailable)
	}
	if ps := s.payments(); len(ps) != 0 {
		t.Errorf("GET /payments = %+v, want none", ps)
	}
}

// With the database, the payment is not there (GET /payments) until its
// transaction commits, with the kept answer, just before the answer goes
// out.
func testPaymentInTransaction(t *testing.T, routes payments.Routes, b backend) {
	s := start(t, routes, with(b.environ(t), "PAYMENT_DELAY", "3s"), payments.Options{})
	q := req{method: http.MethodPost, path: "/payments", user: "alice", key: newKey(), body: payment(10, "EUR")}
	twoAtOnce(t, s, q, func() {
		if ps := s.payments(); len(ps) != 0 {
			t.Errorf("GET /payments while the payment waits = %+v, want none: it has not committed", ps)
		}
	})
	if ps := s.payments(); len(ps) != 1 {
		t.Errorf("after the answer: GET /payments = %+v, want the payment", ps)
	}
}

// With the database gone, /healthz, a payment and GET /payments are 503,
// and no payment is made.
func testDatabaseDown(t *testing.T, routes payments.Routes) {
	srv := pgtest.Start(t)
	s := start(t, routes, pgBackend(srv.URL, 4).environ(t), payments.Options{})
	if rep := s.do(req{method: http.MethodGet, path: "/healthz"}); rep.Status != http.StatusOK {
		t.Fatalf("GET /healthz with the database up: %d %s", rep.Status, rep.Body)
	}
	srv.Kill()
	rep := s.do(req{method: http.MethodGet, path: "/healthz"})
	if rep.Status != http.StatusServiceUnavailable || rep.problem(t).Code != payments.CodeUnavailable {
		t.Errorf("GET /healthz with the database down: %d %s, want 503", rep.Status, rep.Body)
	}
	rep = s.do(req{method: http.MethodPost, path: "/payments", user: "ivy", key: newKey(), body: payment(1, "EUR")})
	if rep.Status != http.StatusServiceUnavailable || rep.problem(t).Code != idemkey.CodeUnavailable || rep.Header.Get("Retry-After") == "" {
		t.Errorf("POST with the database down: %d %s, want 503 %s with Retry-After", rep.Status, rep.Body, idemkey.CodeUnavailable)
	}
	rep = s.do(req{method: http.MethodGet, path: "/payments"})
	if rep.Status != http.StatusServiceUnavailable {
		t.Errorf("GET /payments with the database down: %d %s, want 503", rep.Status, rep.Body)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if ps := s.payments(); len(ps) != 0 {
		t.Errorf("GET /payments = %+v, want none", ps)
	}
}
