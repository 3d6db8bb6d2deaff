package middleware

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
		{"absent", nil, "", errKeyMissing},
		{"bare uuid", []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"bare with surrounding space", []string{"  abc\t"}, "abc", nil},
		{"bare with inner space", []string{"a b"}, "a b", nil},
		{"bare longest", []string{long}, long, nil},
		{"bare too long", []string{long + "k"}, "", errKeyInvalid},
		{"quoted", []string{`"abc"`}, "abc", nil},
		{"quoted with comma", []string{`"a,b"`}, "a,b", nil},
		{"quoted escapes", []string{`"a\"b\\c"`}, `a"b\c`, nil},
		{"quoted longest", []string{`"` + long + `"`}, long, nil},
		{"quoted too long", []string{`"` + long + `k"`}, "", errKeyInvalid},
		{"quoted escapes longest", []string{`"\\` + long[1:] + `"`}, `\` + long[1:], nil},
		{"quoted escapes too long", []string{`"\\` + long + `"`}, "", errKeyInvalid},
		{"empty", []string{""}, "", errKeyInvalid},
		{"blank", []string{"   "}, "", errKeyInvalid},
		{"empty quoted", []string{`""`}, "", errKeyInvalid},
		{"two headers", []string{"a", "b"}, "", errKeyInvalid},
		{"two equal headers", []string{"a", "a"}, "", errKeyInvalid},
		{"folded headers", []string{"a, b"}, "", errKeyInvalid},
		{"folded quoted headers", []string{`"a", "b"`}, "", errKeyInvalid},
		{"control byte", []string{"a\x01b"}, "", errKeyInvalid},
		{"delete byte", []string{"a\x7fb"}, "", errKeyInvalid},
		{"non-ASCII", []string{"clé"}, "", errKeyInvalid},
		{"quoted non-ASCII", []string{`"clé"`}, "", errKeyInvalid},
		{"quoted control", []string{"\"a\tb\""}, "", errKeyInvalid},
		{"unterminated quote", []string{`"abc`}, "", errKeyInvalid},
		{"lone quote", []string{`"`}, "", errKeyInvalid},
		{"bad escape", []string{`"a\nb"`}, "", errKeyInvalid},
		{"trailing backslash", []string{`"ab\"`}, "", errKeyInvalid},
		{"bare inner quote", []string{`ab"c`}, "", errKeyInvalid},
		{"quoted inner quote", []string{`"a"b"`}, "", errKeyInvalid},
		{"parameters", []string{`"abc";p=1`}, "", errKeyInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseKey(tt.values)
			if err != tt.err || got != tt.want {
				t.Fatalf("parseKey(%q) = %q, %v; want %q, %v", tt.values, got, err, tt.want, tt.err)
			}
		})
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"a\"b"`, `"`, `""`, "a, b", `"a\\"`, "\x00", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		k, err := parseKey([]string{v})
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
		// The quoted form of every accepted key parses back to it.
		q := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
		if back, err := parseKey([]string{q}); err != nil || back != k {
			t.Fatalf("quoted %q parsed to %q, %v", q, back, err)
		}
	})
}
