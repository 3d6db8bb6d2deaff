package middleware_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
)

func TestNewValidatesOptions(t *testing.T) {
	f := newFixture(t)
	bad := []middleware.Option{
		middleware.WithHeader(""),
		middleware.WithMethods(http.MethodGet),
		middleware.WithMethods(),
		middleware.WithDeadline(0),
		middleware.WithRetention(-time.Second),
		middleware.WithMaxRequestBody(0),
		middleware.WithMaxResponseBody(-1),
		middleware.WithStoreTimeout(-1),
		middleware.WithWait(-1),
		middleware.WithKeep(nil),
		middleware.WithKeepHeader(nil),
		middleware.WithScope(nil),
		middleware.WithFingerprint(nil),
		middleware.WithErrorWriter(nil),
		nil,
	}
	for i, o := range bad {
		if _, err := middleware.New(f.store, o); err == nil || !strings.HasPrefix(err.Error(), "idemkey: ") {
			t.Errorf("option %d: err %v", i, err)
		}
	}
	if _, err := middleware.New(nil); err == nil {
		t.Error("nil store accepted")
	}
}

func TestDefaults(t *testing.T) {
	f := newFixture(t)
	if f.mw.HeaderName() != "Idempotency-Key" {
		t.Errorf("header %q", f.mw.HeaderName())
	}
	for _, m := range []string{"POST", "PUT", "PATCH", "DELETE"} {
		if !f.mw.Covers(m) {
			t.Errorf("%s not covered", m)
		}
	}
	if f.mw.Covers("GET") {
		t.Error("GET covered")
	}
	rt, ok := f.mw.RouteOf(f.mw.Handler(http.NotFoundHandler()))
	if !ok || rt.Required || rt.Deadline != 30*time.Second {
		t.Errorf("default route %+v %v", rt, ok)
	}
	rt, _ = f.mw.RouteOf(f.mw.Required(middleware.Deadline(time.Minute))(http.NotFoundHandler()))
	if !rt.Required || rt.Deadline != time.Minute {
		t.Errorf("required route %+v", rt)
	}
	// The claim lives the route deadline plus the margin.
	var ttl time.Duration
	probe := &ttlProbe{countingStore: f.store, ttl: &ttl}
	mw, _ := middleware.New(probe)
	serve(mw.Required(middleware.Deadline(3*time.Second))(&counter{}), post("k", `{}`))
	if ttl != 3*time.Second+middleware.ClaimMargin {
		t.Errorf("claim TTL %v", ttl)
	}
	// Retention defaults to 24 hours, the request and response limits to 1 MiB.
	if probe.retention != 24*time.Hour {
		t.Errorf("retention %v", probe.retention)
	}
	big := strings.Repeat("a", 1<<20)
	w := serve(mw.Required()(&counter{}), post("k2", `"`+big[2:]+`"`))
	if w.Code != http.StatusCreated {
		t.Errorf("1 MiB body: %d", w.Code)
	}
	w = serve(mw.Required()(&counter{}), post("k3", big+"a"))
	if w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("1 MiB + 1 body: %d", w.Code)
	}
}

type ttlProbe struct {
	*countingStore
	ttl       *time.Duration
	retention time.Duration
}

func (p *ttlProbe) Claim(ctx context.Context, key string, c store.Claim) (store.Result, error) {
	*p.ttl = c.TTL
	return p.countingStore.Claim(ctx, key, c)
}

func (p *ttlProbe) Complete(ctx context.Context, key, token string, rec *store.Record, retention time.Duration) error {
	p.retention = retention
	return p.countingStore.Complete(ctx, key, token, rec, retention)
}

func TestCustomErrorWriter(t *testing.T) {
	var got idemkey.Problem
	f := newFixture(t, middleware.WithErrorWriter(func(w http.ResponseWriter, r *http.Request, p idemkey.Problem) {
		got = p
		w.WriteHeader(p.Status)
	}))
	w := serve(f.mw.Required()(&counter{}), post("", `{}`))
	if w.Code != 400 || got.Code != idemkey.CodeKeyMissing {
		t.Fatalf("%d %+v", w.Code, got)
	}
}

func TestProblemsTable(t *testing.T) {
	want := map[string]int{
		"idempotency_key_missing": 400, "idempotency_key_invalid": 400, "request_too_large": 413,
		"request_body_unreadable": 400, "idempotency_key_reused": 422, "conflict": 409, "unavailable": 503,
		"scope_missing": 500, "route_invalid": 500,
	}
	for code, status := range want {
		if p, ok := middleware.ProblemFor(code); !ok || p.Status != status || p.Code != code {
			t.Errorf("%s: %+v", code, p)
		}
	}
	if codes := middleware.ProblemCodes(); len(codes) != len(want) {
		t.Errorf("ProblemCodes() = %v, want the %d codes of the table", codes, len(want))
	}
	// The table cannot be changed from outside: a copy comes back.
	p, _ := middleware.ProblemFor(idemkey.CodeConflict)
	p.Status = 200
	if q, _ := middleware.ProblemFor(idemkey.CodeConflict); q.Status != http.StatusConflict {
		t.Errorf("ProblemFor handed out the table's own value: status %d", q.Status)
	}
}
