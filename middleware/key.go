package middleware

import (
	"errors"
	"strings"
)

// MaxKeyLength is the longest key accepted, in bytes after unquoting.
const MaxKeyLength = 255

var (
	errKeyMissing = errors.New("missing")
	errKeyInvalid = errors.New("invalid")
)

// parseKey reads the key from the values of the key header. It accepts the
// IETF form, a structured-field string ("..." with \" and \\ escapes), and
// the bare form many clients send. A valid key is 1 to MaxKeyLength
// printable ASCII characters after unquoting. More than one header, an empty
// value, a bare value with a comma (two headers a proxy folded into one), a
// malformed quoted string, control or non-ASCII bytes are all invalid.
func parseKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", errKeyMissing
	case 1:
	default:
		return "", errKeyInvalid
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", errKeyInvalid
	}
	if v[0] == '"' {
		return parseQuoted(v)
	}
	if len(v) > MaxKeyLength {
		return "", errKeyInvalid
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c > 0x7e || c == ',' || c == '"' {
			return "", errKeyInvalid
		}
	}
	return v, nil
}

// parseQuoted parses a structured-field string (RFC 9651 section 3.3.3)
// that must make up the whole value.
func parseQuoted(v string) (string, error) {
	if len(v) < 3 || v[len(v)-1] != '"' {
		return "", errKeyInvalid
	}
	in := v[1 : len(v)-1]
	if strings.IndexByte(in, '\\') < 0 {
		if len(in) > MaxKeyLength {
			return "", errKeyInvalid
		}
		for i := 0; i < len(in); i++ {
			if c := in[i]; c < 0x20 || c > 0x7e || c == '"' {
				return "", errKeyInvalid
			}
		}
		return in, nil
	}
	var b strings.Builder
	b.Grow(len(in))
	for i := 0; i < len(in); i++ {
		c := in[i]
		switch {
		case c == '\\':
			i++
			if i == len(in) || (in[i] != '"' && in[i] != '\\') {
				return "", errKeyInvalid
			}
			b.WriteByte(in[i])
		case c < 0x20 || c > 0x7e || c == '"':
			return "", errKeyInvalid
		default:
			b.WriteByte(c)
		}
	}
	if b.Len() == 0 || b.Len() > MaxKeyLength {
		return "", errKeyInvalid
	}
	return b.String(), nil
}
