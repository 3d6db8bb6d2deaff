package idemkey

import (
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
