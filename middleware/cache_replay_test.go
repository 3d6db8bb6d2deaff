package middleware_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/middleware"
)

// A cached replay skips the fingerprint for bytes it has already matched
// to the record; every other repeat is still judged by its fingerprint.
func TestCachedRepeatsAreJudgedByTheirFingerprint(t *testing.T) {
	for name, opts := range map[string][]middleware.Option{
		"default fingerprint": {middleware.WithLocalCache(100, time.Minute)},
		"own fingerprint":     {middleware.WithLocalCache(100, time.Minute), middleware.WithFingerprint(fingerprint.Default)},
	} {
		t.Run(name, func(t *testing.T) { cachedRepeats(t, opts) })
	}
}

func cachedRepeats(t *testing.T, opts []middleware.Option) {
	f := newFixture(t, opts...)
	h := &counter{}
	mw := f.mw.Required()(h)
	first := serve(mw, post("k", `{"a":1,"b":[1,2]}`))
	claims := f.store.claims.Load()
	replays := []struct {
		name, body string
	}{
		{"same bytes", `{"a":1,"b":[1,2]}`},
		{"same bytes again", `{"a":1,"b":[1,2]}`},
		{"members reordered", `{"b":[1,2],"a":1}`},
		{"whitespace", ` { "a" : 1 , "b" : [ 1 , 2 ] } `},
		{"same bytes after the others", `{"a":1,"b":[1,2]}`},
	}
	for _, rp := range replays {
		w := serve(mw, post("k", rp.body))
		if w.Code != first.Code || w.Body.String() != first.Body.String() || w.Header().Get(idemkey.HeaderReplayed) != "true" {
			t.Errorf("%s: %d %q, want the replay of %d %q", rp.name, w.Code, w.Body, first.Code, first.Body)
		}
	}
	for name, r := range map[string]*http.Request{
		"other body":  post("k", `{"a":1,"b":[2,1]}`),
		"other query": func() *http.Request { r := post("k", `{"a":1,"b":[1,2]}`); r.URL.RawQuery = "x=1"; return r }(),
		"other path":  func() *http.Request { r := post("k", `{"a":1,"b":[1,2]}`); r.URL.Path = "/refunds"; return r }(),
		"other type": func() *http.Request {
			r := post("k", `{"a":1,"b":[1,2]}`)
			r.Header.Set("Content-Type", "text/plain")
			return r
		}(),
		"other method": func() *http.Request { r := post("k", `{"a":1,"b":[1,2]}`); r.Method = http.MethodPut; return r }(),
		"other content encoding": func() *http.Request {
			r := post("k", `{"a":1,"b":[1,2]}`)
			r.Header.Set("Content-Encoding", "gzip")
			return r
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			wantProblem(t, serve(mw, r), http.StatusUnprocessableEntity, idemkey.CodeKeyReused)
		})
	}
	if got := f.store.claims.Load(); got != claims {
		t.Errorf("%d store claims after the first run, want 0", got-claims)
	}
	if h.runs.Load() != 1 {
		t.Errorf("handler ran %d times", h.runs.Load())
	}
}
