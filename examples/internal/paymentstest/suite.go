package paymentstest

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/client"
	"github.com/idemkey/idemkey/examples/internal/payments"
	"github.com/idemkey/idemkey/internal/pgtest"
	"github.com/idemkey/idemkey/internal/redistest"
)

// backend is the store a run of the suite uses.
type backend struct {
	name string            // what GET /healthz reports
	env  map[string]string // the environment that selects it
	// database, when set, makes the environment of one service (or of
	// instances that share a database) instead of env: a database of the
	// test's own.
	database func(t *testing.T) map[string]string
	// shared: the payments live in the database, and every instance
	// lists them all.
	shared bool
}

// environ returns the environment of a service the test starts.
func (b backend) environ(t *testing.T) map[string]string {
	if b.database != nil {
		return b.database(t)
	}
	return b.env
}

// Run runs the end-to-end suite against the service that routes builds:
// with the in-memory store; against a standalone redis-server and a
// three-node Redis Cluster spawned for the test on free loopback ports
// (skipped without a redis-server binary, failed when CI is set); against
// the Redis at REDIS_URL when that is set; against a PostgreSQL cluster
// spawned for the test (skipped without the server binaries, failed when
// CI is set), where each service gets a schema of its own; against the
// PostgreSQL at DATABASE_URL when that is set, with fewer tests and small
// pools (a shared server has few connections to spare); against the MySQL
// or MariaDB at MYSQL_URL when that is set, with the same few tests, each
// in a database of its own; and, against
// Redis and PostgreSQL, with two instances that share it.
func Run(t *testing.T, routes payments.Routes) {
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		suite(t, routes, backend{name: "memory"})
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		addr := redistest.Start(t)
		b := backend{name: "redis", env: map[string]string{"REDIS_URL": "redis://" + addr + "/0"}}
		suite(t, routes, b)
		t.Run("TwoInstancesRunOnce", func(t *testing.T) { t.Parallel(); testTwoInstances(t, routes, b) })
		t.Run("StoreDown", func(t *testing.T) { t.Parallel(); testStoreDown(t, routes) })
	})
	if u := os.Getenv("REDIS_URL"); u != "" {
		// A Redis the environment provides (CI starts one): the same suite,
		// with fresh random keys and nothing deleted.
		t.Run("redis-url", func(t *testing.T) {
			t.Parallel()
			b := backend{name: "redis", env: map[string]string{"REDIS_URL": u}}
			suite(t, routes, b)
			t.Run("TwoInstancesRunOnce", func(t *testing.T) { t.Parallel(); testTwoInstances(t, routes, b) })
		})
	}
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		srv := pgtest.Start(t, "max_connections=400")
		b := pgBackend(srv.URL, 8)
		suite(t, routes, b)
		t.Run("TwoInstancesRunOnce", func(t *testing.T) { t.Parallel(); testTwoInstances(t, routes, b) })
		t.Run("PaymentNotVisibleUntilCommitted", func(t *testing.T) { t.Parallel(); testPaymentInTransaction(t, routes, b) })
		t.Run("DatabaseDown", func(t *testing.T) { t.Parallel(); testDatabaseDown(t, routes) })
	})
	if u := os.Getenv("DATABASE_URL"); u != "" {
		// A PostgreSQL the environment provides (CI starts one): the
		// tests that show the transaction, in schemas of their own that
		// are dropped after them.
		t.Run("postgres-url", func(t *testing.T) {
			t.Parallel()
			b := pgBackend(u, 4)
			for name, f := range map[string]func(*testing.T, payments.Routes, backend){
				"LostReplyIsReplayed":             testLostReply,
				"ConcurrentRetriesRunOnce":        testConcurrent,
				"Healthz":                         testHealthz,
				"TwoInstancesRunOnce":             testTwoInstances,
				"PaymentNotVisibleUntilCommitted": testPaymentInTransaction,
			} {
				t.Run(name, func(t *testing.T) { t.Parallel(); f(t, routes, b) })
			}
		})
	}
	if u := os.Getenv("MYSQL_URL"); u != "" {
		// A MySQL or MariaDB the environment provides (CI starts one):
		// the tests that show the transaction, in databases of their own
		// that are dropped after them.
		t.Run("mysql-url", func(t *testing.T) {
			t.Parallel()
			b := mysqlBackend(u)
			for name, f := range map[string]func(*testing.T, payments.Routes, backend){
				"LostReplyIsReplayed":             testLostReply,
				"ConcurrentRetriesRunOnce":        testConcurrent,
				"Healthz":                         testHealthz,
				"TwoInstancesRunOnce":             testTwoInstances,
				"PaymentNotVisibleUntilCommitted": testPaymentInTransaction,
				"PaymentDelay":                    testPaymentDelay,
				"PaymentPastDeadline":             testPaymentPastDeadline,
				"GetPayment":                      testGetPayment,
			} {
				t.Run(name, func(t *testing.T) { t.Parallel(); f(t, routes, b) })
			}
		})
	}
	t.Run("redis-cluster", func(t *testing.T) {
		t.Parallel()
		redistest.Require(t)
		c, err := redistest.StartCluster(3)
		if err != nil {
			redistest.Unavailable(t, err)
		}
		t.Cleanup(c.Close)
		b := backend{name: "redis-cluster", env: map[string]string{"REDIS_CLUSTER_ADDRS": strings.Join(c.Addrs(), ",")}}
		suite(t, routes, b)
		t.Run("TwoInstancesRunOnce", func(t *testing.T) { t.Parallel(); testTwoInstances(t, routes, b) })
	})
}

// suite runs every test that holds for any store.
func suite(t *testing.T, routes payments.Routes, b backend) {
	tests := []struct {
		name string
		f    func(*testing.T, payments.Routes, backend)
	}{
		{"LostReplyIsReplayed", testLostReply},
		{"ConflictDuringSlowTransfer", testConflict},
		{"ChangedRequestIsRefused", testChangedRequest},
		{"MissingKeyIsRefused", testMissingKey},
		{"TwoUsersSameKey", testTwoUsers},
		{"RetriedTransferCallsBankOnce", testRetriedTransfer},
		{"LostTransferReplyIsReplayed", testLostTransferReply},
		{"BadRequestIsKept", testBadRequest},
		{"BodyNotLabelledJSONIs415", testMediaType},
		{"ProfileKeyIsOptional", testProfile},
		{"GetPayment", testGetPayment},
		{"ConcurrentRetriesRunOnce", testConcurrent},
		{"ShutdownFinishesRequests", testShutdown},
		{"Healthz", testHealthz},
		{"RouteErrors", testRouteErrors},
		{"MetricsAndOpenAPI", testMetricsAndOpenAPI},
		{"SlowPaymentIsInFlight", testPaymentDelay},
		{"PaymentPastDeadlineIsUndone", testPaymentPastDeadline},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.f(t, routes, b)
		})
	}
}

// with returns env with the extra variables kv (name, value, ...).
func with(env map[string]string, kv ...string) map[string]string {
	env = maps.Clone(env)
	if env == nil {
		env = map[string]string{}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		env[kv[i]] = kv[i+1]
	}
	return env
}

// retrying returns an idemkey client that reaches the service through rt,
// retrying at once.
func retrying(t *testing.T, rt http.RoundTripper) *http.Client {
	t.Helper()
	tr, err := client.New(client.WithBase(rt), client.WithBackoff(time.Millisecond, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: tr, Timeout: startTimeout}
}

// A reply to a POST is lost on its way back; the client retries with the
// same key and gets the first answer, replayed; one payment was made.
func testLostReply(t *testing.T, routes payments.Routes, b backend) {
	s := start(t, routes, b.environ(t), payments.Options{})
	lose := &loseReplies{base: s.client.Transport, n: 1}
	c := retrying(t, lose)

	key := newKey()
	var trace client.Trace
	rep := do(t, c, s.Service, req{method: http.MethodPost, path: "/payments", user: "alice", key: key,
		body: payment(10, "EUR"), ctx: client.WithTrace(context.Background(), &trace)})

	lost := lose.dropped()
	if len(lost) != 1 || lost[0].Status != http.StatusCreated || lost[0].replayed() {
		t.Fatalf("the lost reply was %+v, want one first 201", lost)
	}
	if rep.Status != http.StatusCreated || !rep.replayed() {
		t.Fatalf("the retry got %d replayed=%v %s, want 201 replayed", rep.Status, rep.replayed(), rep.Body)
	}
	if !bytes.Equal(rep.Body, lost[0].Body) {
		t.Errorf("the replay's body %s differs from the lost one %s", rep.Body, lost[0].Body)
	}
	if got, want := rep.Header.Get("Location"), lost[0].Header.Get("Location"); got != want || want == "" {
		t.Errorf("the replay's Location %q, the lost one %q", got, want)
	}
	if a, b := rep.Header.Get(idemkey.HeaderRequestID), lost[0].Header.Get(idemkey.HeaderRequestID); a == "" || a == b {
		t.Errorf("the replay's X-Request-Id %q, the first's %q: want the repeat's own", a, b)
	}
	for _, r := range lose.requests() {
		if r.key != key {
			t.Errorf("a try was sent with key %q, want %q", r.key, key)
		}
	}
	if trace.Attempts != 2 || !trace.Replayed {
		t.Errorf("client trace %+v, want 2 attempts and a replay", trace)
	}

	p := decodeInto[payments.Payment](t, rep)
	want := payments.Payment{ID: p.ID, Amount: 10, Currency: "EUR", User: "alice"}
	if p != want || !strings.HasPrefix(p.ID, "pay_") {
		t.Errorf("payment %+v, want %+v", p, want)
	}
	if ps := s.payments(); len(ps) != 1 || ps[0] != want {
		t.Errorf("GET /payments = %+v, want exactly %+v", ps, want)
	}
}

// A repeat while the bank is still making the first transfer gets 409
// with Retry-After, a different request under the key 422, and once the
// first is done, a repeat replays it.
func testConflict(t *testing.T, routes payments.Routes, b backend) {
	var hold *holdFirst
	s := start(t, routes, with(b.environ(t), "BANK_DELAY", "20ms"), payments.Options{
		WrapBankTransport: func(rt http.RoundTripper) http.RoundTripper { hold = newHoldFirst(rt); return hold },
	})
	key := newKey()
	q := req{method: http.MethodPost, path: "/transfers", user: "alice", key: key, body: transfer(25, "acct-bob")}

	type result struct {
		rep reply
		err error
	}
	first := make(chan result, 1)
	go func() {
		rep, err := try(s.client, s.Service, q)
		first <- result{rep, err}
	}()
	select {
	case <-hold.entered:
	case r := <-first:
		t.Fatalf("the first transfer ended before it reached the bank: %+v", r)
	case <-time.After(startTimeout):
		t.Fatal("the first transfer never reached the bank")
	}

	rep := s.doAgainOn503(q)
	if rep.Status != http.StatusConflict {
		close(hold.release)
		t.Fatalf("a repeat during the transfer got %d %s, want 409", rep.Status, rep.Body)
	}
	if p := rep.problem(t); p.Code != idemkey.CodeConflict {
		t.Errorf("409 code %q, want %q", p.Code, idemkey.CodeConflict)
	}
	if ra, err := strconv.Atoi(rep.Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("409 Retry-After %q, want whole seconds >= 1", rep.Header.Get("Retry-After"))
	}
	changed := q
	changed.body = transfer(26, "acct-bob")
	if rep := s.doAgainOn503(changed); rep.Status != http.StatusUnprocessableEntity || rep.problem(t).Code != idemkey.CodeKeyReused {
		t.Errorf("a different transfer under the key in flight got %d %s, want 422 %s", rep.Status, rep.Body, idemkey.CodeKeyReused)
	}

	close(hold.release)
	r := <-first
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.rep.Status != http.StatusCreated || r.rep.replayed() {
		t.Fatalf("the first transfer got %d replayed=%v %s, want a first 201", r.rep.Status, r.rep.replayed(), r.rep.Body)
	}
	tr := decodeInto[payments.Transfer](t, r.rep)
	if tr.Amount != 25 || tr.To != "acct-bob" || tr.User != "alice" || tr.BankReference == "" {
		t.Errorf("transfer %+v", tr)
	}
	after := s.do(q)
	if after.Status != http.StatusCreated || !after.replayed() || !bytes.Equal(after.Body, r.rep.Body) {
		t.Errorf("a repeat after the transfer got %d replayed=%v %s, want the first 201 replayed", after.Status, after.replayed(), after.Body)
	}
	if bt := s.bankTransfers(); len(bt) != 1 || bt[0].Reference != tr.BankReference {
		t.Errorf("the bank made %+v, want one transfer %s", bt, tr.BankReference)
	}
	if ts := s.transfers(); len(ts) != 1 {
		t.Errorf("GET /transfers = %+v, want one", ts)
	}
}

// A body that is not labelled JSON is refused with 415 and pays nothing:
// curl's -d without a Content-Type labels it a form. Bodies that a JSON
// reader would tell apart but a form reader would not (a+b, a b, a%20b)
// are never taken for one another.
func testMediaType(t *testing.T, routes payments.Routes, b backend) {
	s := start(t, routes, b.environ(t), payments.Options{})
	for _, ct := range []string{"-", "application/x-www-form-urlencoded", "text/plain"} {
		rep := s.do(req{method: http.MethodPost, path: "/payments", user: "alice", key: newKey(), body: payment(10, "EUR"), contentType: ct})
		if rep.Status != http.StatusUnsupportedMediaType || rep.problem(t).Code != payments.CodeUnsupportedMediaType {
			t.Errorf("body labelled %q: %d %s, want 415 %s", ct, rep.Status, rep.Body, payments.CodeUnsupportedMediaType)
		}
	}
	if ps := s.payments(); len(ps) != 0 {
		t.Errorf("payments made: %+v, want none", ps)
	}
	// The same key, the same bytes, labelled JSON this time: a different
	// request from the refused one, so 422 rather than the kept 415.
	key := newKey()
	s.do(req{method: http.MethodPost, path: "/payments", user: "alice", key: key, body: payment(10, "EUR"), contentType: "application/x-www-form-urlencoded"})
	rep := s.do(req{method: http.MethodPost, path: "/payments", user: "alice", key: key, body: payment(10, "EUR")})
	if rep.Status != http.StatusUnprocessableEntity || rep.problem(t).Code != idemkey.CodeKeyReused {
		t.Errorf("the JSON-labelled retry of a refused form: %d %s, want 422 %s", rep.Status, rep.Body, idemkey.CodeKeyReused)
	}
}

// The same key with a different request is 422, on the same route or
// another; the same request with its JSON keys reordered is a replay.
func testChangedRequest(t *testing.T, routes payments.Routes, b backend) {
	s := start(t, routes, b.environ(t), payments.Options{})
	key := newKey()
	first := s.do(req{method: http.MethodPost, path: "/payments", user: "alice", key: key, body: payment(10, "EUR"), requestID: "req-first"})
	if first.Status != http.StatusCreated || first.replayed() {
		t.Fatalf("first: %d %s", first.Status, first.Body)
	}
	for _, q := range []req{
		{method: http.MethodPost, path: "/payments", user: "alice", key: key, body: payment(99, "EUR")},
		{method: http.MethodPost, path: "/payments", user: "alice", key: key, body: payment(10, "USD")},
		{method: http.MethodPost, path: "/transfers", user: "alice", key: key, body: transfer(10, "acct-bob")},
	} {
		rep := s.do(q)
		if rep.Status != http.StatusUnprocessableEntity {
			t.Errorf("%s %s under a used key: %d %s, want 422", q.path, q.body, rep.Status, rep.Body)
			continue
		}
		if p := rep.problem(t); p.Code != idemkey.CodeKeyReused {
			t.Errorf("422 code %q, want %q", p.Code, idemkey.CodeKeyReused)
		}
		if bytes.Contains(rep.Body, []byte(key)) {
			t.Errorf("the problem echoes the key: %s", rep.Body)
		}
	}
	same := s.do(req{method: http.MethodPost, path: "/payments", user: "alice", key: key,
		body: "{ \"currency\": \"EUR\",\n  \"amount\": 10 }", requestID: "req-again"})
	if same.Status != http.StatusCreated || !same.replayed() || !bytes.Equal(same.Body, first.Body) {
		t.Errorf("the same payment, reformatted, got %d replayed=%v %s, want a replay", same.Status, same.replayed(), same.Body)
	}
	if id := same.Header.Get(idemkey.HeaderRequestID); id != "req-again" {
		t.Errorf("the replay's X-Request-Id %q, want the repeat's own %q", id, "req-again")
	}
	if ps := s.payments(); len(ps) != 1 {
		t.Errorf("GET /payments = %+v, want one payment", ps)
	}
	if bt := s.bankTransfers(); len(bt) != 0 {
		t.Errorf("the bank made %+v, want none", bt)
	}
}

// POST /payments and POST /transfers without a key, or with a malformed
// one, are 400 and run nothing.
func testMissingKey(t *testing.T, routes payments.Routes, b backend) {
	s := start(t, routes, b.environ(t), payments.Options{})
	for _, tc := range []struct {
		q    req
		code string
	}{
		{req{method: http.MethodPost, path: "/payments", user: "alice", body: payment(10, "EUR")}, idemkey.CodeKeyMissing},
		{req{method: http.MethodPost, path: "/transfers", user: "alice", body: transfer(10, "acct-bob")}, idemkey.CodeKeyMissing},
		{req{method: http.MethodPost, path: "/payments", user: "alice", key: strings.Repeat("k", 256), body: payment(10, "EUR")}, idemkey.CodeKeyInvalid},
		{req{method: http.MethodPost, path: "/payments", user: "alice", key: "café", body: payment(10, "EUR")}, idemkey.CodeKeyInvalid},
	} {
		rep := s.do(tc.q)
		if rep.Status != http.StatusBadRequest {
			t.Errorf("%s key %q: %d %s, want 400", tc.q.path, tc.q.key, rep.Status, rep.Body)
			continue
		}
		if p := rep.problem(t); p.Code != tc.code {
			t.Errorf("%s key %q: code %q, want %q", tc.q.path, tc.q.key, p.Code, tc.code)
		}
	}
	if ps := s.payments(); len(ps) != 0 {
		t.Errorf("GET /payments = %+v, want none", ps)
	}
	if bt := s.bankTransfers(); len(bt) != 0 {
		t.Errorf("the bank made %+v, want none", bt)
	}
}

// Two users (and an anonymous caller) who send the same key each get
// their own payment: keys live per user.
func testTwoUsers(t *testing.T, routes payments.Routes, b backend) {
	s := start(t, routes, b.environ(t), payments.Options{})
	key := newKey()
	var got []payments.Payment
	for _, u := range []string{"alice", "bob", ""} {
		rep := s.do(req{method: http.MethodPost, path: "/payments", user: u, key: key, body: payment(10, "EUR")})
		if rep.Status != http.StatusCreated || rep.replayed() {
			t.Fatalf("user %q: %d replayed=%v %s, want a first 201", u, rep.Status, rep.replayed(), rep.Body)
		}
		got = append(got, decodeInto[payments.Payment](t, rep))
	}
	for i, u := range []string{"alice", "bob", "anonymous"} {
		if got[i].User != u {
			t.Errorf("payment %d is %+v, want user %q", i, got[i], u)
		}
	}
	if got[0].ID == got[1].ID || got[1].ID == got[2].ID || got[0].ID == got[2].ID {
		t.Errorf("payments share an id: %+v", got)
	}
	again := s.do(req{method: http.MethodPost, path: "/payments", user: "bob", key: key, body: payment(10, "EUR")})
	if !again.replayed() || decodeInto[payments.Payment](t, again) != got[1] {
		t.Errorf("bob's repeat got %d %s, want bob's payment replayed", again.Status, again.Body)
	}
	if ps := s.payments(); !slices.Equal(ps, got) {
		t.Errorf("GET /payments = %+v, want %+v", ps, got)
	}
}

// The bank's answers are lost on every try of the first request: the
// service answers 502, which is not kept. The retry runs the handler again;
// it calls the bank with the same derived key, and the bank replays the
// transfer it made instead of making another.
func testRetriedTransfer(t *testing.T, routes payments.Routes, b backend) {
	lose := &loseReplies{n: client.DefaultMaxAttempts}
	s := start(t, routes, with(b.environ(t), "BANK_DELAY", "5ms"), payments.Options{
		WrapBankTransport: func(rt http.RoundTripper) http.RoundTripper { lose.base = rt; return lose },
	})
	key := newKey()
	q := req{method: http.MethodPost, path: "/transfers", user: "alice", key: key, body: transfer(40, "acct-carol")}

	rep := s.do(q)
	if rep.Status != http.StatusBadGateway {
		t.Fatalf("with every bank answer lost: %d %s, want 502", rep.Status, rep.Body)
	}
	if p := rep.problem(t); p.Code != payments.CodeBankUnavailable {
		t.Errorf("502 code %q, want %q", p.Code, payments.CodeBankUnavailable)
	}
	lost := lose.dropped()
	if len(lost) != client.DefaultMaxAttempts || lost[0].Status != http.StatusCreated || lost[0].replayed() {
		t.Fatalf("lost bank answers %+v, want %d, the first a 201", lost, client.DefaultMaxAttempts)
	}
	for _, l := range lost[1:] {
		if l.Status != http.StatusCreated || !l.replayed() || !bytes.Equal(l.Body, lost[0].Body) {
			t.Errorf("a retried bank call got %d replayed=%v %s, want the first 201 replayed", l.Status, l.replayed(), l.Body)
		}
	}

	rep = s.do(q)
	if rep.Status != http.StatusCreated || rep.replayed() {
		t.Fatalf("the retry got %d replayed=%v %s, want a 201 from a second run", rep.Status, rep.replayed(), rep.Body)
	}
	tr := decodeInto[payments.Transfer](t, rep)
	first := decodeInto[payments.BankTransfer](t, lost[0])
	if tr.BankReference != first.Reference {
		t.Errorf("the transfer has bank reference %q, the bank made %q", tr.BankReference, first.Reference)
	}
	if bt := s.bankTransfers(); len(bt) != 1 || bt[0] != first {
		t.Errorf("the bank made %+v, want exactly %+v", bt, first)
	}
	wantKey := idemkey.Key{Scope: "alice", Value: key}.Derive("bank-transfer")
	sent := lose.requests()
	if len(sent) != client.DefaultMaxAttempts+1 {
		t.Errorf("%d bank calls, want %d", len(sent), client.DefaultMaxAttempts+1)
	}
	for _, r := range sent {
		if r.key != wantKey {
			t.Errorf("a bank call carried key %q, want the derived %q", r.key, wantKey)
		}
	}
	if ts := s.transfers(); len(ts) != 1 || ts[0] != tr {
		t.Errorf("GET /transfers = %+v, want exactly %+v", ts, tr)
	}
	if again := s.do(q); !again.replayed() || !bytes.Equal(again.Body, rep.Body) {
		t.Errorf("a third try got %d %s, want the 201 replayed", again.Status, again.Body)
	}
}

// A transfer's reply is lost on its way to the client; the retry is
// replayed, and the bank was called once.
func testLostTransferReply(t *testing.T, routes payments.Routes, b backend) {
	s := start(t, routes, with(b.environ(t), "BANK_DELAY", "5ms"), payments.Options{})
	lose := &loseReplies{base: s.client.Transport, n: 1}
	c := retrying(t, lose)
	rep := do(t, c, s.Service, req{method: http.MethodPost, path: "/transfers", user: "alice", key: newKey(), body: transfer(7, "acct-dan")})
	lost := lose.dropped()
	if len(lost) != 1 || lost[0].Status != http.StatusCreated {
		t.Fatalf("lost %+v, want one 201", lost)
	}
	if rep.Status != http.StatusCreated || !rep.replayed() || !bytes.Equal(rep.Body, lost[0].Body) {
		t.Fatalf("the retry got %d replayed=%v %s, want the lost 201 replayed", rep.Status, rep.replayed(), rep.Body)
	}
	if bt := s.bankTransfers(); len(bt) != 1 {
		t.Errorf("the bank made %+v, want one transfer", bt)
	}
	if ts := s.transfers(); len(ts) != 1 {
		t.Errorf("GET /transfers = %+v, want one", ts)
	}
}

// A malformed body is 400 invalid_request problem+json, kept: its repeat
// replays the 400, and nothing is made.
func testBadRequest(t *testing.T, routes payments.Routes, b backend) {
	s := start(t, routes, b.environ(t), payments.Options{})
	bodies := []string{
		"",
		"not json",
		"[]",
		`{"currency":"EUR"}`,
		`{"amount":0,"currency":"EUR"}`,
		`{"amount":-5,"currency":"EUR"}`,
		`{"amount":1.5,"currency":"EUR"}`,
		`{"amount":"10","currency":"EUR"}`,
		`{"amount":10}`,
		`{"amount":10,"currency":"eur"}`,
		`{"amount":10,"currency":"EURO"}`,
		`{"amount":10,"currency":"EUR"} {}`,
	}
	for _, body := range bodies {
		key := newKey()
		q := req{method: http.MethodPost, path: "/payments", user: "alice", key: key, body: body}
		rep := s.do(q)
		if rep.Status != http.StatusBadRequest {
			t.Errorf("body %q: %d %s, want 400", body, rep.Status, rep.Body)
			continue
		}
		if p := rep.problem(t); p.Code != payments.CodeInvalidRequest {
			t.Errorf("body %q: code %q, want %q", body, p.Code, payments.CodeInvalidRequest)
		}
		again := s.do(q)
		if again.Status != http.StatusBadRequest || !again.replayed() || !bytes.Equal(again.Body, rep.Body) {
			t.Errorf("body %q: the repeat got %d replayed=%v, want the 400 replayed", body, again.Status, again.replayed())
		}
	}
	for _, body := range []string{`{"amount":10}`, `{"amount":10,"to":""}`, `{"amount":0,"to":"acct-bob"}`} {
		rep := s.do(req{method: http.MethodPost, path: "/transfers", user: "alice", key: newKey(), body: body})
		if rep.Status != http.StatusBadRequest || rep.problem(t).Code != payments.CodeInvalidRequest {
			t.Errorf("transfer %q: %d %s, want 400 %s", body, rep.Status, rep.Body, payments.CodeInvalidRequest)
		}
	}
	if ps := s.payments(); len(ps) != 0 {
		t.Errorf("GET /payments = %+v, want none", ps)
	}
	if bt := s.bankTransfers(); len(bt) != 0 {
		t.Errorf("the bank made %+v, want none", bt)
	}
}

// PUT /profile runs every time without a key, and replays with one.
func testProfile(t *testing.T, routes payments.Routes, b backend) {
	s := start(t, routes, b.environ(t), payments.Options{})
	want := `{"user":"alice","name":"Alice"}` + "\n"
	for i := range 2 {
		rep := s.do(req{method: http.MethodPut, path: "/profile", user: "alice", body: `{"name":"Alice"}`})
		if rep.Status != http.StatusOK || rep.replayed() || string(rep.Body) != want {
			t.Errorf("PUT %d without a key: %d replayed=%v %s, want 200 %s, not replayed", i, rep.Status, rep.replayed(), rep.Body, want)
		}
	}
	key := newKey()
	q := req{method: http.MethodPut, path: "/profile", user: "alice", key: key, body: `{"name":"Alice"}`}
	if rep := s.do(q); rep.Status != http.StatusOK || rep.replayed() {
		t.Errorf("PUT with a key: %d replayed=%v", rep.Status, rep.replayed())
	}
	if rep := s.do(q); rep.Status != http.StatusOK || !rep.replayed() || string(rep.Body) != want {
		t.Errorf("PUT repeated with its key: %d replayed=%v %s, want the 200 replayed", rep.Status, rep.replayed(), rep.Body)
	}
	q.body = `{"name":"Alicia"}`
	if rep := s.do(q); rep.Status != http.StatusUnprocessableEntity {
		t.Errorf("another PUT under the key: %d %s, want 422", rep.Status, rep.Body)
	}
	if rep := s.do(req{method: http.MethodPut, path: "/profile", user: "alice", body: `{"name":""}`}); rep.Status != http.StatusBadRequest {
		t.Errorf("an empty name: %d %s, want 400", rep.Status, rep.Body)
	}
}

// GET /payments/{id} is the payment, or 404 problem+json.
func testGetPayment(t *testing.T, routes payments.Routes, b backend) {
	s := start(t, routes, b.environ(t), payments.Options{})
	created := s.do(req{method: http.MethodPost, path: "/payments", user: "dora", key: newKey(), body: payment(123, "JPY")})
	if created.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", created.Status, created.Body)
	}
	p := decodeInto[payments.Payment](t, created)
	loc := created.Header.Get("Location")
	if loc != "/payments/"+p.ID {
		t.Errorf("Location %q, want /payments/%s", loc, p.ID)
	}
	got := s.do(req{method: http.MethodGet, path: loc})
	if got.Status != http.StatusOK || decodeInto[payments.Payment](t, got) != p {
		t.Errorf("GET %s: %d %s, want %+v", loc, got.Status, got.Body, p)
	}
	missing := s.do(req{method: http.MethodGet, path: "/payments/pay_0000000000000000"})
	if missing.Status != http.StatusNotFound || missing.problem(t).Code != payments.CodeNotFound {
		t.Errorf("GET of an unknown payment: %d %s, want 404 %s", missing.Status, missing.Body, payments.CodeNotFound)
	}
}

// Many tries of one request at once make one payment: one runs, the others
// get 409 or the replay.
func testConcurrent(t *testing.T, routes payments.Routes, b backend) {
	s := start(t, routes, b.environ(t), payments.Options{})
	q := req{method: http.MethodPost, path: "/payments", user: "erin", key: newKey(), body: payment(5, "GBP")}
	burst(t, q, s, s)
	if ps := s.payments(); len(ps) != 1 {
		t.Errorf("GET /payments = %+v, want one payment", ps)
	}
}

// burst sends 32 tries of q at once, spread over the instances, then one
// more after them, and checks that exactly one ran (a 201 not replayed) and
// every other got 409 conflict, 503 unavailable (the store did not answer
// within its budget, as it may not on a loaded machine; the try did not
// run), or a replay of that 201. The last try makes sure the request ran
// even if every try in the burst got 503.
func burst(t *testing.T, q req, instances ...*service) {
	t.Helper()
	const n = 32
	reps := make([]reply, n+1)
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	for i := range n {
		s := instances[i%len(instances)]
		wg.Go(func() { reps[i], errs[i] = try(s.client, s.Service, q) })
	}
	wg.Wait()
	reps[n], errs[n] = try(instances[0].client, instances[0].Service, q)

	var firsts, conflicts, unavailable, replays int
	var body []byte
	for i, rep := range reps {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		switch {
		case rep.Status == http.StatusCreated && !rep.replayed():
			firsts++
			body = rep.Body
		case rep.Status == http.StatusCreated:
			replays++
		case rep.Status == http.StatusConflict && rep.problem(t).Code == idemkey.CodeConflict:
			conflicts++
		case rep.Status == http.StatusServiceUnavailable && rep.problem(t).Code == idemkey.CodeUnavailable:
			unavailable++
		default:
			t.Errorf("a try got %d %s", rep.Status, rep.Body)
		}
	}
	t.Logf("%d tries: %d ran, %d replayed, %d got 409, %d got 503", len(reps), firsts, replays, conflicts, unavailable)
	if firsts != 1 {
		t.Fatalf("%d tries ran the handler, want 1", firsts)
	}
	for _, rep := range reps {
		if rep.replayed() && !bytes.Equal(rep.Body, body) {
			t.Errorf("a replay %s differs from the first %s", rep.Body, body)
		}
	}
}

// Shutting down (SIGTERM) lets a transfer in flight finish.
func testShutdown(t *testing.T, routes payments.Routes, b backend) {
	var hold *holdFirst
	s := start(t, routes, with(b.environ(t), "BANK_DELAY", "5ms"), payments.Options{
		WrapBankTransport: func(rt http.RoundTripper) http.RoundTripper { hold = newHoldFirst(rt); return hold },
	})
	type result struct {
		rep reply
		err error
	}
	first := make(chan result, 1)
	go func() {
		rep, err := try(s.client, s.Service, req{method: http.MethodPost, path: "/transfers", user: "fay", key: newKey(), body: transfer(9, "acct-gus")})
		first <- result{rep, err}
	}()
	select {
	case <-hold.entered:
	case <-time.After(startTimeout):
		t.Fatal("the transfer never reached the bank")
	}
	stopped := make(chan error, 1)
	go func() { stopped <- s.stop() }()

	// Wait until the service stops taking connections: the transfer is
	// still in flight then.
	u, err := url.Parse(s.Service)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(startTimeout); ; time.Sleep(5 * time.Millisecond) {
		conn, err := net.DialTimeout("tcp", u.Host, time.Second)
		if err != nil {
			break
		}
		conn.Close()
		if time.Now().After(deadline) {
			close(hold.release)
			t.Fatal("the service still takes connections after it was told to stop")
		}
	}
	select {
	case err := <-stopped:
		t.Fatalf("the service stopped (%v) with a transfer in flight", err)
	default:
	}
	close(hold.release)
	r := <-first
	if r.err != nil || r.rep.Status != http.StatusCreated {
		t.Errorf("the transfer in flight during shutdown got %d %s, err %v; want 201", r.rep.Status, r.rep.Body, r.err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// GET /healthz is 200 and names the store.
func testHealthz(t *testing.T, routes payments.Routes, b backend) {
	s := start(t, routes, b.environ(t), payments.Options{})
	rep := s.do(req{method: http.MethodGet, path: "/healthz"})
	h := decodeInto[map[string]string](t, rep)
	if rep.Status != http.StatusOK || h["status"] != "ok" || h["store"] != b.name {
		t.Errorf("GET /healthz: %d %s, want 200 ok store %s", rep.Status, rep.Body, b.name)
	}
}

// Unknown routes, wrong methods and bad credentials are problem+json too.
func testRouteErrors(t *testing.T, routes payments.Routes, b backend) {
	s := start(t, routes, b.environ(t), payments.Options{})
	rep := s.do(req{method: http.MethodGet, path: "/nowhere", requestID: "req-404"})
	if rep.Status != http.StatusNotFound || rep.problem(t).Code != payments.CodeNotFound {
		t.Errorf("GET /nowhere: %d %s, want 404 %s", rep.Status, rep.Body, payments.CodeNotFound)
	}
	if id := rep.Header.Get(idemkey.HeaderRequestID); id != "req-404" {
		t.Errorf("X-Request-Id %q, want the request's own", id)
	}
	rep = s.do(req{method: http.MethodDelete, path: "/payments", key: newKey()})
	if rep.Status != http.StatusMethodNotAllowed || rep.problem(t).Code != payments.CodeMethodNotAllowed {
		t.Errorf("DELETE /payments: %d %s, want 405 %s", rep.Status, rep.Body, payments.CodeMethodNotAllowed)
	}
	if allow := rep.Header.Get("Allow"); !strings.Contains(allow, "GET") || !strings.Contains(allow, "POST") {
		t.Errorf("405 Allow %q, want GET and POST", allow)
	}
	for _, auth := range []string{"Basic YWxpY2U6c2VjcmV0", "Bearer ", "Bearer anonymous", "Bearer al ice"} {
		r, err := http.NewRequest(http.MethodGet, s.Service+"/payments", nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("Authorization", auth)
		resp, err := s.client.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("Authorization %q: %d, want 401 with WWW-Authenticate", auth, resp.StatusCode)
		}
	}
	if ps := s.payments(); len(ps) != 0 {
		t.Errorf("GET /payments = %+v, want none", ps)
	}
}

// Two instances on one Redis: a request made on one is replayed by the
// other, and tries spread over both run once in all.
func testTwoInstances(t *testing.T, routes payments.Routes, b backend) {
	env := b.environ(t)
	a := start(t, routes, env, payments.Options{})
	c := start(t, routes, env, payments.Options{})
	q := req{method: http.MethodPost, path: "/payments", user: "hal", key: newKey(), body: payment(50, "CHF")}
	first := a.do(q)
	if first.Status != http.StatusCreated || first.replayed() {
		t.Fatalf("instance A: %d %s", first.Status, first.Body)
	}
	second := c.do(q)
	if second.Status != http.StatusCreated || !second.replayed() || !bytes.Equal(second.Body, first.Body) {
		t.Fatalf("instance B: %d replayed=%v %s, want A's 201 replayed", second.Status, second.replayed(), second.Body)
	}
	pa, pc := a.payments(), c.payments()
	switch {
	case b.shared && (len(pa) != 1 || !slices.Equal(pa, pc)):
		t.Errorf("payments: A %+v, B %+v; want the one payment in the database, on both", pa, pc)
	case !b.shared && (len(pa) != 1 || len(pc) != 0):
		t.Errorf("payments: A %+v, B %+v; want one on A, none on B", pa, pc)
	}

	q = req{method: http.MethodPost, path: "/payments", user: "hal", key: newKey(), body: payment(60, "CHF")}
	burst(t, q, a, c)
	total := len(a.payments()) + len(c.payments())
	if b.shared {
		total = len(a.payments())
	}
	if total != 2 {
		t.Errorf("the two instances made %d payments in all, want 2", total)
	}
}

// With Redis gone, /healthz is 503 and a keyed POST is 503 unavailable
// without running.
func testStoreDown(t *testing.T, routes payments.Routes) {
	srv := redistest.StartServer(t)
	s := start(t, routes, map[string]string{"REDIS_URL": "redis://" + srv.Addr + "/0"}, payments.Options{})
	if rep := s.do(req{method: http.MethodGet, path: "/healthz"}); rep.Status != http.StatusOK {
		t.Fatalf("GET /healthz with Redis up: %d %s", rep.Status, rep.Body)
	}
	srv.Kill()
	rep := s.do(req{method: http.MethodGet, path: "/healthz"})
	if rep.Status != http.StatusServiceUnavailable || rep.problem(t).Code != payments.CodeUnavailable {
		t.Errorf("GET /healthz with Redis down: %d %s, want 503 %s", rep.Status, rep.Body, payments.CodeUnavailable)
	}
	rep = s.do(req{method: http.MethodPost, path: "/payments", user: "ivy", key: newKey(), body: payment(1, "EUR")})
	if rep.Status != http.StatusServiceUnavailable || rep.problem(t).Code != idemkey.CodeUnavailable || rep.Header.Get("Retry-After") == "" {
		t.Errorf("POST with Redis down: %d %s, want 503 %s with Retry-After", rep.Status, rep.Body, idemkey.CodeUnavailable)
	}
	if ps := s.payments(); len(ps) != 0 {
		t.Errorf("GET /payments = %+v, want none", ps)
	}
}

// GET /metrics counts the idempotency decisions, and GET /openapi.json
// describes exactly the covered operations.
func testMetricsAndOpenAPI(t *testing.T, routes payments.Routes, b backend) {
	s := start(t, routes, b.environ(t), payments.Options{})
	pay := req{method: http.MethodPost, path: "/payments", user: "alice", key: newKey(), body: `{"amount":10,"currency":"EUR"}`}
	s.do(pay)
	s.do(pay)
	s.do(req{method: http.MethodPost, path: "/payments", user: "alice", body: `{"amount":10,"currency":"EUR"}`})

	rep := s.do(req{method: http.MethodGet, path: "/metrics"})
	for _, event := range []string{"first_attempt", "kept", "replay", "key_missing"} {
		want := regexp.MustCompile(`idemkey_events_total\{event="` + event + `",route="[^"]*/payments"\} 1\n`)
		if rep.Status != http.StatusOK || !want.MatchString(string(rep.Body)) {
			t.Errorf("GET /metrics: %d, no %s count of 1 for /payments in:\n%s", rep.Status, event, rep.Body)
		}
	}

	rep = s.do(req{method: http.MethodGet, path: "/openapi.json"})
	type parameter struct {
		Ref      string `json:"$ref"`
		Name     string `json:"name"`
		In       string `json:"in"`
		Required bool   `json:"required"`
	}
	var doc struct {
		OpenAPI string `json:"openapi"`
		Paths   map[string]map[string]struct {
			Parameters []parameter `json:"parameters"`
		} `json:"paths"`
		Components struct {
			Parameters map[string]parameter `json:"parameters"`
		} `json:"components"`
	}
	if err := json.Unmarshal(rep.Body, &doc); err != nil || rep.Status != http.StatusOK {
		t.Fatalf("GET /openapi.json: %d %v", rep.Status, err)
	}
	got := map[string]bool{}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			for _, p := range op.Parameters {
				if name, ok := strings.CutPrefix(p.Ref, "#/components/parameters/"); ok {
					p = doc.Components.Parameters[name]
				}
				if p.In == "header" && p.Name == "Idempotency-Key" {
					got[method+" "+path] = p.Required
				}
			}
		}
	}
	want := map[string]bool{"post /payments": true, "post /transfers": true, "put /profile": false}
	if !strings.HasPrefix(doc.OpenAPI, "3.1") || !maps.Equal(got, want) {
		t.Errorf("OpenAPI %q covers %v, want %v", doc.OpenAPI, got, want)
	}
}
