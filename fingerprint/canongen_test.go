package fingerprint

import (
	"math/rand/v2"
	"strconv"
	"strings"
)

// genJSON returns a random document, most often valid JSON: objects and
// arrays nested at random, members out of order, names that fold alike or
// share long prefixes, duplicates, every kind of escape, characters outside
// ASCII, lone surrogates, bytes that are not UTF-8, numbers of every shape,
// whitespace, now and then a large or a deep document, and now and then a
// document cut short or with a byte changed, inserted or dropped.
func genJSON(rng *rand.Rand) []byte {
	g := &jsonGen{rng: rng, space: []int{0, 0, 0, 2, 8}[rng.IntN(5)]}
	g.budget = []int{32, 200, 1000, 4000}[rng.IntN(4)]
	g.strict = rng.IntN(2) == 0
	switch rng.IntN(200) {
	case 0: // deep, around MaxDepth
		g.deep = MaxDepth - 3 + rng.IntN(6)
	case 1: // large: objects past maxRewrite, hashed in several chunks
		g.large, g.strict = true, true
		g.budget = 100000
	}
	g.ws()
	if g.deep > 0 {
		g.deepValue(g.deep)
	} else {
		g.value(0)
	}
	g.ws()
	b := g.b
	switch rng.IntN(16) {
	case 0: // cut short
		b = b[:rng.IntN(len(b)+1)]
	case 1: // a byte changed
		if len(b) > 0 {
			b[rng.IntN(len(b))] = g.oddByte()
		}
	case 2: // a byte inserted
		i := rng.IntN(len(b) + 1)
		b = append(b[:i], append([]byte{g.oddByte()}, b[i:]...)...)
	case 3: // a byte dropped
		if len(b) > 0 {
			i := rng.IntN(len(b))
			b = append(b[:i], b[i+1:]...)
		}
	}
	return b
}

type jsonGen struct {
	rng   *rand.Rand
	b     []byte
	space int // whitespace between tokens: none, or one chance in space
	// budget is the size past which containers close and hold no more.
	budget int
	// strict leaves out the invalid tokens, which a large document would
	// otherwise be all but sure to hold.
	strict bool
	deep   int
	large  bool
}

func (g *jsonGen) oddByte() byte {
	const odd = "\"\\{}[],:0-.eEu \t\n\r\x00\x1f\x7f\x80\xc3\xed\xff/aAzZ_"
	if g.rng.IntN(4) == 0 {
		return byte(g.rng.IntN(256))
	}
	return odd[g.rng.IntN(len(odd))]
}

// ws writes insignificant whitespace, now and then.
func (g *jsonGen) ws() {
	if g.space == 0 || g.rng.IntN(g.space) != 0 {
		return
	}
	for range 1 + g.rng.IntN(3) {
		g.b = append(g.b, " \t\n\r"[g.rng.IntN(4)])
	}
}

func (g *jsonGen) value(depth int) {
	r := g.rng.IntN(100)
	switch {
	case depth > 5 || r < 30 || len(g.b) > g.budget:
		g.scalar()
	case r < 70:
		g.object(depth)
	default:
		g.array(depth)
	}
}

func (g *jsonGen) deepValue(n int) {
	if n == 0 {
		g.scalar()
		return
	}
	if g.rng.IntN(2) == 0 {
		g.b = append(g.b, '[')
		g.ws()
		g.deepValue(n - 1)
		g.ws()
		g.b = append(g.b, ']')
		return
	}
	// Two members, out of order, the second holding the rest.
	g.b = append(g.b, `{"b":0,"a":`...)
	g.deepValue(n - 1)
	g.b = append(g.b, '}')
}

func (g *jsonGen) object(depth int) {
	var n int
	switch r := g.rng.IntN(20); {
	case r < 2:
		n = 0
	case r < 16:
		n = 1 + g.rng.IntN(4)
	case r < 19:
		n = 5 + g.rng.IntN(12) // past the insertion sort's twelve
	default:
		n = 17 + g.rng.IntN(30)
	}
	if g.large && depth < 2 {
		n = 20 + g.rng.IntN(40)
	}
	var names [][]byte
	g.b = append(g.b, '{')
	g.ws()
	for i := range n {
		if i > 1 && len(g.b) > g.budget {
			break
		}
		if i > 0 {
			g.b = append(g.b, ',')
			g.ws()
		}
		var name []byte
		if len(names) > 0 && g.rng.IntN(8) == 0 {
			// A duplicate, or the same name spelled another way.
			name = names[g.rng.IntN(len(names))]
			if g.rng.IntN(2) == 0 {
				name = respellName(name, g.rng)
			}
		} else {
			name = g.name()
		}
		names = append(names, name)
		g.b = append(g.b, '"')
		g.b = append(g.b, name...)
		g.b = append(g.b, '"')
		g.ws()
		g.b = append(g.b, ':')
		g.ws()
		g.value(depth + 1)
		g.ws()
	}
	g.b = append(g.b, '}')
}

func (g *jsonGen) array(depth int) {
	n := g.rng.IntN(6)
	if g.large && depth == 0 {
		n = 20 + g.rng.IntN(100)
	}
	g.b = append(g.b, '[')
	g.ws()
	for i := range n {
		if i > 1 && len(g.b) > g.budget {
			break
		}
		if i > 0 {
			g.b = append(g.b, ',')
			g.ws()
		}
		g.value(depth + 1)
		g.ws()
	}
	g.b = append(g.b, ']')
}

func (g *jsonGen) scalar() {
	switch r := g.rng.IntN(100); {
	case r < 45:
		g.b = append(g.b, '"')
		g.b = append(g.b, g.text(g.rng.IntN(4) == 0)...)
		g.b = append(g.b, '"')
	case r < 80:
		g.b = append(g.b, g.number()...)
	default:
		lits := []string{"true", "false", "null", "tru", "nul", "falsey", "True"}
		i := g.rng.IntN(3)
		if !g.strict && g.rng.IntN(50) == 0 {
			i = 3 + g.rng.IntN(len(lits)-3)
		}
		g.b = append(g.b, lits[i]...)
	}
}

func (g *jsonGen) number() string {
	rng := g.rng
	if !g.strict && rng.IntN(200) == 0 {
		bad := []string{"01", "1.", "-", "1e", "1e+", "+1", ".5", "1.e3", "--1", "-a", "0x1", "1E-", "00", "-01.5"}
		return bad[rng.IntN(len(bad))]
	}
	digits := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteByte(byte('0' + rng.IntN(10)))
		}
		return b.String()
	}
	var s string
	if rng.IntN(4) == 0 {
		s = "-"
	}
	if rng.IntN(5) == 0 {
		s += "0"
	} else {
		s += strconv.Itoa(1+rng.IntN(9)) + digits(rng.IntN(12))
	}
	if rng.IntN(3) == 0 {
		s += "." + digits(1+rng.IntN(8))
	}
	if rng.IntN(5) == 0 {
		s += []string{"e", "E"}[rng.IntN(2)] + []string{"", "+", "-"}[rng.IntN(3)] + digits(1+rng.IntN(3))
	}
	return s
}

// name returns the contents of a member name: most often short plain
// ASCII, as most documents have, but also names around a word's length,
// with '_' and '-', escapes, characters outside ASCII and invalid bytes.
func (g *jsonGen) name() []byte {
	rng := g.rng
	common := []string{"id", "ID", "Id", "sku", "qty", "name", "email", "amount", "currency",
		"description", "metadata_id", "metadataId", "user_id", "user-id", "userID", "a", "b", "c",
		"z", "A", "_a", "a_", "abcdefg", "abcdefgh", "abcdefghi", "ABCDEFGH", "abcdefgh_",
		"abcdefghijklmnop", "abcdefghijklmnopq", "abcdefghijklmno", "K", "k", "\u212a", "ß", "ſ",
		"é", "É", "Σ", "σ", "ς", "ﬀ", "", "_", "-", "__", "a b", "@", "[", "`", "{", "~", "\x7f"}
	switch r := rng.IntN(10); {
	case r < 5:
		return []byte(common[rng.IntN(len(common))])
	case r < 8:
		// Plain ASCII of any length up to three words, letters most often.
		n := rng.IntN(25)
		b := make([]byte, n)
		for i := range b {
			switch rng.IntN(10) {
			case 0:
				b[i] = "_-"[rng.IntN(2)]
			case 1:
				for b[i] = byte(0x20 + rng.IntN(0x5f)); b[i] == '"' || b[i] == '\\'; {
					b[i] = byte(0x20 + rng.IntN(0x5f))
				}
			default:
				b[i] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"[rng.IntN(62)]
			}
		}
		return b
	default:
		return g.text(true)
	}
}

// text returns the contents of a string: runs of plain ASCII of every
// length, and when odd is set escapes of every kind, characters outside
// ASCII, surrogates paired and alone, bytes that are not UTF-8 and, rarely,
// a raw control character (invalid).
func (g *jsonGen) text(odd bool) []byte {
	rng := g.rng
	var b []byte
	parts := 1 + rng.IntN(4)
	if g.large && rng.IntN(64) == 0 {
		b = append(b, strings.Repeat("x", 3000+rng.IntN(3000))...)
	}
	for range parts {
		n := rng.IntN(20)
		for range n {
			b = append(b, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:;!?_-/@{}[]~"[rng.IntN(78)])
		}
		if !odd {
			continue
		}
		hex := func(r int) string {
			s := strconv.FormatInt(int64(r), 16)
			s = strings.Repeat("0", 4-len(s)) + s
			if rng.IntN(2) == 0 {
				s = strings.ToUpper(s)
			}
			return `\u` + s
		}
		switch rng.IntN(22) {
		case 0:
			b = append(b, []string{`\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`}[rng.IntN(8)]...)
		case 1:
			b = append(b, hex(rng.IntN(0x80))...)
		case 2:
			b = append(b, hex(rng.IntN(0x20))...)
		case 3:
			b = append(b, hex(0x80+rng.IntN(0xd800-0x80))...)
		case 4:
			b = append(b, hex(0xe000+rng.IntN(0x2000))...)
		case 5: // a pair
			b = append(b, hex(0xd800+rng.IntN(0x400))+hex(0xdc00+rng.IntN(0x400))...)
		case 6: // alone, or two highs, or low then high
			b = append(b, hex(0xd800+rng.IntN(0x800))...)
			if rng.IntN(2) == 0 {
				b = append(b, hex(0xd800+rng.IntN(0x800))...)
			}
		case 7:
			b = append(b, []string{"é", "É", "ß", "\u212a", "ſ", "Σσς", "ﬀ", "日本", "😀", "\u2028", "\ufffd", "\u00a0"}[rng.IntN(12)]...)
		case 8: // not UTF-8
			b = append(b, []string{"\xff", "\xc3", "\xed\xa0\x80", "\xf0\x9f\x98", "\x80", "\xc0\xaf", "\xf4\x90\x80\x80"}[rng.IntN(7)]...)
		case 9: // broken escapes, rarely
			if !g.strict && rng.IntN(16) == 0 {
				b = append(b, []string{`\u12`, `\x`, `\U0041`, `\u00g0`, "\x01", "\x1f", "\t", `\`}[rng.IntN(8)]...)
			}
		case 10:
			b = append(b, `\u0000`...)
		}
	}
	return b
}

// respellName returns a name that folds like name: its ASCII letters' case
// changed, '_' or '-' added, or a character written as \u00XX. Escapes
// and bytes outside ASCII are kept as they are.
func respellName(name []byte, rng *rand.Rand) []byte {
	var b []byte
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '\\':
			n := 2
			if i+1 < len(name) && name[i+1] == 'u' {
				n = 6
			}
			n = min(n, len(name)-i)
			b = append(b, name[i:i+n]...)
			i += n - 1
			continue
		case c >= 0x80:
			b = append(b, c)
			continue
		case 'a' <= c && c <= 'z' && rng.IntN(3) == 0:
			b = append(b, c-('a'-'A'))
		case 'A' <= c && c <= 'Z' && rng.IntN(3) == 0:
			b = append(b, c+('a'-'A'))
		case rng.IntN(8) == 0:
			b = append(b, `\u00`...)
			b = append(b, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&15])
		default:
			b = append(b, c)
		}
		if rng.IntN(10) == 0 {
			b = append(b, "_-"[rng.IntN(2)])
		}
	}
	return b
}
