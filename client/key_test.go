package client

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/outkey"
)

// keySent sends one request through a Transport built with opts and returns
// the key header the base saw ("" for none) and how many values it had.
func keySent(t *testing.T, req *http.Request, opts ...Option) (string, int) {
	t.Helper()
	var got []string
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		got = r.Header.Values("Idempotency-Key")
		return response(r, http.StatusOK, http.NoBody), nil
	})
	tr, _ := newTest(t, append([]Option{WithBase(base), WithKeyGenerator(func() string { return "generated" })}, opts...)...)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	resp.Body.Close()
	if len(got) == 0 {
		return "", 0
	}
	return got[0], len(got)
}

func TestKeyChoice(t *testing.T) {
	incoming := idemkey.Key{Scope: "user-1", Value: "in-1"}
	const url = "http://API.example.com:8080/v1/charges?x=1"
	type ctxFn func(context.Context) context.Context
	withIn := func(ctx context.Context) context.Context { return idemkey.NewContext(ctx, incoming) }
	withKey := func(ctx context.Context) context.Context { return WithKey(ctx, "given") }
	withName := func(ctx context.Context) context.Context { return WithCallName(ctx, "charge") }
	all := func(fs ...ctxFn) ctxFn {
		return func(ctx context.Context) context.Context {
			for _, f := range fs {
				ctx = f(ctx)
			}
			return ctx
		}
	}
	for _, c := range []struct {
		name   string
		method string
		header string
		ctx    ctxFn
		opts   []Option
		want   string
	}{
		{"header wins over everything", "POST", "explicit", all(withIn, withName, withKey), nil, "explicit"},
		{"header on a GET", "GET", "explicit", nil, nil, "explicit"},
		{"WithKey wins over the incoming key", "POST", "", all(withIn, withName, withKey), nil, "given"},
		{"WithKey on a GET", "GET", "", withKey, nil, "given"},
		{"call name under an incoming key", "PUT", "", all(withIn, withName), nil, incoming.Derive("charge")},
		{"call name on a GET", "GET", "", all(withIn, withName), nil, incoming.Derive("charge")},
		{"incoming key, no name: endpoint", "POST", "", withIn, nil, incoming.Derive("POST api.example.com:8080/v1/charges")},
		{"incoming key, no name, DELETE", "DELETE", "", withIn, nil, incoming.Derive("DELETE api.example.com:8080/v1/charges")},
		{"incoming key, no name, GET: none", "GET", "", withIn, nil, ""},
		{"call name without an incoming key: generated", "POST", "", withName, nil, "generated"},
		{"plain POST: generated", "POST", "", nil, nil, "generated"},
		{"plain PATCH: generated", "PATCH", "", nil, nil, "generated"},
		{"plain GET: none", "GET", "", nil, nil, ""},
		{"plain HEAD: none", "HEAD", "", nil, nil, ""},
		{"other method: none", "PROPFIND", "", nil, nil, ""},
		{"no auto key: plain POST none", "POST", "", nil, []Option{WithoutAutoKey()}, ""},
		{"no auto key: endpoint derivation off", "POST", "", withIn, []Option{WithoutAutoKey()}, ""},
		{"no auto key: call name still derives", "POST", "", all(withIn, withName), []Option{WithoutAutoKey()}, incoming.Derive("charge")},
		{"no auto key: WithKey still sent", "POST", "", withKey, []Option{WithoutAutoKey()}, "given"},
		{"empty WithKey is none", "POST", "", func(ctx context.Context) context.Context { return WithKey(ctx, "") }, nil, "generated"},
		{"empty call name is none", "POST", "", all(withIn, func(ctx context.Context) context.Context { return WithCallName(ctx, "") }), nil, incoming.Derive("POST api.example.com:8080/v1/charges")},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			if c.ctx != nil {
				ctx = c.ctx(ctx)
			}
			req, err := http.NewRequestWithContext(ctx, c.method, url, nil)
			if err != nil {
				t.Fatal(err)
			}
			if c.header != "" {
				req.Header.Set("Idempotency-Key", c.header)
			}
			got, n := keySent(t, req, c.opts...)
			if got != c.want {
				t.Errorf("key sent = %q, want %q", got, c.want)
			}
			if c.want != "" && n != 1 {
				t.Errorf("key header sent %d times, want once", n)
			}
		})
	}
}

func TestEndpointNamesDiffer(t *testing.T) {
	in := idemkey.Key{Scope: "s", Value: "v"}
	keys := map[string]string{}
	for _, u := range []string{
		"http://a.example/x", "http://b.example/x", "http://a.example/y",
		"http://a.example:81/x", "http://a.example/x%2Fy", "http://a.example/x/y",
	} {
		req, _ := http.NewRequestWithContext(idemkey.NewContext(context.Background(), in), "POST", u, nil)
		k, _ := keySent(t, req)
		if prev, ok := keys[k]; ok {
			t.Errorf("%s and %s share key %s", prev, u, k)
		}
		keys[k] = u
	}
	// The query and the host's case do not make a different endpoint.
	a, _ := http.NewRequestWithContext(idemkey.NewContext(context.Background(), in), "POST", "http://A.example/x?p=1", nil)
	b, _ := http.NewRequestWithContext(idemkey.NewContext(context.Background(), in), "POST", "http://a.example/x?p=2", nil)
	ka, _ := keySent(t, a)
	kb, _ := keySent(t, b)
	if ka != kb {
		t.Errorf("same endpoint, different keys: %q, %q", ka, kb)
	}
}

func TestCustomHeaderName(t *testing.T) {
	var got http.Header
	base := rtFunc(func(r *http.Request) (*http.Response, error) {
		got = r.Header.Clone()
		return response(r, http.StatusOK, http.NoBody), nil
	})
	tr, _ := newTest(t, WithBase(base), WithHeader("x-idempotency-key"), WithKeyGenerator(func() string { return "g" }))
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/", nil)
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if got.Get("X-Idempotency-Key") != "g" || got.Get("Idempotency-Key") != "" {
		t.Errorf("headers sent = %v, want only X-Idempotency-Key: g", got)
	}
	// The caller's own header is recognised under the configured name.
	req.Header.Set("X-Idempotency-Key", "mine")
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if got.Get("X-Idempotency-Key") != "mine" {
		t.Errorf("key sent = %q, want the caller's", got.Get("X-Idempotency-Key"))
	}
}

func TestRequestIsNotModified(t *testing.T) {
	tr, _ := newTest(t, WithBase(rtFunc(func(r *http.Request) (*http.Response, error) {
		return response(r, http.StatusServiceUnavailable, http.NoBody), nil
	})))
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/", strings.NewReader("body"))
	req.Header.Set("Content-Type", "text/plain")
	before := req.Header.Clone()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(req.Header) != len(before) || req.Header.Get("Idempotency-Key") != "" {
		t.Errorf("the caller's request headers changed: %v", req.Header)
	}
}

func TestInvalidKeysFailBeforeSending(t *testing.T) {
	for name, c := range map[string]struct {
		ctx  context.Context
		opts []Option
	}{
		"WithKey with a newline":    {WithKey(context.Background(), "a\nb"), nil},
		"WithKey too long":          {WithKey(context.Background(), strings.Repeat("k", 256)), nil},
		"WithKey non-ASCII":         {WithKey(context.Background(), "clé"), nil},
		"generator returns empty":   {context.Background(), []Option{WithKeyGenerator(func() string { return "" })}},
		"generator returns control": {context.Background(), []Option{WithKeyGenerator(func() string { return "k\x00" })}},
	} {
		t.Run(name, func(t *testing.T) {
			sent := 0
			tr, _ := newTest(t, append(c.opts, WithBase(rtFunc(func(r *http.Request) (*http.Response, error) {
				sent++
				return response(r, http.StatusOK, http.NoBody), nil
			})))...)
			body := newTracked("x")
			req, _ := http.NewRequestWithContext(c.ctx, http.MethodPost, "http://127.0.0.1:1/", body)
			resp, err := tr.RoundTrip(req)
			if !errors.Is(err, idemkey.ErrKeyInvalid) || resp != nil {
				t.Fatalf("RoundTrip = %v, %v; want idemkey.ErrKeyInvalid", resp, err)
			}
			if sent != 0 {
				t.Errorf("%d attempts sent, want none", sent)
			}
			if !body.Closed() {
				t.Error("request body not closed")
			}
		})
	}
}

// TestKeysOutsideTheBareFormAreSentQuoted: a key with a comma, a double
// quote or a space at either end is sent as a structured-field string,
// which the server reads back as the same key; any other key, a backslash
// included, is sent bare.
func TestKeysOutsideTheBareFormAreSentQuoted(t *testing.T) {
	for _, c := range []struct{ key, header string }{
		{"a,b", `"a,b"`},
		{`"k"`, `"\"k\""`},
		{" k", `" k"`},
		{"k ", `"k "`},
		{`a\b`, `a\b`},
		{`a\"b`, `"a\\\"b"`},
		{"a b", "a b"},
		{"order-9", "order-9"},
		{strings.Repeat("k", 255), strings.Repeat("k", 255)},
	} {
		req, _ := http.NewRequestWithContext(WithKey(context.Background(), c.key), http.MethodPost, "http://127.0.0.1:1/", nil)
		got, n := keySent(t, req)
		if got != c.header || n != 1 {
			t.Errorf("key %q sent as %q (%d headers), want %q once", c.key, got, n, c.header)
			continue
		}
		if back, err := idemkey.ParseKey([]string{got}); err != nil || back != c.key {
			t.Errorf("header %q reads back as %q, %v; want %q", got, back, err, c.key)
		}
	}
}

// TestTraceReportsTheCallersKeyUnquoted: a key header the caller set is
// sent as it is; the trace reports the key it carries.
func TestTraceReportsTheCallersKeyUnquoted(t *testing.T) {
	for header, want := range map[string]string{`"a,b"`: "a,b", "plain": "plain", ` "sp" `: "sp"} {
		var tr Trace
		req, _ := http.NewRequestWithContext(WithTrace(context.Background(), &tr), http.MethodPost, "http://127.0.0.1:1/", nil)
		req.Header.Set("Idempotency-Key", header)
		if got, _ := keySent(t, req); got != header {
			t.Errorf("caller's header %q sent as %q", header, got)
		}
		if tr.Key != want {
			t.Errorf("caller's header %q: trace key %q, want %q", header, tr.Key, want)
		}
	}
}

// TestRedirectKeepsTheKey: http.Client follows a 307 or 308 with the same
// method and body: the same logical request, which must keep its key (it
// used to get a fresh one, so the new URL ran it as a new request). A 303
// turns it into a GET, which gets none.
func TestRedirectKeepsTheKey(t *testing.T) {
	for _, code := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect, http.StatusSeeOther} {
		s, srv := newScript(t, step{status: code, header: map[string]string{"Location": "/next"}}, step{status: http.StatusCreated})
		tr, _ := newTest(t, WithBase(noKeepAlive(t)))
		c := &http.Client{Transport: tr}
		for name, ctx := range map[string]context.Context{
			"generated": context.Background(),
			"derived":   idemkey.NewContext(context.Background(), idemkey.Key{Scope: "alice", Value: "in-1"}),
		} {
			s.mu.Lock()
			s.reqs = nil
			s.mu.Unlock()
			resp, err := c.Do(post(t, ctx, srv.URL+"/first", "b"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			got := s.Seen()
			if len(got) != 2 || got[0].Key == "" || got[1].Path != "/next" {
				t.Fatalf("%d, %s: server saw %+v", code, name, got)
			}
			if code == http.StatusSeeOther {
				if got[1].Method != http.MethodGet || got[1].Key != "" {
					t.Errorf("%d, %s: the redirected request is %s with key %q, want a GET without one", code, name, got[1].Method, got[1].Key)
				}
				continue
			}
			if got[1].Method != http.MethodPost || got[1].Key != got[0].Key || got[1].Body != "b" {
				t.Errorf("%d, %s: keys %q then %q (%s %q), want one key for the redirected POST", code, name, got[0].Key, got[1].Key, got[1].Method, got[1].Body)
			}
		}
	}
}

// TestKeyContextShared: WithKey and WithCallName put what idemgrpc's
// client interceptor reads (internal/outkey), so that one call site names
// a downstream call for HTTP and gRPC alike.
func TestKeyContextShared(t *testing.T) {
	in := idemkey.Key{Scope: "alice", Value: "incoming-1"}
	served := idemkey.NewContext(context.Background(), in)
	if k, err := outkey.Asked(WithCallName(served, "bank.charge")); err != nil || k != in.Derive("bank.charge") {
		t.Errorf("WithCallName: %q, %v; want the derived key", k, err)
	}
	if k, err := outkey.Asked(WithKey(served, "given-1")); err != nil || k != "given-1" {
		t.Errorf("WithKey: %q, %v; want given-1", k, err)
	}
	// And the Transport sends what idemgrpc.WithKey (outkey.WithKey) set.
	req, _ := http.NewRequestWithContext(outkey.WithKey(served, "given-2"), http.MethodPost, "http://example.test/pay", strings.NewReader("{}"))
	if k, n := keySent(t, req); k != "given-2" || n != 1 {
		t.Errorf("a key from outkey.WithKey: sent %q (%d values), want given-2", k, n)
	}
}
