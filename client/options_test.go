package client

import (
	"context"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestNewAppliesDefaults(t *testing.T) {
	tr, err := New()
	if err != nil {
		t.Fatal(err)
	}
	if tr.base != http.DefaultTransport {
		t.Errorf("base = %v, want http.DefaultTransport", tr.base)
	}
	if tr.header != "Idempotency-Key" {
		t.Errorf("header = %q, want Idempotency-Key", tr.header)
	}
	if tr.maxAttempts != 4 {
		t.Errorf("maxAttempts = %d, want 4", tr.maxAttempts)
	}
	if tr.backoffBase != 100*time.Millisecond || tr.backoffCap != 5*time.Second {
		t.Errorf("backoff = %v..%v, want 100ms..5s", tr.backoffBase, tr.backoffCap)
	}
	if tr.retryAfterLimit != time.Minute {
		t.Errorf("retryAfterLimit = %v, want 1m", tr.retryAfterLimit)
	}
	if tr.inFlightWait != time.Minute {
		t.Errorf("inFlightWait = %v, want 1m", tr.inFlightWait)
	}
	if tr.bodyLimit != 1<<20 {
		t.Errorf("bodyLimit = %d, want 1 MiB", tr.bodyLimit)
	}
	if !tr.autoKey {
		t.Error("automatic keys are off by default, want on")
	}
	if reflect.ValueOf(tr.policy).Pointer() != reflect.ValueOf(DefaultRetryPolicy).Pointer() {
		t.Error("policy is not DefaultRetryPolicy")
	}
	k1, k2 := tr.newKey(), tr.newKey()
	if u, err := uuid.Parse(k1); err != nil || u.Version() != 4 {
		t.Errorf("generated key %q is not a version 4 UUID (%v)", k1, err)
	}
	if k1 == k2 {
		t.Errorf("two generated keys are equal: %q", k1)
	}
}

func TestOptionsAreApplied(t *testing.T) {
	base := rtFunc(func(*http.Request) (*http.Response, error) { return nil, nil })
	gen := func() string { return "k" }
	policy := func(Attempt) bool { return true }
	tr, err := New(WithBase(base), WithHeader("x-idempotency-key"), WithMaxAttempts(7),
		WithBackoff(time.Second, time.Minute), WithRetryAfterLimit(0), WithKeyGenerator(gen),
		WithInFlightWait(0), WithoutAutoKey(), WithRetryPolicy(policy), WithMaxRequestBody(0))
	if err != nil {
		t.Fatal(err)
	}
	if tr.header != "X-Idempotency-Key" || tr.maxAttempts != 7 || tr.backoffBase != time.Second ||
		tr.backoffCap != time.Minute || tr.retryAfterLimit != 0 || tr.inFlightWait != 0 || tr.autoKey || tr.bodyLimit != 0 ||
		tr.newKey() != "k" || !tr.policy(Attempt{}) {
		t.Errorf("options not applied: %+v", tr.config)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	for name, opt := range map[string]Option{
		"nil base":              WithBase(nil),
		"empty header":          WithHeader(""),
		"header with space":     WithHeader("Idempotency Key"),
		"header with colon":     WithHeader("Idempotency-Key:"),
		"header non-ASCII":      WithHeader("Idempotency-Kéy"),
		"zero attempts":         WithMaxAttempts(0),
		"negative attempts":     WithMaxAttempts(-1),
		"zero base":             WithBackoff(0, time.Second),
		"cap below base":        WithBackoff(time.Second, time.Millisecond),
		"negative retry limit":  WithRetryAfterLimit(-time.Second),
		"negative in-flight":    WithInFlightWait(-time.Second),
		"nil key generator":     WithKeyGenerator(nil),
		"nil policy":            WithRetryPolicy(nil),
		"negative buffer limit": WithMaxRequestBody(-1),
	} {
		t.Run(name, func(t *testing.T) {
			tr, err := New(opt)
			if err == nil || tr != nil {
				t.Fatalf("New = %v, %v; want nil and an error", tr, err)
			}
			if !strings.HasPrefix(err.Error(), "idemkey: client: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
}

func TestZeroTransportFails(t *testing.T) {
	body := newTracked("x")
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://127.0.0.1:1/", body)
	resp, err := new(Transport).RoundTrip(req)
	if err == nil || resp != nil {
		t.Fatalf("RoundTrip on a zero Transport = %v, %v; want an error", resp, err)
	}
	if !body.Closed() {
		t.Error("request body not closed")
	}
}

func TestCloseIdleConnectionsReachesTheBase(t *testing.T) {
	var closed bool
	base := &idleCloser{closed: &closed}
	tr, err := New(WithBase(base))
	if err != nil {
		t.Fatal(err)
	}
	(&http.Client{Transport: tr}).CloseIdleConnections()
	if !closed {
		t.Error("the base's CloseIdleConnections was not called")
	}
}

type idleCloser struct{ closed *bool }

func (c *idleCloser) RoundTrip(*http.Request) (*http.Response, error) { return nil, nil }
func (c *idleCloser) CloseIdleConnections()                           { *c.closed = true }

func TestNilOptionIsAnError(t *testing.T) {
	tr, err := New(WithMaxAttempts(2), nil)
	if err == nil || tr != nil {
		t.Fatalf("New with a nil option = %v, %v; want nil and an error", tr, err)
	}
	if !strings.HasPrefix(err.Error(), "idemkey: client: ") || !strings.Contains(err.Error(), "option 2 is nil") {
		t.Errorf("error %q does not name the nil option under the package prefix", err)
	}
}

func TestEveryInvalidOptionIsReported(t *testing.T) {
	_, err := New(WithMaxAttempts(0), WithMaxRequestBody(-1))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"WithMaxAttempts", "WithMaxRequestBody"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not report %s", err, want)
		}
	}
	if strings.Count(err.Error(), "idemkey: client: idemkey: client:") != 0 {
		t.Errorf("error %q repeats the prefix", err)
	}
}
