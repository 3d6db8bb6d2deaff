package fingerprint

import (
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
)

func rawBase() (*http.Request, []byte) {
	r := httptest.NewRequest("POST", "http://example.com/v1/a%2Fb?b=2&a=1", nil)
	r.Header.Set("Content-Type", "application/json; charset=utf-8")
	r.Header.Set("Content-Encoding", "gzip")
	r.Header.Set("Idempotency-Key", "k1")
	return r, []byte(`{"b":2,"a":1}`)
}

// TestRawDigestCoversDefault checks RawDigest's promise, that equal
// RawDigests imply equal Default fingerprints, from both sides: changing
// anything Default reads changes the RawDigest (even where the fingerprint
// stays, as for key order), and no change to a request, read by Default or
// not, changes its fingerprint without changing its RawDigest.
func TestRawDigestCoversDefault(t *testing.T) {
	type mutation struct {
		name string
		read bool // Default reads what it changes
		f    func(r *http.Request, body []byte) []byte
	}
	header := func(name string, values ...string) func(*http.Request, []byte) []byte {
		return func(r *http.Request, b []byte) []byte {
			if values == nil {
				r.Header.Del(name)
			} else {
				r.Header[http.CanonicalHeaderKey(name)] = values
			}
			return b
		}
	}
	mutations := []mutation{
		{"method", true, func(r *http.Request, b []byte) []byte { r.Method = "PUT"; return b }},
		{"method case", true, func(r *http.Request, b []byte) []byte { r.Method = "post"; return b }},
		{"path", true, func(r *http.Request, b []byte) []byte { r.URL.Path, r.URL.RawPath = "/v1/a/c", ""; return b }},
		{"escaped path", true, func(r *http.Request, b []byte) []byte { r.URL.RawPath = ""; return b }},
		{"query order", true, func(r *http.Request, b []byte) []byte { r.URL.RawQuery = "a=1&b=2"; return b }},
		{"query escape", true, func(r *http.Request, b []byte) []byte { r.URL.RawQuery = "b=2&%61=1"; return b }},
		{"query dropped", true, func(r *http.Request, b []byte) []byte { r.URL.RawQuery = ""; return b }},
		{"content type", true, header("Content-Type", "application/problem+json")},
		{"content type case", true, header("Content-Type", "Application/JSON; charset=utf-8")},
		{"content type spaces", true, header("Content-Type", "application/json;charset=utf-8")},
		{"content type first line", true, header("Content-Type", "text/plain", "application/json; charset=utf-8")},
		{"content type dropped", true, header("Content-Type")},
		{"content encoding", true, header("Content-Encoding", "br")},
		{"content encoding case", true, header("Content-Encoding", "GZIP")},
		{"content encoding spaces", true, header("Content-Encoding", "gzip, br")},
		{"content encoding elements", true, header("Content-Encoding", "gzip,br")},
		{"content encoding lines", true, header("Content-Encoding", "gzip", "br")},
		{"content encoding empty line", true, header("Content-Encoding", "gzip", "")},
		{"content encoding dropped", true, header("Content-Encoding")},
		{"body", true, func(r *http.Request, b []byte) []byte { return []byte(`{"b":2,"a":3}`) }},
		{"body key order", true, func(r *http.Request, b []byte) []byte { return []byte(`{"a":1,"b":2}`) }},
		{"body whitespace", true, func(r *http.Request, b []byte) []byte { return append(b, ' ') }},
		{"body empty", true, func(r *http.Request, b []byte) []byte { return nil }},
		// What Default does not read.
		{"host", false, func(r *http.Request, b []byte) []byte { r.Host = "other.example"; return b }},
		{"idempotency key", false, header("Idempotency-Key", "k2")},
		{"other header", false, header("X-Other", "1")},
		{"second content type line", false, header("Content-Type", "application/json; charset=utf-8", "text/plain")},
		{"fragment", false, func(r *http.Request, b []byte) []byte { r.URL.Fragment = "x"; return b }},
		{"remote address", false, func(r *http.Request, b []byte) []byte { r.RemoteAddr = "10.0.0.1:1"; return b }},
		{"content length", false, func(r *http.Request, b []byte) []byte { r.ContentLength = 99; return b }},
	}
	r0, b0 := rawBase()
	raw0, fp0 := rawDigest(r0, b0), Default(r0, b0)
	if raw0 == fp0 {
		t.Fatal("a RawDigest equals a fingerprint")
	}
	if raw0 != rawDigest(r0, b0) {
		t.Fatal("RawDigest not deterministic")
	}
	for _, m := range mutations {
		r, b := rawBase()
		b = m.f(r, b)
		raw, fp := rawDigest(r, b), Default(r, b)
		if m.read && raw == raw0 {
			t.Errorf("%s: Default reads it, RawDigest does not change", m.name)
		}
		if fp != fp0 && raw == raw0 {
			t.Errorf("%s: the fingerprint changes, the RawDigest does not", m.name)
		}
		if !m.read && fp != fp0 {
			t.Errorf("%s: Default reads it: move it to the mutations Default reads", m.name)
		}
	}
}

// TestRawDigestRandom checks on random requests that equal RawDigests come
// with equal fingerprints, and that requests with different inputs have
// different RawDigests.
func TestRawDigestRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	pick := func(s ...string) string { return s[rng.IntN(len(s))] }
	type input struct {
		method, path, rawPath, query, contentType string
		contentEncoding                           []string
		body                                      string
	}
	gen := func() input {
		var ce []string
		for range rng.IntN(3) {
			ce = append(ce, pick("gzip", "br", "", "GZIP", "gzip, br", "gzip,br"))
		}
		return input{
			pick("POST", "PUT", "POST/"), pick("/a", "ab", "/a/b", "/"), pick("", "/a%2Fb"),
			pick("", "a=1", "a=1&b=2", "b=2&a=1", "%61=1"),
			pick("", "application/json", "Application/JSON", "application/x-www-form-urlencoded", "text/plain"),
			ce, pick("", `{"a":1,"b":2}`, `{"b":2,"a":1}`, "a=1&b=2", "b=2&a=1", "ab"),
		}
	}
	request := func(in input) (*http.Request, []byte) {
		r := &http.Request{Method: in.method, URL: &url.URL{Path: in.path, RawQuery: in.query}, Header: http.Header{}}
		if in.rawPath != "" && in.path == "/a/b" {
			r.URL.RawPath = in.rawPath
		}
		if in.contentType != "" {
			r.Header.Set("Content-Type", in.contentType)
		}
		if in.contentEncoding != nil {
			r.Header["Content-Encoding"] = in.contentEncoding
		}
		return r, []byte(in.body)
	}
	type seen struct {
		fp  [32]byte
		key string
	}
	byRaw := map[[32]byte]seen{}
	for range 20000 {
		in := gen()
		r, b := request(in)
		raw, fp := rawDigest(r, b), Default(r, b)
		key := r.Method + "\x00" + r.URL.EscapedPath() + "\x00" + r.URL.RawQuery + "\x00" + r.Header.Get("Content-Type") + "\x00" +
			string(b) + "\x00" + string(append([]byte(nil), []byte(joinLines(in.contentEncoding))...))
		if prev, ok := byRaw[raw]; ok {
			if prev.fp != fp {
				t.Fatalf("equal RawDigests, different fingerprints: %+v", in)
			}
			if prev.key != key {
				t.Fatalf("different requests share a RawDigest: %q and %q", prev.key, key)
			}
		}
		byRaw[raw] = seen{fp, key}
	}
}

// joinLines writes header lines so that different lists stay different.
func joinLines(lines []string) string {
	s := ""
	for _, l := range lines {
		s += "[" + l + "]"
	}
	if lines == nil {
		return "none"
	}
	return s
}

// BenchmarkRawDigest is the digest of a 1 KiB JSON POST, against
// BenchmarkDefaultJSON/1KiB for its fingerprint.
func BenchmarkRawDigest(b *testing.B) {
	r := httptest.NewRequest("POST", "/v1/orders?expand=items", nil)
	r.Header.Set("Content-Type", "application/json; charset=utf-8")
	body := benchJSON(1 << 10)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var d [32]byte
	for b.Loop() {
		d = rawDigest(r, body)
	}
	sink = d
}
