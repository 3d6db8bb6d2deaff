package fingerprint

import (
	"bytes"
	"encoding/binary"
	"strings"
)

// bodyKind is how a body is canonicalised, decided by its media type.
type bodyKind uint8

const (
	rawBody  bodyKind = iota // anything else: the bytes as they are
	jsonBody                 // application/json and every +json type
	formBody                 // application/x-www-form-urlencoded
)

// tokenChar[b] reports whether b may appear in an RFC 9110 token.
var tokenChar = func() (t [256]bool) {
	for b := range 256 {
		t[b] = 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", byte(b)) >= 0
	}
	return t
}()

func lower(b byte) byte {
	if 'A' <= b && b <= 'Z' {
		return b + 'a' - 'A'
	}
	return b
}

// token returns the length of the token at the start of s.
func token(s string) int {
	i := 0
	for i < len(s) && tokenChar[s[i]] {
		i++
	}
	return i
}

func trimOWS(s string) string {
	return strings.TrimLeft(s, " \t")
}

// parseMediaType reads a Content-Type value (RFC 9110 section 8.3):
// type "/" subtype *( OWS ";" OWS [ name "=" ( token / quoted-string ) ] ).
// It appends to dst the canonical media type field: the length-prefixed
// type/subtype in lower case, then the parameters sorted by name (see
// pairs.appendSorted) with names in lower case, quoted values without their
// quotes (escapes kept as written) and the value of charset in lower case. It returns the body kind the media type
// calls for, and false (with dst unchanged) when v does not follow the
// grammar. An empty v is the empty media type without parameters.
func parseMediaType(dst []byte, p *pairs, v string) ([]byte, bodyKind, bool) {
	p.reset()
	s := strings.TrimRight(trimOWS(v), " \t")
	if s == "" {
		return binary.BigEndian.AppendUint64(dst, 0), rawBody, true
	}
	n := token(s)
	if n == 0 || n == len(s) || s[n] != '/' {
		return dst, rawBody, false
	}
	m := token(s[n+1:])
	if m == 0 {
		return dst, rawBody, false
	}
	typ := s[:n+1+m]
	s = s[n+1+m:]

	for {
		s = trimOWS(s)
		if s == "" {
			break
		}
		if s[0] != ';' {
			return dst, rawBody, false
		}
		s = trimOWS(s[1:])
		if s == "" || s[0] == ';' {
			continue // an empty parameter
		}
		n := token(s)
		if n == 0 || n == len(s) || s[n] != '=' {
			return dst, rawBody, false
		}
		ns := len(p.buf)
		for i := range n {
			p.buf = append(p.buf, lower(s[i]))
		}
		charset := string(p.buf[ns:]) == "charset"
		vs := len(p.buf)
		s = s[n+1:]
		if s != "" && s[0] == '"' {
			// The quoted text is kept as written, escapes included:
			// readers disagree on what a backslash escapes (mime keeps it
			// before anything but a tspecial), so "a\b" and "ab" stay
			// different.
			i := 1
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' {
					i++
				}
				if i == len(s) || s[i] < 0x20 && s[i] != '\t' || s[i] == 0x7f {
					return dst, rawBody, false
				}
			}
			if i >= len(s) {
				return dst, rawBody, false // no closing quote
			}
			p.buf = append(p.buf, s[1:i]...)
			s = s[i+1:]
		} else {
			m := token(s)
			if m == 0 {
				return dst, rawBody, false
			}
			p.buf = append(p.buf, s[:m]...)
			s = s[m:]
		}
		if charset {
			for i := vs; i < len(p.buf); i++ {
				p.buf[i] = lower(p.buf[i])
			}
		}
		p.add(ns, vs, vs, len(p.buf))
	}

	dst = binary.BigEndian.AppendUint64(dst, uint64(len(typ)))
	start := len(dst)
	dst = append(dst, typ...)
	for i := start; i < len(dst); i++ {
		dst[i] = lower(dst[i])
	}
	kind := rawBody
	switch mt := dst[start:]; {
	case string(mt) == "application/json" || bytes.HasSuffix(mt, []byte("+json")):
		kind = jsonBody
	case string(mt) == "application/x-www-form-urlencoded":
		kind = formBody
	}
	return p.appendSorted(dst), kind, true
}
