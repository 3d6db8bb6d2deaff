package gateway

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
)

func TestNewAppliesDefaults(t *testing.T) {
	g, err := New([]string{"http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	c := g.cfg
	if c.maxAttempts != 3 || c.coolOff != 10*time.Second || c.bodyLimit != 1<<20 || c.header != idemkey.Header || c.observer != nil {
		t.Errorf("defaults: %+v", c)
	}
	if c.transport == nil || c.transport.Proxy != nil || c.transport.MaxIdleConnsPerHost != 64 {
		t.Errorf("default transport: %+v", c.transport)
	}
	if c.transport == http.DefaultTransport {
		t.Error("the default transport is http.DefaultTransport itself, not a clone")
	}
	for method, want := range map[string]bool{"POST": true, "PUT": true, "PATCH": true, "DELETE": true, "GET": false, "PROPFIND": false} {
		if got := c.honoured(&http.Request{Method: method}); got != want {
			t.Errorf("a key on %s honoured by default: %v, want %v", method, got, want)
		}
	}
}

func TestOptionsAreApplied(t *testing.T) {
	tr := &http.Transport{}
	honoured := func(*http.Request) bool { return false }
	var observed bool
	g, err := New([]string{"http://127.0.0.1:1"}, WithTransport(tr), WithMaxAttempts(5), WithCoolOff(0),
		WithMaxRequestBody(0), WithHeader("x-idempotency-key"), WithCovered(honoured),
		WithObserver(func(Failure) { observed = true }))
	if err != nil {
		t.Fatal(err)
	}
	c := g.cfg
	c.observer(Failure{})
	if c.transport != tr || c.maxAttempts != 5 || c.coolOff != 0 || c.bodyLimit != 0 ||
		c.header != "X-Idempotency-Key" || c.honoured(&http.Request{Method: "POST"}) || !observed {
		t.Errorf("options not applied: %+v", c)
	}
}

func TestNewRejectsBadInput(t *testing.T) {
	ok := []string{"http://127.0.0.1:1"}
	for name, c := range map[string]struct {
		upstreams []string
		opts      []Option
		want      []string
	}{
		"nil option":           {ok, []Option{WithMaxAttempts(2), nil}, []string{"option 2 is nil"}},
		"nil transport":        {ok, []Option{WithTransport(nil)}, []string{"WithTransport"}},
		"zero attempts":        {ok, []Option{WithMaxAttempts(0)}, []string{"WithMaxAttempts"}},
		"negative cool-off":    {ok, []Option{WithCoolOff(-time.Second)}, []string{"WithCoolOff"}},
		"negative body limit":  {ok, []Option{WithMaxRequestBody(-1)}, []string{"WithMaxRequestBody"}},
		"bad header":           {ok, []Option{WithHeader("Idempotency Key")}, []string{"WithHeader"}},
		"empty header":         {ok, []Option{WithHeader("")}, []string{"WithHeader"}},
		"nil honoured":         {ok, []Option{WithCovered(nil)}, []string{"WithCovered"}},
		"nil observer":         {ok, []Option{WithObserver(nil)}, []string{"WithObserver"}},
		"every error reported": {ok, []Option{WithMaxAttempts(0), WithMaxRequestBody(-1)}, []string{"WithMaxAttempts", "WithMaxRequestBody"}},
		"no upstream":          {nil, nil, []string{"no upstream"}},
		"relative":             {[]string{"/api"}, nil, []string{"not an absolute http or https URL"}},
		"other scheme":         {[]string{"ftp://h"}, nil, []string{"not an absolute"}},
		"no host":              {[]string{"http:///x"}, nil, []string{"not an absolute"}},
		"unparsable":           {[]string{"http://h:port"}, nil, []string{"upstream"}},
		"query":                {[]string{"http://h/?a=1"}, nil, []string{"query"}},
		"user info":            {[]string{"http://u:p@h"}, nil, []string{"user info"}},
		"fragment":             {[]string{"http://h/#f"}, nil, []string{"fragment"}},
		"twice":                {[]string{"http://h:1", "http://h:2", "http://h:1"}, nil, []string{"listed twice"}},
		"bad upstream and option": {[]string{"ftp://h"}, []Option{WithMaxAttempts(0)},
			[]string{"not an absolute", "WithMaxAttempts"}},
	} {
		t.Run(name, func(t *testing.T) {
			g, err := New(c.upstreams, c.opts...)
			if err == nil || g != nil {
				t.Fatalf("New = %v, %v; want nil and an error", g, err)
			}
			if !strings.HasPrefix(err.Error(), "idemkey: gateway: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestUpstreamsAreListedInOrder(t *testing.T) {
	g, err := New([]string{" http://b:1 ", "https://a:2/api"})
	if err != nil {
		t.Fatal(err)
	}
	if got := g.Upstreams(); len(got) != 2 || got[0] != "http://b:1" || got[1] != "https://a:2/api" {
		t.Errorf("Upstreams() = %q", got)
	}
}

func TestTargetURL(t *testing.T) {
	for _, c := range []struct{ base, in, want string }{
		{"http://h:1", "/payments?x=1", "http://h:1/payments?x=1"},
		{"http://h:1/", "/payments", "http://h:1/payments"},
		{"https://h/api", "/payments", "https://h/api/payments"},
		{"https://h/api/", "/payments", "https://h/api/payments"},
		{"https://h/api", "", "https://h/api"},
		{"http://h/api", "/a%2Fb?q", "http://h/api/a%2Fb?q"},
		{"http://h/a%2Fb", "/c", "http://h/a%2Fb/c"},
		{"http://h", "/a%2Fb", "http://h/a%2Fb"},
	} {
		ups, err := parseUpstreams([]string{c.base})
		if err != nil {
			t.Fatal(err)
		}
		in, err := url.Parse("http://gateway.example" + c.in)
		if err != nil {
			t.Fatal(err)
		}
		if got := ups[0].target(in).String(); got != c.want {
			t.Errorf("%s + %s = %s, want %s", c.base, c.in, got, c.want)
		}
	}
}

// TestKeyedNeedsAValidKey: a malformed key header makes the request
// unkeyed (the middleware refuses it without running anything), and a
// custom header name is read.
func TestKeyedNeedsAValidKey(t *testing.T) {
	g, err := New([]string{"http://h:1"}, WithHeader("X-Key"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		method string
		values []string
		want   bool
	}{
		{"POST", []string{"k"}, true},
		{"DELETE", []string{`"a,b"`}, true},
		{"", []string{"k"}, false}, // GET
		{"POST", nil, false},
		{"POST", []string{""}, false},
		{"POST", []string{"a", "b"}, false},
		{"POST", []string{"a,b"}, false},
		{"POST", []string{strings.Repeat("k", 256)}, false},
	} {
		req := &http.Request{Method: c.method, Header: http.Header{}}
		for _, v := range c.values {
			req.Header.Add("X-Key", v)
		}
		m := req.Method
		if m == "" {
			m = "GET"
		}
		if got := g.keyed(req, m); got != c.want {
			t.Errorf("%s with %q: keyed %v, want %v", c.method, c.values, got, c.want)
		}
	}
}
