package fingerprint

import (
	"encoding/binary"
	"math/bits"
	"unicode/utf8"
)

// Strings: reading a JSON string and writing it back the one canonical way
// (see CanonicalJSON), eight bytes at a time where no byte needs care.

// plain[b] reports whether b stands for itself inside a JSON string.
var plain = func() (t [256]bool) {
	for b := 0x20; b < 256; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

const hexDigits = "0123456789abcdef"

const (
	lo8 = 0x0101010101010101
	hi8 = 0x8080808080808080
)

// special flags the bytes of w (eight bytes loaded little-endian) that are
// control characters, '"' or '\\': its lowest set bit is the high bit of
// the first such byte, and it is zero when there is none. Each term is the
// classic test for a small byte (v-n..) &^ v & 0x80..: a byte that passes
// borrows from the next one, so bits above the lowest set one may flag
// bytes that are not special, but no byte below the first special one is
// ever flagged.
func special(w uint64) uint64 {
	q := w ^ (lo8 * '"')
	b := w ^ (lo8 * '\\')
	return ((w-lo8*0x20)&^w | (q-lo8)&^q | (b-lo8)&^b) & hi8
}

// firstFlagged returns the index of the byte whose high bit is the lowest
// set bit of m, which is not zero.
func firstFlagged(m uint64) int { return bits.TrailingZeros64(m) >> 3 }

// str reads a string at c.pos and writes its canonical form: its bytes
// stay in the pending run up to an escape written another way.
func (c *canonJSON) str() error {
	src := c.src
	i := c.pos + 1
	for {
		// Eight bytes at a time to the first special one, then one by one
		// near the end.
		for {
			if i+8 > len(src) {
				for i < len(src) && plain[src[i]] {
					i++
				}
				break
			}
			if m := special(binary.LittleEndian.Uint64(src[i:])); m != 0 {
				i += firstFlagged(m)
				break
			}
			i += 8
		}
		if i >= len(src) {
			c.pos = i
			return ErrInvalidJSON
		}
		switch src[i] {
		case '"':
			c.pos = i + 1
			return nil
		case '\\':
			c.pos = i
			n, err := c.escape(src[i:])
			if err != nil {
				return err
			}
			i += n
		default: // a control character
			c.pos = i
			return ErrInvalidJSON
		}
	}
}

// escape writes the canonical form of the escape sequence at the start of
// s, which is src[c.pos:], and returns its length. An escape the canonical
// form keeps as it is stays in the pending run; any other ends the run
// before it, and the run starts again after it.
func (c *canonJSON) escape(s []byte) (int, error) {
	if len(s) < 2 {
		return 0, ErrInvalidJSON
	}
	switch s[1] {
	case '"', '\\', 'b', 'f', 'n', 'r', 't':
		return 2, nil
	case '/':
		c.flush()
		c.out = append(c.out, '/')
		c.run = c.pos + 2
		return 2, nil
	case 'u':
		r, ok := hex4(s)
		if !ok {
			return 0, ErrInvalidJSON
		}
		c.flush()
		if !isSurrogate(r) {
			c.out = appendCanonicalRune(c.out, r)
			c.run = c.pos + 6
			return 6, nil
		}
		if r < 0xdc00 { // a high surrogate: is a low one next?
			if r2, ok := hex4(s[6:]); ok && 0xdc00 <= r2 && r2 <= 0xdfff {
				c.out = utf8.AppendRune(c.out, 0x10000+(r-0xd800)<<10+(r2-0xdc00))
				c.run = c.pos + 12
				return 12, nil
			}
		}
		c.out = append(c.out, '\\', 'u',
			hexDigits[r>>12], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
		c.run = c.pos + 6
		return 6, nil
	}
	return 0, ErrInvalidJSON
}

func isSurrogate(r rune) bool { return 0xd800 <= r && r <= 0xdfff }

// hex4 decodes the \uXXXX escape at the start of s.
func hex4(s []byte) (rune, bool) {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return 0, false
	}
	var r rune
	for _, b := range s[2:6] {
		switch {
		case '0' <= b && b <= '9':
			b -= '0'
		case 'a' <= b && b <= 'f':
			b -= 'a' - 10
		case 'A' <= b && b <= 'F':
			b -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(b)
	}
	return r, true
}

// appendCanonicalRune writes r, which is not a surrogate, the one way the
// canonical form writes it inside a string.
func appendCanonicalRune(dst []byte, r rune) []byte {
	switch r {
	case '"', '\\':
		return append(dst, '\\', byte(r))
	case '\b':
		return append(dst, '\\', 'b')
	case '\f':
		return append(dst, '\\', 'f')
	case '\n':
		return append(dst, '\\', 'n')
	case '\r':
		return append(dst, '\\', 'r')
	case '\t':
		return append(dst, '\\', 't')
	}
	if r < 0x20 {
		return append(dst, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xf])
	}
	return utf8.AppendRune(dst, r)
}
