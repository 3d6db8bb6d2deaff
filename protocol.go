package idemkey

import (
	"errors"
	"net/http"
	"strings"
)

// The protocol's header names.
const (
	// Header is the request header that carries the idempotency key, the
	// default of both halves.
	Header = "Idempotency-Key"
	// HeaderReplayed is "true" on a response that replays a kept one.
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderBodyOmitted is "true" on a replay whose body was not kept (it
	// was streamed, or larger than the capture limit).
	HeaderBodyOmitted = "Idempotent-Body-Omitted"
	// HeaderRequestID carries the id of the request a response answers.
	HeaderRequestID = "X-Request-Id"
)

// MaxKeyLength is the longest key accepted, in bytes after unquoting.
const MaxKeyLength = 255

// Mutation reports whether method is one the protocol covers by default:
// POST, PUT, PATCH and DELETE. Requests with these methods change state, so
// a lost reply leaves the client unsure whether the change happened.
func Mutation(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// Safe reports whether method is safe (RFC 9110 section 9.2.1): GET, HEAD,
// OPTIONS or TRACE. A safe request changes nothing and may be repeated
// without a key; it is never covered.
func Safe(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// Errors of ParseKey.
var (
	// ErrKeyMissing: the request has no key header.
	ErrKeyMissing = errors.New("idemkey: idempotency key missing")
	// ErrKeyInvalid: the key header is malformed.
	ErrKeyInvalid = errors.New("idemkey: idempotency key invalid")
)

// ParseKey reads the key from the values of the key header (as
// http.Header holds them). It accepts the IETF form, a structured-field
// string ("..." with \" and \\ escapes, RFC 9651 section 3.3.3), and the
// bare form many clients send. A valid key is 1 to MaxKeyLength printable
// ASCII characters after unquoting. No header is ErrKeyMissing. More than
// one header, an empty value, a bare value with a comma (two headers a
// proxy folded into one) or a double quote, a malformed quoted string,
// control or non-ASCII bytes are ErrKeyInvalid.
func ParseKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrKeyMissing
	case 1:
	default:
		return "", ErrKeyInvalid
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", ErrKeyInvalid
	}
	if v[0] == '"' {
		return parseQuoted(v)
	}
	if len(v) > MaxKeyLength || !bareKey(v) {
		return "", ErrKeyInvalid
	}
	return v, nil
}

// bareKey reports whether every byte of v may stand in a bare key:
// printable ASCII other than comma and double quote.
func bareKey(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c > 0x7e || c == ',' || c == '"' {
			return false
		}
	}
	return true
}

// parseQuoted parses a structured-field string that must make up the whole
// value.
func parseQuoted(v string) (string, error) {
	if len(v) < 3 || v[len(v)-1] != '"' {
		return "", ErrKeyInvalid
	}
	in := v[1 : len(v)-1]
	if strings.IndexByte(in, '\\') < 0 {
		if len(in) > MaxKeyLength || strings.IndexByte(in, '"') >= 0 || !printable(in) {
			return "", ErrKeyInvalid
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
				return "", ErrKeyInvalid
			}
			b.WriteByte(in[i])
		case c < 0x20 || c > 0x7e || c == '"':
			return "", ErrKeyInvalid
		default:
			b.WriteByte(c)
		}
	}
	if b.Len() == 0 || b.Len() > MaxKeyLength {
		return "", ErrKeyInvalid
	}
	return b.String(), nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// ValidKey reports whether k can be sent as a key: 1 to MaxKeyLength
// printable ASCII characters.
func ValidKey(k string) bool {
	return k != "" && len(k) <= MaxKeyLength && printable(k)
}

// FormatKey returns the header value that sends k, which must satisfy
// ValidKey: k itself when the bare form carries it unchanged (as Stripe's
// clients send keys), and the quoted structured-field string otherwise
// (a comma, a double quote, or a space at either end).
func FormatKey(k string) string {
	if bareKey(k) && k[0] != ' ' && k[len(k)-1] != ' ' {
		return k
	}
	var b strings.Builder
	b.Grow(len(k) + 4)
	b.WriteByte('"')
	for i := 0; i < len(k); i++ {
		if k[i] == '"' || k[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(k[i])
	}
	b.WriteByte('"')
	return b.String()
}
