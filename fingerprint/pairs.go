package fingerprint

import (
	"bytes"
	"encoding/binary"
	"slices"
)

// pair is one name/value pair decoded into pairs.buf.
type pair struct {
	nameStart, nameEnd, valueStart, valueEnd int
}

// pairs collects decoded name/value pairs (of a query, a form body or the
// parameters of a media type) and writes them in canonical order.
type pairs struct {
	buf  []byte
	list []pair
}

func (p *pairs) reset() {
	p.buf = p.buf[:0]
	p.list = p.list[:0]
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
