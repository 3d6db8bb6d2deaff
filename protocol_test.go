package idemkey

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	long := strings.Repeat("k", MaxKeyLength)
	tests := []struct {
		name   string
		values []string
		want   string
		err    error
	}{
		{"absent", nil, "", ErrKeyMissing},
		{"bare uuid", []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"bare with surrounding space", []string{"  abc\t"}, "abc", nil},
		{"bare with inner space", []string{"a b"}, "a b", nil},
		{"bare longest", []string{long}, long, nil},
		{"bare too long", []string{long + "k"}, "", ErrKeyInvalid},
		{"quoted", []string{`"abc"`}, "abc", nil},
		{"quoted with comma", []string{`"a,b"`}, "a,b", nil},
		{"quoted escapes", []string{`"a\"b\\c"`}, `a"b\c`, nil},
		{"quoted longest", []string{`"` + long + `"`}, long, nil},
		{"quoted too long", []string{`"` + long + `k"`}, "", ErrKeyInvalid},
		{"quoted escapes longest", []string{`"\\` + long[1:] + `"`}, `\` + long[1:], nil},
		{"quoted escapes too long", []string{`"\\` + long + `"`}, "", ErrKeyInvalid},
		{"empty", []string{""}, "", ErrKeyInvalid},
		{"blank", []string{"   "}, "", ErrKeyInvalid},
		{"empty quoted", []string{`""`}, "", ErrKeyInvalid},
		{"two headers", []string{"a", "b"}, "", ErrKeyInvalid},
		{"two equal headers", []string{"a", "a"}, "", ErrKeyInvalid},
		{"folded headers", []string{"a, b"}, "", ErrKeyInvalid},
		{"folded quoted headers", []string{`"a", "b"`}, "", ErrKeyInvalid},
		{"control byte", []string{"a\x01b"}, "", ErrKeyInvalid},
		{"delete byte", []string{"a\x7fb"}, "", ErrKeyInvalid},
		{"non-ASCII", []string{"clé"}, "", ErrKeyInvalid},
		{"quoted non-ASCII", []string{`"clé"`}, "", ErrKeyInvalid},
		{"quoted control", []string{"\"a\tb\""}, "", ErrKeyInvalid},
		{"unterminated quote", []string{`"abc`}, "", ErrKeyInvalid},
		{"lone quote", []string{`"`}, "", ErrKeyInvalid},
		{"bad escape", []string{`"a\nb"`}, "", ErrKeyInvalid},
		{"trailing backslash", []string{`"ab\"`}, "", ErrKeyInvalid},
		{"bare inner quote", []string{`ab"c`}, "", ErrKeyInvalid},
		{"quoted inner quote", []string{`"a"b"`}, "", ErrKeyInvalid},
		{"parameters", []string{`"abc";p=1`}, "", ErrKeyInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseKey(tt.values)
			if err != tt.err || got != tt.want {
				t.Fatalf("ParseKey(%q) = %q, %v; want %q, %v", tt.values, got, err, tt.want, tt.err)
			}
		})
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"a\"b"`, `"`, `""`, "a, b", `"a\\"`, "\x00", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		k, err := ParseKey([]string{v})
		if err != nil {
			if k != "" {
				t.Fatalf("error with key %q", k)
			}
			return
		}
		if len(k) == 0 || len(k) > MaxKeyLength {
			t.Fatalf("accepted key of length %d", len(k))
		}
		for i := 0; i < len(k); i++ {
			if k[i] < 0x20 || k[i] > 0x7e {
				t.Fatalf("accepted byte %#x", k[i])
			}
		}
		// The quoted form of every accepted key parses back to it, and so
		// does the form FormatKey chooses.
		q := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
		if back, err := ParseKey([]string{q}); err != nil || back != k {
			t.Fatalf("quoted %q parsed to %q, %v", q, back, err)
		}
		if !ValidKey(k) {
			t.Fatalf("ParseKey accepted %q, which ValidKey refuses", k)
		}
		if f := FormatKey(k); f != k && f != q {
			t.Fatalf("FormatKey(%q) = %q, want the key or %q", k, f, q)
		} else if back, err := ParseKey([]string{f}); err != nil || back != k {
			t.Fatalf("FormatKey(%q) = %q parsed to %q, %v", k, f, back, err)
		}
	})
}

func TestFormatKey(t *testing.T) {
	for _, tt := range []struct{ key, want string }{
		{"8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{"a b", "a b"},
		{`a\b`, `a\b`},
		{"a,b", `"a,b"`},
		{`a"b`, `"a\"b"`},
		{`"a`, `"\"a"`},
		{`a,\`, `"a,\\"`},
		{" a", `" a"`},
		{"a ", `"a "`},
	} {
		got := FormatKey(tt.key)
		if got != tt.want {
			t.Errorf("FormatKey(%q) = %q, want %q", tt.key, got, tt.want)
		}
		if back, err := ParseKey([]string{got}); err != nil || back != tt.key {
			t.Errorf("ParseKey(FormatKey(%q)) = %q, %v", tt.key, back, err)
		}
	}
}

func TestMethods(t *testing.T) {
	for _, m := range []string{"POST", "PUT", "PATCH", "DELETE"} {
		if !Mutation(m) || Safe(m) {
			t.Errorf("%s: Mutation %v, Safe %v; want true, false", m, Mutation(m), Safe(m))
		}
	}
	for _, m := range []string{"GET", "HEAD", "OPTIONS", "TRACE"} {
		if Mutation(m) || !Safe(m) {
			t.Errorf("%s: Mutation %v, Safe %v; want false, true", m, Mutation(m), Safe(m))
		}
	}
	for _, m := range []string{"CONNECT", "post", "PROPFIND", ""} {
		if Mutation(m) || Safe(m) {
			t.Errorf("%q: Mutation %v, Safe %v; want false, false", m, Mutation(m), Safe(m))
		}
	}
}

func TestValidHeaderName(t *testing.T) {
	for _, name := range []string{"Idempotency-Key", "x-key", "X_Key.1", "a!#$%&'*+-.^_`|~z"} {
		if !ValidHeaderName(name) {
			t.Errorf("ValidHeaderName(%q) = false", name)
		}
	}
	for _, name := range []string{"", "Idempotency Key", "key:", "k\x00", "clé", "(key)", "a/b"} {
		if ValidHeaderName(name) {
			t.Errorf("ValidHeaderName(%q) = true", name)
		}
	}
}

func TestWriteProblem(t *testing.T) {
	p := NewProblem("conflict", http.StatusConflict, "Request in progress", "Retry later.")
	p.RetryAfter = 3
	w := httptest.NewRecorder()
	w.Header().Set("Retry-After", "99")
	WriteProblem(w, p, nil)
	if w.Code != http.StatusConflict || w.Header().Get("Content-Type") != "application/problem+json" ||
		w.Header().Get("Cache-Control") != "no-store" || w.Header().Get("Retry-After") != "3" ||
		w.Header().Get("Content-Length") != strconv.Itoa(w.Body.Len()) {
		t.Fatalf("response %d %v", w.Code, w.Header())
	}
	var got map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"type": ProblemTypePrefix + "conflict", "title": "Request in progress", "status": float64(409), "detail": "Retry later.", "code": "conflict"}
	if !maps.Equal(got, want) {
		t.Fatalf("body %v, want %v", got, want)
	}
	// No Retry-After: none is sent, even one set before.
	p.RetryAfter = 0
	w = httptest.NewRecorder()
	w.Header().Set("Retry-After", "99")
	WriteProblem(w, p, p.Body())
	if _, ok := w.Header()["Retry-After"]; ok {
		t.Fatalf("Retry-After %q without one in the problem", w.Header().Get("Retry-After"))
	}
}
