package fingerprint

import (
	"encoding/binary"
	"math/bits"
	"slices"
	"unicode"
	"unicode/utf8"
)

// Member names: reading a name, and folding it the way a case-insensitive
// decoder matches names, to order an object's members (see CanonicalJSON).

// name reads the name of an object member at c.pos, writes its canonical
// form (left in the pending run when the name is canonical as it is) and
// its folded form to fold, and returns the folded form's foldKey.
func (c *canonJSON) name() (uint64, error) {
	src := c.src
	if p := c.pos; p+16 <= len(src) {
		// The commonest name, up to seven bytes of printable ASCII without
		// '_' or '-', is read and folded as one word: w holds the eight
		// bytes after the opening quote.
		w := binary.LittleEndian.Uint64(src[p+1:])
		if m := special(w) | w&hi8; m != 0 {
			n := firstFlagged(m)
			keep := uint64(1)<<(8*n) - 1 // the name's bytes of w
			if src[p+1+n] == '"' && dashes(w)&keep == 0 {
				// One word is stored whole past the end of fold.
				c.pos = p + n + 2
				// Folding drops nothing here: it upper-cases letters. The
				// key is the folded name read big-endian, zero-padded.
				folded := upperASCII(w) & keep
				fold := slices.Grow(c.fold, 8)
				f := len(fold)
				binary.LittleEndian.PutUint64(fold[f:f+8], folded)
				c.fold = fold[:f+n]
				return bits.ReverseBytes64(folded), nil
			}
		}
	}
	// The name's end, a word at a time up to the first byte that is not
	// printable ASCII or is '"' or '\\'.
	i := c.pos + 1
	for {
		if i+8 > len(src) {
			for i < len(src) && asciiName[src[i]] {
				i++
			}
			break
		}
		w := binary.LittleEndian.Uint64(src[i:])
		if m := special(w) | w&hi8; m != 0 {
			i += firstFlagged(m)
			break
		}
		i += 8
	}
	if i >= len(src) || src[i] != '"' {
		// An escape, a byte that is not ASCII, or an error: folded from
		// its canonical form, copied to out.
		c.flush()
		start, foldStart := len(c.out), len(c.fold)
		if err := c.str(); err != nil {
			return 0, err
		}
		c.flush()
		c.fold = appendFoldedName(c.fold, c.out[start+1:len(c.out)-1])
		return foldKey(c.fold[foldStart:]), nil
	}
	// Printable ASCII only: the name is its own canonical form, folded a
	// word at a time where the word has no '_' or '-' to drop. Whole words
	// are stored, so fold has eight bytes of room past the name.
	name := src[c.pos+1 : i]
	c.pos = i + 1
	fold := slices.Grow(c.fold, len(name)+8)
	j0 := len(fold)
	j := j0
	fold = fold[:j0+len(name)+8]
	for len(name) >= 8 {
		w := binary.LittleEndian.Uint64(name)
		if dashes(w) == 0 {
			binary.LittleEndian.PutUint64(fold[j:], upperASCII(w))
			j += 8
		} else {
			j = appendFoldedASCII(fold, j, name[:8])
		}
		name = name[8:]
	}
	j = appendFoldedASCII(fold, j, name)
	c.fold = fold[:j]
	// The key: the folded name's first eight bytes, those past its end
	// cleared.
	key := binary.BigEndian.Uint64(fold[j0:])
	if n := j - j0; n < 8 {
		key &^= 1<<(64-8*n) - 1
	}
	return key, nil
}

// appendFoldedASCII writes the folded form of name, printable ASCII, to
// fold from j on, and returns where it ends.
func appendFoldedASCII(fold []byte, j int, name []byte) int {
	for _, b := range name {
		f := foldASCII[b]
		fold[j] = f
		if f != 0 {
			j++
		}
	}
	return j
}

// dashes flags the bytes of w that are '_' or '-' the way special flags
// its bytes: only the lowest set bit is sure to flag one.
func dashes(w uint64) uint64 {
	u := w ^ (lo8 * '_')
	d := w ^ (lo8 * '-')
	return ((u-lo8)&^u | (d-lo8)&^d) & hi8
}

// upperASCII returns w with every byte from 'a' to 'z' in upper case, for
// the bytes of w up to the first that is 0x80 or more (a carry from that
// one on may change the bytes after it).
func upperASCII(w uint64) uint64 {
	ge := w + lo8*(0x80-'a')   // high bit set where a byte is 'a' or more
	gt := w + lo8*(0x80-'z'-1) // high bit set where a byte is past 'z'
	return w - (ge&^gt&hi8)>>2 // 0x80>>2 is the 0x20 between the cases
}

// asciiName[b] reports whether b is printable ASCII that stands for itself
// inside a JSON string.
var asciiName = func() (t [256]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// appendFoldedName appends the folded form of name, the contents of a
// canonical string without its quotes: decoded, with invalid UTF-8 and lone
// surrogates read as U+FFFD, '_' and '-' dropped and every letter replaced
// by the smallest rune of its case-folding orbit (so ASCII letters become
// upper case). Two names fold to the same bytes exactly when encoding/json's
// case-insensitive matching (v1 and v2, which also ignores '_' and '-') can
// take one for the other.
func appendFoldedName(dst, name []byte) []byte {
	for i := 0; i < len(name); {
		b := name[i]
		if f := foldASCII[b]; f != 0xff {
			if f != 0 {
				dst = append(dst, f)
			}
			i++
			continue
		}
		if b == '\\' {
			// The canonical form has only \" \\ \b \f \n \r \t, \u00XX for
			// control characters, and \udXXX for lone surrogates.
			var r rune
			switch name[i+1] {
			case 'b':
				r = '\b'
			case 'f':
				r = '\f'
			case 'n':
				r = '\n'
			case 'r':
				r = '\r'
			case 't':
				r = '\t'
			case 'u':
				r, _ = hex4(name[i:])
				if isSurrogate(r) {
					r = utf8.RuneError
				}
				i += 4
			default:
				r = rune(name[i+1])
			}
			i += 2
			dst = appendFoldedRune(dst, r)
			continue
		}
		if b < utf8.RuneSelf {
			dst = appendFoldedRune(dst, rune(b))
			i++
			continue
		}
		r, n := utf8.DecodeRune(name[i:])
		dst = appendFoldedRune(dst, r)
		i += n
	}
	return dst
}

// foldASCII[b] is what appendFoldedName writes for the byte b of a
// canonical name: 0 for nothing ('_' and '-'), 0xff when b starts an escape
// or a multi-byte sequence.
var foldASCII = func() (t [256]byte) {
	for b := range 256 {
		switch {
		case b == '\\' || b >= utf8.RuneSelf:
			t[b] = 0xff
		case b == '_' || b == '-':
			t[b] = 0
		case 'a' <= b && b <= 'z':
			t[b] = byte(b) - ('a' - 'A')
		default:
			t[b] = byte(b)
		}
	}
	return t
}()

func appendFoldedRune(dst []byte, r rune) []byte {
	if r < utf8.RuneSelf {
		switch {
		case r == '_' || r == '-':
			return dst
		case 'a' <= r && r <= 'z':
			r -= 'a' - 'A'
		}
		return append(dst, byte(r))
	}
	return utf8.AppendRune(dst, foldRune(r))
}

// foldRune returns the smallest rune in r's case-folding orbit.
func foldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}
