package fingerprint

import (
	"crypto/sha256"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// req is the part of a request a fingerprint reads.
type req struct {
	method, path, query, contentType, body string
	contentEncoding                        []string
}

func (r req) sum() [32]byte {
	return Sum(r.method, r.path, r.query, r.contentType, []byte(r.body), r.contentEncoding...)
}

const ctJSON = "application/json"

func post(body string) req {
	return req{"POST", "/orders", "", ctJSON, body, nil}
}

const ctForm = "application/x-www-form-urlencoded"

func formReq(body string) req {
	return req{"POST", "/orders", "", ctForm, body, nil}
}

// encoded is r sent with the Content-Encoding header lines ce.
func encoded(r req, ce ...string) req {
	r.contentEncoding = ce
	return r
}

func TestSumEqual(t *testing.T) {
	const form = ctForm
	tests := []struct {
		name string
		a, b req
	}{
		{"key order", post(`{"a":1,"b":2}`), post(`{"b":2,"a":1}`)},
		{"whitespace", post(`{"a":[1,2]}`), post("{ \"a\" : [ 1 , 2 ] }\n")},
		{"escape \\u0041", post(`{"k":"A"}`), post(`{"k":"\u0041"}`)},
		{"escape \\/", post(`{"k":"/"}`), post(`{"k":"\/"}`)},
		{"nested key order", post(`{"a":{"x":1,"y":[{"p":1,"q":2}]}}`), post(`{"a":{"y":[{"q":2,"p":1}],"x":1}}`)},
		{"+json media type", req{"POST", "/", "", "application/merge-patch+json", `{"a":1,"b":2}`, nil}, req{"POST", "/", "", "application/merge-patch+json", `{"b":2,"a":1}`, nil}},
		{"media type case", req{"POST", "/", "", "Application/JSON", `{}`, nil}, req{"POST", "/", "", "application/json", `{}`, nil}},
		{"media type spaces", req{"POST", "/", "", "application/json;charset=utf-8", `{}`, nil}, req{"POST", "/", "", " application/json ;  charset=utf-8 ", `{}`, nil}},
		{"charset case and quotes", req{"POST", "/", "", "application/json; charset=UTF-8", `{}`, nil}, req{"POST", "/", "", `application/json; Charset="utf-8"`, `{}`, nil}},
		{"parameter order", req{"POST", "/", "", "text/plain; a=1; b=2", `x`, nil}, req{"POST", "/", "", "text/plain; b=2; a=1", `x`, nil}},
		{"query key order", req{"POST", "/", "a=1&b=2", "", "", nil}, req{"POST", "/", "b=2&a=1", "", "", nil}},
		{"query escapes reordered", req{"POST", "/", "a=%41+b&c=%2f", "", "", nil}, req{"POST", "/", "c=%2f&a=%41+b", "", "", nil}},
		{"query empty pairs reordered", req{"POST", "/", "a=1&&b", "", "", nil}, req{"POST", "/", "b&&a=1", "", "", nil}},
		{"query empty segment dropped", req{"POST", "/", "a=1&&b=2", "", "", nil}, req{"POST", "/", "a=1&b=2", "", "", nil}},
		{"query trailing '&' dropped", req{"POST", "/", "a=1&", "", "", nil}, req{"POST", "/", "a=1", "", "", nil}},
		{"query names decoded for the order", req{"POST", "/", "%62=2&a=1", "", "", nil}, req{"POST", "/", "a=1&%62=2", "", "", nil}},
		{"query interleaved keys", req{"POST", "/", "a=1&b=0&a=2", "", "", nil}, req{"POST", "/", "b=0&a=1&a=2", "", "", nil}},
		{"form pair order", req{"POST", "/", "", form, "a=1&b=2", nil}, req{"POST", "/", "", form, "b=2&a=1", nil}},
		{"form pair order, escapes kept", req{"POST", "/", "", form, "name=J%C3%B6rg+M&email=j%40x.eu", nil}, req{"POST", "/", "", form, "email=j%40x.eu&name=J%C3%B6rg+M", nil}},
		{"form names that decode alike keep their order", formReq("b=2&a=1&%61=3"), formReq("a=1&%61=3&b=2")},
		{"form name order by decoded name", formReq("%62=1&a=2"), formReq("a=2&%62=1")},
		{"form empty segments moved", formReq("a=1&&b=2"), formReq("b=2&a=1&")},
		{"form charset", req{"POST", "/", "", form + "; charset=UTF-8", "a=1&b=2", nil}, req{"POST", "/", "", form + `; charset="utf-8"`, "b=2&a=1", nil}},
		{"form JSON after the first byte", formReq(`p={"a":1}&q=[2]`), formReq(`q=[2]&p={"a":1}`)},
		{"content encoding spaces", encoded(post(`{}`), "gzip, br"), encoded(post(`{}`), "gzip ,\tbr")},
		{"no body, no content type", req{"DELETE", "/a", "", "", "", nil}, req{"DELETE", "/a", "", "  ", "", nil}},
	}
	for _, tt := range tests {
		if tt.a.sum() != tt.b.sum() {
			t.Errorf("%s: %+v and %+v have different fingerprints", tt.name, tt.a, tt.b)
		}
	}
}

func TestSumDistinct(t *testing.T) {
	const form = ctForm
	tests := []struct {
		name string
		a, b req
	}{
		{"1 vs 1.0", post(`{"a":1}`), post(`{"a":1.0}`)},
		{"1e2 vs 100", post(`{"a":1e2}`), post(`{"a":100}`)},
		{"duplicate key order", post(`{"a":1,"a":2}`), post(`{"a":2,"a":1}`)},
		{"case-folded key order", post(`{"id":1,"ID":2}`), post(`{"ID":2,"id":1}`)},
		{"array order", post(`[1,2]`), post(`[2,1]`)},
		{"string case", post(`"a"`), post(`"A"`)},
		{"nested value", post(`{"a":{"b":[1,{"c":true}]}}`), post(`{"a":{"b":[1,{"c":false}]}}`)},
		{"method", req{"POST", "/a", "", "", "", nil}, req{"PUT", "/a", "", "", "", nil}},
		{"method case", req{"POST", "/a", "", "", "", nil}, req{"post", "/a", "", "", "", nil}},
		{"path", req{"POST", "/a", "", "", "", nil}, req{"POST", "/b", "", "", "", nil}},
		{"path slash", req{"POST", "/a", "", "", "", nil}, req{"POST", "/a/", "", "", "", nil}},
		{"path escape", req{"POST", "/a/b", "", "", "", nil}, req{"POST", "/a%2Fb", "", "", "", nil}},
		{"query value", req{"POST", "/", "a=1", "", "", nil}, req{"POST", "/", "a=2", "", "", nil}},
		{"query value order", req{"POST", "/", "a=1&a=2", "", "", nil}, req{"POST", "/", "a=2&a=1", "", "", nil}},
		{"query vs none", req{"POST", "/", "a=", "", "", nil}, req{"POST", "/", "", "", "", nil}},
		{"query split", req{"POST", "/", "a=b%26c", "", "", nil}, req{"POST", "/", "a=b&c", "", "", nil}},
		// A handler reading r.URL.RawQuery tells escapes apart.
		{"query %20 and +", req{"POST", "/", "a=%20", "", "", nil}, req{"POST", "/", "a=+", "", "", nil}},
		{"query %41 and A", req{"POST", "/", "a=%41", "", "", nil}, req{"POST", "/", "a=A", "", "", nil}},
		{"query %26 and &", req{"POST", "/", "a=1%26b=2", "", "", nil}, req{"POST", "/", "a=1&b=2", "", "", nil}},
		{"query escaped name", req{"POST", "/", "%61=1", "", "", nil}, req{"POST", "/", "a=1", "", "", nil}},
		{"query name without =", req{"POST", "/", "a", "", "", nil}, req{"POST", "/", "a=", "", "", nil}},
		{"query values of one name", req{"POST", "/", "a=1&%61=2", "", "", nil}, req{"POST", "/", "%61=2&a=1", "", "", nil}},
		{"query malformed", req{"POST", "/", "a=%zz", "", "", nil}, req{"POST", "/", "a=%25zz", "", "", nil}},
		{"query semicolon", req{"POST", "/", "a=1;b=2", "", "", nil}, req{"POST", "/", "a=1&b=2", "", "", nil}},
		{"media type", req{"POST", "/", "", "application/json", `{}`, nil}, req{"POST", "/", "", "application/vnd.api+json", `{}`, nil}},
		{"charset", req{"POST", "/", "", "text/plain; charset=utf-8", `x`, nil}, req{"POST", "/", "", "text/plain; charset=latin1", `x`, nil}},
		{"charset vs none", req{"POST", "/", "", "application/json; charset=utf-8", `{}`, nil}, req{"POST", "/", "", "application/json", `{}`, nil}},
		{"boundary case", req{"POST", "/", "", "multipart/form-data; boundary=AB", `x`, nil}, req{"POST", "/", "", "multipart/form-data; boundary=ab", `x`, nil}},
		{"content type missing", req{"POST", "/", "", "", `{}`, nil}, req{"POST", "/", "", "application/json", `{}`, nil}},
		{"content type malformed", req{"POST", "/", "", "application/json;", `{}`, nil}, req{"POST", "/", "", "application/json; x", `{}`, nil}},
		{"JSON vs raw, same bytes", req{"POST", "/", "", "text/plain", `{"a":1}`, nil}, req{"POST", "/", "", "application/json", `{"a":1}`, nil}},
		{"raw body key order", req{"POST", "/", "", "text/plain", `{"a":1,"b":2}`, nil}, req{"POST", "/", "", "text/plain", `{"b":2,"a":1}`, nil}},
		{"raw body whitespace", req{"POST", "/", "", "application/octet-stream", "x", nil}, req{"POST", "/", "", "application/octet-stream", "x ", nil}},
		{"form same-key order", req{"POST", "/", "", form, "a=1&a=2", nil}, req{"POST", "/", "", form, "a=2&a=1", nil}},
		{"form value", req{"POST", "/", "", form, "a=1", nil}, req{"POST", "/", "", form, "a=1&b=", nil}},
		{"form malformed", req{"POST", "/", "", form, "a=%", nil}, req{"POST", "/", "", form, "a=%25", nil}},
		{"form malformed value escape", formReq("b=2&a=%4"), formReq("a=%4&b=2")},
		{"form semicolon", formReq("b=2&a=1;c"), formReq("a=1;c&b=2")},
		{"form vs JSON", req{"POST", "/", "", form, "a=1", nil}, req{"POST", "/", "", ctJSON, "a=1", nil}},
		{"form escapes", formReq("name=J%C3%B6rg+M"), formReq("name=J%c3%b6rg%20M")},
		{"form + vs %20", formReq(`{"name":"a+b"}`), formReq(`{"name":"a%20b"}`)},
		{"form + vs space", formReq(`{"name":"a+b"}`), formReq(`{"name":"a b"}`)},
		{"form escaped name", formReq("a=1"), formReq("%61=1")},
		{"form names that decode alike", formReq("a=1&%61=2"), formReq("%61=2&a=1")},
		{"form no = vs empty value", formReq("a&b=1"), formReq("a=&b=1")},
		{"form empty segment", formReq("a=1&b=2"), formReq("a=1&&b=2")},
		{"form JSON objects", formReq(`{"a":"b"}&{"a":"c"}`), formReq(`{"a":"c"}&{"a":"b"}`)},
		{"form JSON after spaces", formReq(`x=1& {"a":1}`), formReq(` {"a":1}&x=1`)},
		{"form JSON number", formReq("1&a=2"), formReq("a=2&1")},
		{"form JSON negative number", formReq("-1=x&a=2"), formReq("a=2&-1=x")},
		{"form JSON null", formReq("null&a=1"), formReq("a=1&null")},
		{"form JSON literal name", formReq("true=1&a=2"), formReq("a=2&true=1")},
		{"form JSON literal prefix", formReq("nulls=1&a=2"), formReq("a=2&nulls=1")},
		{"form XML", formReq("x=<a>1</a>&y=2"), formReq("y=2&x=<a>1</a>")},
		{"form control byte", formReq("a=1\n&b=2"), formReq("b=2&a=1\n")},
		{"form DEL", formReq("a=\x7f&b=2"), formReq("b=2&a=\x7f")},
		{"form too many segments", formReq("a=1" + strings.Repeat("&", 10000)), formReq("a=1")},
		{"form, encoded, pair order", encoded(formReq("a=1&b=2"), "gzip"), encoded(formReq("b=2&a=1"), "gzip")},
		{"encoded JSON key order", encoded(post(`{"a":1,"b":2}`), "gzip"), encoded(post(`{"b":2,"a":1}`), "gzip")},
		{"content encoding vs none", encoded(post(`{}`), "gzip"), post(`{}`)},
		{"empty content encoding vs none", encoded(post(`{}`), ""), post(`{}`)},
		{"content encoding", encoded(post(`{}`), "gzip"), encoded(post(`{}`), "br")},
		{"content encoding order", encoded(post(`{}`), "gzip, br"), encoded(post(`{}`), "br, gzip")},
		{"content encoding case", encoded(post(`{}`), "gzip"), encoded(post(`{}`), "GZIP")},
		{"content encoding lines", encoded(post(`{}`), "gzip", "br"), encoded(post(`{}`), "gzip, br")},
		{"content encoding empty element", encoded(post(`{}`), "gzip,"), encoded(post(`{}`), "gzip")},
		{"content encoding empty line", encoded(post(`{}`), "gzip", ""), encoded(post(`{}`), "gzip")},
		{"content encoding vs media type", req{"POST", "/", "", "application/json", "{}", []string{"x"}}, req{"POST", "/", "", "application/json; x=", "{}", nil}},
		{"empty JSON body vs {}", post(``), post(`{}`)},
		{"field boundary", req{"POST", "/ab", "", "", "", nil}, req{"POST/", "ab", "", "", "", nil}},
		{"query and body boundary", req{"POST", "/", "a=1", "text/plain", "", nil}, req{"POST", "/", "", "text/plain", "a=1", nil}},
	}
	for _, tt := range tests {
		if tt.a.sum() == tt.b.sum() {
			t.Errorf("%s: %+v and %+v share a fingerprint", tt.name, tt.a, tt.b)
		}
	}
}

// TestInvalidJSONNeverCollides checks that an invalid JSON body never shares
// a fingerprint with a valid one, not even the one its bytes spell out once
// canonicalised, nor a raw body of the same bytes.
func TestInvalidJSONNeverCollides(t *testing.T) {
	for _, invalid := range []string{`{"a":1`, `{"a":1,}`, ``, `nul`, strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1)} {
		got := post(invalid).sum()
		for _, valid := range []string{`{"a":1}`, `{}`, `null`, `"` + invalid + `"`} {
			if got == post(valid).sum() {
				t.Errorf("invalid %q shares a fingerprint with valid %q", invalid, valid)
			}
		}
		// The raw-JSON reading must not collide with a raw body of the same
		// bytes under another media type...
		if got == (req{"POST", "/orders", "", "text/plain", invalid, nil}).sum() {
			t.Errorf("invalid JSON %q shares a fingerprint with a text/plain body", invalid)
		}
		// ...and must equal itself.
		if got != post(invalid).sum() {
			t.Errorf("invalid JSON %q: fingerprint not deterministic", invalid)
		}
	}
	// A body whose canonical form equals another body's raw bytes.
	if post(`{"b":1,"a":2}`).sum() == post(`{"a":2,"b":1}x`).sum() {
		t.Error("valid and invalid JSON share a fingerprint")
	}
}

// TestSumLayout recomputes one fingerprint from the documented layout, so a
// change of the stored format cannot go unnoticed.
func TestSumLayout(t *testing.T) {
	field := func(b []byte, tag byte, data string) []byte {
		b = append(b, tag)
		b = binary.BigEndian.AppendUint64(b, uint64(len(data)))
		return append(b, data...)
	}
	lp := func(s string) string {
		return string(binary.BigEndian.AppendUint64(nil, uint64(len(s)))) + s
	}
	b := []byte("idemkey fingerprint v1\n")
	b = field(b, 'M', "POST")
	b = field(b, 'P', "/a%20b")
	b = field(b, 'S', string(binary.BigEndian.AppendUint64(nil, 1))+lp("x=1")+lp("y=2+3"))
	b = field(b, 'T', lp("application/json")+lp("charset")+lp("utf-8"))
	b = field(b, 'J', `{"a":[1,{"b":"é"}],"c":null}`)
	want := sha256.Sum256(b)
	got := Sum("POST", "/a%20b", "y=2+3&x=1", `Application/JSON; charset="UTF-8"`, []byte(`{"c":null, "a":[1,{"b":"\u00e9"}]}`))
	if got != want {
		t.Fatalf("Sum does not follow the documented layout:\n got %x\nwant %x", got, want)
	}

	// A form body, sent with two Content-Encoding lines: the encoding
	// field, and the body as its raw bytes.
	u64 := func(n int) string { return string(binary.BigEndian.AppendUint64(nil, uint64(n))) }
	b = []byte("idemkey fingerprint v1\n")
	b = field(b, 'M', "PUT")
	b = field(b, 'P', "/f")
	b = field(b, 'Q', "")
	b = field(b, 'T', lp("application/x-www-form-urlencoded"))
	b = field(b, 'E', lp(lp("gzip")+lp("")+lp("BR"))+lp(lp("x y")))
	b = field(b, 'B', "b=2&a=1")
	want = sha256.Sum256(b)
	if got := Sum("PUT", "/f", "", "application/x-www-form-urlencoded", []byte("b=2&a=1"), " gzip ,, BR", "x y"); got != want {
		t.Fatalf("an encoded body does not follow the documented layout:\n got %x\nwant %x", got, want)
	}

	// The same form without an encoding: the number of '&', then the
	// non-empty segments as sent, sorted stably by decoded name.
	b = []byte("idemkey fingerprint v1\n")
	b = field(b, 'M', "PUT")
	b = field(b, 'P', "/f")
	b = field(b, 'Q', "")
	b = field(b, 'T', lp("application/x-www-form-urlencoded"))
	b = field(b, 'U', u64(4)+lp("a=1")+lp("%61=3")+lp("b=%32")+lp("b+c"))
	want = sha256.Sum256(b)
	if got := Sum("PUT", "/f", "", "application/x-www-form-urlencoded", []byte("b=%32&a=1&&b+c&%61=3")); got != want {
		t.Fatalf("a form body does not follow the documented layout:\n got %x\nwant %x", got, want)
	}

	// A form body a reordering could change for a JSON decoder: raw bytes.
	b = []byte("idemkey fingerprint v1\n")
	b = field(b, 'M', "PUT")
	b = field(b, 'P', "/f")
	b = field(b, 'Q', "")
	b = field(b, 'T', lp("application/x-www-form-urlencoded"))
	b = field(b, 'f', "b=2&null")
	want = sha256.Sum256(b)
	if got := Sum("PUT", "/f", "", "application/x-www-form-urlencoded", []byte("b=2&null")); got != want {
		t.Fatalf("a JSON-looking form body does not follow the documented layout:\n got %x\nwant %x", got, want)
	}
}

func TestDefaultMatchesSum(t *testing.T) {
	body := []byte(`{"b":2,"a":1}`)
	r := httptest.NewRequest("PATCH", "http://example.com/a%2Fb/c?z=1&y=2", nil)
	r.Header.Set("Content-Type", "application/json")
	want := Sum("PATCH", "/a%2Fb/c", "z=1&y=2", "application/json", body)
	if got := Default(r, body); got != want {
		t.Errorf("Default = %x, Sum = %x", got, want)
	}
	if got := mustNew(All)(r, body); got != want {
		t.Errorf("New(All) = %x, Sum = %x", got, want)
	}
	// Default reads the first Content-Type and every Content-Encoding line.
	r.Header.Add("Content-Type", "text/plain")
	r.Header.Add("Content-Encoding", "gzip")
	r.Header.Add("content-encoding", "BR, x")
	want = Sum("PATCH", "/a%2Fb/c", "z=1&y=2", "application/json", body, "gzip", "BR, x")
	if got := Default(r, body); got != want {
		t.Errorf("with Content-Encoding: Default = %x, Sum = %x", got, want)
	}
}

func TestFieldSelection(t *testing.T) {
	mk := func(method, target, ct, body string) (*http.Request, []byte) {
		r := httptest.NewRequest(method, target, nil)
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		return r, []byte(body)
	}
	base := func() (*http.Request, []byte) { return mk("POST", "/a?q=1", "application/json", `{"x":1}`) }
	variants := map[Field]func() (*http.Request, []byte){
		Method:    func() (*http.Request, []byte) { return mk("PUT", "/a?q=1", "application/json", `{"x":1}`) },
		Path:      func() (*http.Request, []byte) { return mk("POST", "/b?q=1", "application/json", `{"x":1}`) },
		Query:     func() (*http.Request, []byte) { return mk("POST", "/a?q=2", "application/json", `{"x":1}`) },
		MediaType: func() (*http.Request, []byte) { return mk("POST", "/a?q=1", "application/problem+json", `{"x":1}`) },

		Body: func() (*http.Request, []byte) { return mk("POST", "/a?q=1", "application/json", `{"x":2}`) },
	}
	for _, sel := range []Field{Method, Path, Query, MediaType, Body, Method | Path, Method | Path | Query, All &^ Body, All} {
		f := mustNew(sel)
		r0, b0 := base()
		d0 := f(r0, b0)
		for changed, v := range variants {
			r, b := v()
			differs := f(r, b) != d0
			if want := sel&changed != 0; differs != want {
				t.Errorf("New(%v): changing %v: fingerprint differs = %v, want %v", sel, changed, differs, want)
			}
		}
	}
	// The content encoding is covered with MediaType; it also makes Body
	// read the body as raw bytes, a different reading of the same bytes.
	encodings := []string{"gzip", "br", "GZIP", "gzip, br"}
	for _, sel := range []Field{Method | Path | Query, MediaType, Body, MediaType | Body, All} {
		f := mustNew(sel)
		r0, b0 := base()
		d0 := f(r0, b0)
		seen := map[[32]byte]string{}
		for _, ce := range encodings {
			r, b := base()
			r.Header.Set("Content-Encoding", ce)
			d := f(r, b)
			if (d != d0) != (sel&(MediaType|Body) != 0) {
				t.Errorf("New(%v): Content-Encoding %q changes the fingerprint = %v", sel, ce, d != d0)
			}
			if prev, ok := seen[d]; ok && sel&MediaType != 0 {
				t.Errorf("New(%v): Content-Encoding %q and %q share a fingerprint", sel, prev, ce)
			}
			seen[d] = ce
		}
	}

	// Different selections never share a fingerprint of one request.
	r, b := base()
	if mustNew(Method)(r, b) == mustNew(Path)(r, b) || mustNew(Method|Path)(r, b) == mustNew(Method)(r, b) {
		t.Error("different selections share a fingerprint")
	}
}

func TestNewErrors(t *testing.T) {
	for _, f := range []Field{0, 1 << 5, All | 1<<7} {
		fp, err := New(f)
		if err == nil || fp != nil || !strings.HasPrefix(err.Error(), "idemkey: fingerprint: ") {
			t.Errorf("New(%v) = %v, %v; want an idemkey: fingerprint: error", f, fp != nil, err)
		}
	}
}

// mustNew is New for fields that are valid.
func mustNew(fields Field) Func {
	f, err := New(fields)
	if err != nil {
		panic(err)
	}
	return f
}

func TestFieldString(t *testing.T) {
	for f, want := range map[Field]string{
		0:                "0",
		Method:           "Method",
		Method | Path:    "Method|Path",
		All:              "Method|Path|Query|MediaType|Body",
		Body | 1<<6:      "Body|0x40",
		MediaType | 1<<7: "MediaType|0x80",
	} {
		if got := f.String(); got != want {
			t.Errorf("Field(%#x).String() = %q, want %q", uint8(f), got, want)
		}
	}
}

// TestSumPoolReuse checks that a scratch buffer reused after a large body,
// or after a failed canonicalisation, gives the same answers as a fresh one.
func TestSumPoolReuse(t *testing.T) {
	small := post(`{"b":[1,{"y":1,"x":2}],"a":"\u00e9"}`)
	want := small.sum()
	big := post(`{"z":"` + strings.Repeat("x", 2*maxRetained) + `","a":1}`)
	for range 3 {
		big.sum()
		post(`{"a":[1,2,{"b":`).sum()
		post(strings.Repeat("[", MaxDepth+2)).sum()
		if got := small.sum(); got != want {
			t.Fatalf("after reuse: %x, want %x", got, want)
		}
	}
}

// TestSumLargeReordered checks that a large body whose members need
// reordering, hashed in chunks as it is reordered, hashes like its canonical
// form, which is in order and hashed whole.
func TestSumLargeReordered(t *testing.T) {
	for _, body := range [][]byte{
		benchJSON(64 << 10),
		[]byte(`{"z":"` + strings.Repeat("y", 3*emitChunk) + `","a":[` + string(benchJSON(3*emitChunk)) + `]}`),
	} {
		c, err := CanonicalJSON(nil, body)
		if err != nil {
			t.Fatal(err)
		}
		if string(c) == string(body) {
			t.Fatal("test body is canonical already")
		}
		if Sum("POST", "/", "", ctJSON, body) != Sum("POST", "/", "", ctJSON, c) {
			t.Errorf("a %d-byte body and its canonical form have different fingerprints", len(body))
		}
	}
}

// TestEmptyQuerySegmentsDoNotCount: a query's empty segments (a leading,
// trailing or doubled '&') count for nothing, as for every decoder: /p?a=1&
// is /p?a=1, whatever else the query holds; its non-empty segments still
// count as sent.
func TestEmptyQuerySegmentsDoNotCount(t *testing.T) {
	sum := func(q string) [32]byte { return Sum("POST", "/p", q, "", nil) }
	for _, c := range []struct{ a, b string }{
		{"a=1&", "a=1"}, {"&a=1", "a=1"}, {"a=1&&b=2", "a=1&b=2"}, {"&", ""}, {"&&&", ""},
		{"a=%20&", "a=%20"}, {"&a&&b=%41&", "a&b=%41"}, {"a;b&", "a;b"}, {"b=2&&a=1", "a=1&b=2"},
	} {
		if sum(c.a) != sum(c.b) {
			t.Errorf("queries %q and %q differ, want the same fingerprint", c.a, c.b)
		}
	}
	for _, c := range []struct{ a, b string }{
		{"a=1&", "a=1&b"}, {"a=1&", "a=2"}, {"a=%20&", "a=+"}, {"&a=1&a=2", "a=2&a=1"},
	} {
		if sum(c.a) == sum(c.b) {
			t.Errorf("queries %q and %q share a fingerprint", c.a, c.b)
		}
	}
}
