// Package paymentstest is the end-to-end suite of the example payment
// service: it starts the service in-process on a free loopback port, with the
// in-memory store and against real Redis, and drives it over HTTP the way a
// client would. Both example commands run it with their own routing.
package paymentstest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/examples/internal/payments"
)

// startTimeout bounds how long the service may take to start or stop.
const startTimeout = 15 * time.Second

// service is one running instance of the payment service.
type service struct {
	t *testing.T
	payments.Addrs
	client *http.Client

	stopOnce sync.Once
	cancel   context.CancelFunc
	done     chan error
	err      error
}

// start runs the service with env (ADDR is set to a free port) and opts
// until the test ends, and fails the test if it does not start, or does not
// stop cleanly.
func start(t *testing.T, routes payments.Routes, env map[string]string, opts payments.Options) *service {
	t.Helper()
	env = maps.Clone(env)
	if env == nil {
		env = map[string]string{}
	}
	env["ADDR"] = "127.0.0.1:0"
	ready := make(chan payments.Addrs, 1)
	opts.Ready = func(a payments.Addrs) { ready <- a }
	out := &testOutput{w: t.Output()}
	// Registered before the service's stop, so that it runs after it:
	// what is logged once the test is over (a background release the
	// middleware started for a lost reply, go-redis's process-wide
	// logger, which the last service started points at its own) is
	// dropped, not written to a test that has ended.
	t.Cleanup(out.end)
	logger := slog.New(slog.NewTextHandler(out, nil))

	ctx, cancel := context.WithCancel(context.Background())
	s := &service{t: t, cancel: cancel, done: make(chan error, 1),
		client: &http.Client{Transport: &http.Transport{}, Timeout: startTimeout}}
	go func() {
		s.done <- payments.Run(ctx, func(k string) string { return env[k] }, logger, routes, opts)
	}()
	select {
	case s.Addrs = <-ready:
	case err := <-s.done:
		cancel()
		t.Fatalf("the service did not start: %v", err)
	case <-time.After(startTimeout):
		cancel()
		t.Fatal("the service did not start in time")
	}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Errorf("the service did not stop cleanly: %v", err)
		}
	})
	return s
}

// stop shuts the service down as SIGTERM does and returns what Run
// returned.
func (s *service) stop() error {
	s.stopOnce.Do(func() {
		// Connections the client dialled but never used count as busy for
		// five seconds on the server's side (http.Server.Shutdown): close
		// them first, so that the shutdown waits only for requests.
		s.client.CloseIdleConnections()
		s.cancel()
		select {
		case s.err = <-s.done:
		case <-time.After(startTimeout):
			buf := make([]byte, 1<<20)
			s.t.Errorf("the service did not stop in time\n%s", buf[:runtime.Stack(buf, true)])
		}
	})
	return s.err
}

// reply is a response, read in full.
type reply struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r reply) replayed() bool { return r.Header.Get(idemkey.HeaderReplayed) == "true" }

// problem decodes a problem+json reply, failing the test when it is not
// one or its status field disagrees with the response's.
func (r reply) problem(t *testing.T) idemkey.Problem {
	t.Helper()
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json; body %s", ct, r.Body)
	}
	var p idemkey.Problem
	if err := json.Unmarshal(r.Body, &p); err != nil {
		t.Fatalf("problem body %s: %v", r.Body, err)
	}
	if p.Status != r.Status || p.Code == "" || p.Type == "" || p.Title == "" || p.Detail == "" {
		t.Fatalf("incomplete problem %+v for status %d", p, r.Status)
	}
	return p
}

// req is one request to the service.
type req struct {
	method, path string
	user         string // "Authorization: Bearer <user>" unless empty
	key          string // Idempotency-Key unless empty
	body         string
	contentType  string // the body's Content-Type: application/json unless set ("-": none)
	requestID    string // X-Request-Id unless empty
	ctx          context.Context
}

func (s *service) do(q req) reply {
	s.t.Helper()
	return do(s.t, s.client, s.Service, q)
}

// doAgainOn503 is do, sent again while the answer is 503 unavailable, up
// to ten times: on a loaded machine a store call can miss its budget, and
// such a 503 says nothing ran, so a client sends the request again. For
// the answers that hold while a first request is in flight (409, 422).
func (s *service) doAgainOn503(q req) reply {
	s.t.Helper()
	rep := s.do(q)
	for range 9 {
		if rep.Status != http.StatusServiceUnavailable || rep.problem(s.t).Code != idemkey.CodeUnavailable {
			break
		}
		time.Sleep(50 * time.Millisecond)
		rep = s.do(q)
	}
	return rep
}

// do sends q to base and reads the reply, failing the test on a
// transport error. It must run on the test's goroutine.
func do(t *testing.T, c *http.Client, base string, q req) reply {
	t.Helper()
	rep, err := try(c, base, q)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// try is do for other goroutines: it returns the error.
func try(c *http.Client, base string, q req) (reply, error) {
	var body io.Reader
	if q.body != "" {
		body = strings.NewReader(q.body)
	}
	ctx := q.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	r, err := http.NewRequestWithContext(ctx, q.method, base+q.path, body)
	if err != nil {
		return reply{}, err
	}
	switch {
	case q.contentType == "-":
	case q.contentType != "":
		r.Header.Set("Content-Type", q.contentType)
	case q.body != "":
		r.Header.Set("Content-Type", "application/json")
	}
	if q.user != "" {
		r.Header.Set("Authorization", "Bearer "+q.user)
	}
	if q.key != "" {
		r.Header.Set("Idempotency-Key", q.key)
	}
	if q.requestID != "" {
		r.Header.Set(idemkey.HeaderRequestID, q.requestID)
	}
	resp, err := c.Do(r)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: %w", q.method, q.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: reading the body: %w", q.method, q.path, err)
	}
	return reply{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// getJSON GETs url and decodes its 200 JSON answer into v.
func getJSON(t *testing.T, c *http.Client, url string, v any) {
	t.Helper()
	rep := do(t, c, url, req{method: http.MethodGet})
	if rep.Status != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, rep.Status, rep.Body)
	}
	if err := json.Unmarshal(rep.Body, v); err != nil {
		t.Fatalf("GET %s: %s: %v", url, rep.Body, err)
	}
}

// payments returns GET /payments: every payment the instance made.
func (s *service) payments() []payments.Payment {
	s.t.Helper()
	var ps []payments.Payment
	getJSON(s.t, s.client, s.Service+"/payments", &ps)
	return ps
}

// transfers returns GET /transfers: every transfer the instance made.
func (s *service) transfers() []payments.Transfer {
	s.t.Helper()
	var ts []payments.Transfer
	getJSON(s.t, s.client, s.Service+"/transfers", &ts)
	return ts
}

// bankTransfers returns every transfer the instance's bank made.
func (s *service) bankTransfers() []payments.BankTransfer {
	s.t.Helper()
	var ts []payments.BankTransfer
	getJSON(s.t, s.client, s.Bank+"/transfers", &ts)
	return ts
}

// newKey returns a fresh idempotency key, unique across runs, so that tests
// sharing one Redis never meet each other's keys.
func newKey() string { return "k-" + rand.Text() }

// payment is a POST /payments body.
func payment(amount int, currency string) string {
	return `{"amount":` + strconv.Itoa(amount) + `,"currency":"` + currency + `"}`
}

// transfer is a POST /transfers body.
func transfer(amount int, to string) string {
	return `{"amount":` + strconv.Itoa(amount) + `,"to":"` + to + `"}`
}

// decodeInto decodes a reply's JSON body into v.
func decodeInto[T any](t *testing.T, r reply) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.Body, &v); err != nil {
		t.Fatalf("body %s: %v", r.Body, err)
	}
	return v
}

// testOutput writes to a test's output until the test ends, and drops
// what comes after: testing panics on a write to a test that has ended,
// and goroutines a service started may outlive it.
type testOutput struct {
	mu    sync.Mutex
	w     io.Writer
	ended bool
}

func (o *testOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ended {
		return len(p), nil
	}
	return o.w.Write(p)
}

func (o *testOutput) end() {
	o.mu.Lock()
	o.ended = true
	o.mu.Unlock()
}
