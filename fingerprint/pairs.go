package fingerprint

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strings"
)

// pair is one name/value pair decoded into pairs.buf.
type pair struct {
	nameStart, nameEnd, valueStart, valueEnd int
}

// pairs collects decoded name/value pairs (of a query or the parameters of
// a media type) and writes them in canonical order. For a form body it
// collects the segments as sent instead (see parseForm).
type pairs struct {
	buf  []byte
	list []pair
	// segs are the non-empty segments of a form body, and amps the number
	// of '&' in it.
	segs []segment
	amps int
}

// segment is one non-empty segment of a form body: start and end in the
// body, and its name as url.ParseQuery decodes it in pairs.buf.
type segment struct {
	start, end, nameStart, nameEnd int
}

func (p *pairs) reset() {
	p.buf = p.buf[:0]
	p.list = p.list[:0]
	p.segs = p.segs[:0]
	p.amps = 0
}

func (p *pairs) add(nameStart, nameEnd, valueStart, valueEnd int) {
	p.list = append(p.list, pair{nameStart, nameEnd, valueStart, valueEnd})
}

// appendSorted sorts the pairs by name, keeping the values of one name in
// their order, and appends each pair to dst as a length-prefixed name and a
// length-prefixed value: no two different lists of pairs write the same
// bytes.
func (p *pairs) appendSorted(dst []byte) []byte {
	buf := p.buf
	slices.SortStableFunc(p.list, func(a, b pair) int {
		return bytes.Compare(buf[a.nameStart:a.nameEnd], buf[b.nameStart:b.nameEnd])
	})
	for _, q := range p.list {
		dst = binary.BigEndian.AppendUint64(dst, uint64(q.nameEnd-q.nameStart))
		dst = append(dst, buf[q.nameStart:q.nameEnd]...)
		dst = binary.BigEndian.AppendUint64(dst, uint64(q.valueEnd-q.valueStart))
		dst = append(dst, buf[q.valueStart:q.valueEnd]...)
	}
	return dst
}

// parseQuery decodes s, a URL query or an application/x-www-form-urlencoded
// body, into p. It reads s exactly as net/url.ParseQuery does (pairs split on
// '&', empty pairs skipped, a pair without '=' has an empty value, '+' and
// percent escapes decoded in names and values), so two strings that parse
// to the same pairs in the same per-name order are the same. It reports
// false for a string ParseQuery rejects: a ';' in a pair or a malformed
// percent escape.
func parseQuery[S string | []byte](p *pairs, s S) bool {
	p.reset()
	for i := 0; i < len(s); {
		end := i
		for end < len(s) && s[end] != '&' {
			end++
		}
		seg := s[i:end]
		i = end + 1
		if len(seg) == 0 {
			continue
		}
		eq := len(seg)
		for j := 0; j < len(seg); j++ {
			if seg[j] == ';' {
				return false
			}
			if seg[j] == '=' && eq == len(seg) {
				eq = j
			}
		}
		ns := len(p.buf)
		if !unescape(p, seg[:eq]) {
			return false
		}
		vs := len(p.buf)
		if eq < len(seg) && !unescape(p, seg[eq+1:]) {
			return false
		}
		p.add(ns, vs, vs, len(p.buf))
	}
	return true
}

// unescape appends the query-component decoding of s to p.buf.
func unescape[S string | []byte](p *pairs, s S) bool {
	run := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '+':
			p.buf = append(append(p.buf, s[run:i]...), ' ')
			run = i + 1
		case '%':
			if i+2 >= len(s) {
				return false
			}
			hi, ok1 := unhex(s[i+1])
			lo, ok2 := unhex(s[i+2])
			if !ok1 || !ok2 {
				return false
			}
			p.buf = append(append(p.buf, s[run:i]...), hi<<4|lo)
			i += 2
			run = i + 1
		}
	}
	p.buf = append(p.buf, s[run:]...)
	return true
}

func unhex(b byte) (byte, bool) {
	switch {
	case '0' <= b && b <= '9':
		return b - '0', true
	case 'a' <= b && b <= 'f':
		return b - 'a' + 10, true
	case 'A' <= b && b <= 'F':
		return b - 'A' + 10, true
	}
	return 0, false
}

// parseForm reads body, an application/x-www-form-urlencoded body, into p
// for appendForm: its segments as sent, each with its name decoded. It
// reports false when the body must be covered as its raw bytes instead,
// because reordering its segments could change what a handler reads:
//
//   - url.ParseQuery rejects it (a ';', a malformed escape), so it is not
//     read as pairs at all;
//   - a segment starts (after spaces) with what starts a JSON value: '{',
//     '[', '"', '-', a digit, or the literal true, false or null. A handler
//     may decode JSON whatever the label (curl labels a body sent with -d
//     as a form), and json.Decoder reads the first value and ignores what
//     follows: {"a":1}&{"a":2}, 1&2 and null&a=1 each read differently
//     reordered;
//   - it holds a '<': encoding/xml skips to the first element anywhere in
//     the body and ignores what follows it (x=<a/>&y=2 reads an element,
//     y=2&x=<a/> fails on the '&');
//   - it holds a control byte (below 0x20, or 0x7f): form encoders escape
//     them all, so the body is binary or lines of text, read some other way.
//
// None of these is produced by a form encoder, which escapes them, except
// a name that starts with a digit, '-' or one of the literals.
func parseForm(p *pairs, body []byte) bool {
	p.reset()
	for i := 0; i <= len(body); {
		end := i
		for end < len(body) && body[end] != '&' {
			end++
		}
		seg := body[i:end]
		start := i
		i = end + 1
		if end < len(body) {
			p.amps++
		}
		if len(seg) == 0 {
			continue
		}
		if startsJSON(seg) {
			return false
		}
		eq := -1
		for j, b := range seg {
			switch {
			case b < 0x20 || b == 0x7f || b == '<' || b == ';':
				return false
			case b == '=' && eq < 0:
				eq = j
			}
		}
		name, value := seg, seg[:0]
		if eq >= 0 {
			name, value = seg[:eq], seg[eq+1:]
		}
		ns := len(p.buf)
		if !unescape(p, name) || !validEscapes(value) {
			return false
		}
		p.segs = append(p.segs, segment{start, end, ns, len(p.buf)})
	}
	return true
}

// startsJSON reports whether a JSON decoder reads a value (or a value's
// first token) from the start of seg, after JSON whitespace.
func startsJSON(seg []byte) bool {
	i := 0
	for i < len(seg) && (seg[i] == ' ' || seg[i] == '\t' || seg[i] == '\n' || seg[i] == '\r') {
		i++
	}
	if i == len(seg) {
		return false
	}
	switch c := seg[i]; {
	case c == '{' || c == '[' || c == '"' || c == '-' || '0' <= c && c <= '9':
		return true
	case c == 't':
		return bytes.HasPrefix(seg[i:], []byte("true"))
	case c == 'f':
		return bytes.HasPrefix(seg[i:], []byte("false"))
	case c == 'n':
		return bytes.HasPrefix(seg[i:], []byte("null"))
	}
	return false
}

// validEscapes reports whether every '%' in s starts an escape that
// url.QueryUnescape accepts.
func validEscapes[S string | []byte](s S) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '%' {
			if i+2 >= len(s) {
				return false
			}
			if _, ok := unhex(s[i+1]); !ok {
				return false
			}
			if _, ok := unhex(s[i+2]); !ok {
				return false
			}
			i += 2
		}
	}
	return true
}

// appendForm appends the canonical form of the body parseForm read: the
// number of '&' in it as a big-endian uint64 (url.ParseQuery skips empty
// segments but counts them against its limit on parameters), then each
// non-empty segment exactly as sent, length-prefixed, sorted stably by its
// decoded name. Segments whose names decode alike (a=1 and %61=2) keep
// their order, so each name's values stay in their order; escapes are never
// decoded, so a+b, a%20b and a b stay three bodies.
func (p *pairs) appendForm(dst, body []byte) []byte {
	return appendSegments(p, dst, body)
}

// appendSegments appends the segments of src that parseForm or
// parseQuerySegments read into p, as appendForm describes.
func appendSegments[S string | []byte](p *pairs, dst []byte, src S) []byte {
	buf := p.buf
	slices.SortStableFunc(p.segs, func(a, b segment) int {
		return bytes.Compare(buf[a.nameStart:a.nameEnd], buf[b.nameStart:b.nameEnd])
	})
	dst = binary.BigEndian.AppendUint64(dst, uint64(p.amps))
	for _, s := range p.segs {
		dst = binary.BigEndian.AppendUint64(dst, uint64(s.end-s.start))
		dst = append(dst, src[s.start:s.end]...)
	}
	return dst
}

// withoutEmptySegments returns the URL query q without its empty
// segments (a leading, trailing or doubled '&'), which no decoder tells
// from their absence: a=1&, &a=1 and a=1 are one query, and a=1&&b=2 is
// a=1&b=2. A query with none is returned as it is, without allocating.
func withoutEmptySegments(q string) string {
	if !hasEmptySegment(q) {
		return q
	}
	b := make([]byte, 0, len(q))
	for seg := range strings.SplitSeq(q, "&") {
		if seg == "" {
			continue
		}
		if len(b) > 0 {
			b = append(b, '&')
		}
		b = append(b, seg...)
	}
	return string(b)
}

// hasEmptySegment reports whether the non-empty URL query q has an empty
// '&'-separated segment.
func hasEmptySegment(q string) bool {
	return q != "" && (q[0] == '&' || q[len(q)-1] == '&' || strings.Contains(q, "&&"))
}

// plainQuery reports whether every segment of the URL query q reads the
// same decoded as sent, so that its decoded pairs are its raw pairs: each
// segment non-empty and holding a '=', and no '%', '+' or ';' anywhere.
// The empty query is plain.
func plainQuery(q string) bool {
	if q == "" {
		return true
	}
	for seg := range strings.SplitSeq(q, "&") {
		if seg == "" || strings.IndexByte(seg, '=') < 0 || strings.ContainsAny(seg, "%+;") {
			return false
		}
	}
	return true
}

// parseQuerySegments reads q, a URL query, into p for appendSegments: its
// segments as sent, each with its name decoded, as parseForm reads a form
// body. It reports false for a query url.ParseQuery rejects: a ';' in it or
// a malformed percent escape. Unlike a body, a query has no other reading
// that reordering its segments could change: a handler reads r.URL.Query()
// or r.URL.RawQuery.
func parseQuerySegments(p *pairs, q string) bool {
	p.reset()
	for i := 0; i <= len(q); {
		end := i
		for end < len(q) && q[end] != '&' {
			end++
		}
		seg := q[i:end]
		start := i
		i = end + 1
		if end < len(q) {
			p.amps++
		}
		if len(seg) == 0 {
			continue
		}
		if strings.IndexByte(seg, ';') >= 0 {
			return false
		}
		name, value, _ := strings.Cut(seg, "=")
		ns := len(p.buf)
		if !unescape(p, name) || !validEscapes(value) {
			return false
		}
		p.segs = append(p.segs, segment{start, end, ns, len(p.buf)})
	}
	return true
}
