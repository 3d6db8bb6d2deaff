package fingerprint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"mime"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

var jsonSeeds = []string{
	`{}`, `[]`, `null`, `true`, `0`, `-0.0e-0`, `""`,
	`{"b":1,"a":2}`,
	`{"a":1,"a":2}`,
	`{"a":2,"a":1}`,
	`{"id":1,"ID":2,"user_id":3,"userId":4,"x":5}`,
	`{"K":1,"\u212a":2,"k":3}`,
	`{"b":{"d":[1,{"f":0,"e":1}],"c":null},"a":[{"z":0,"y":0}]}`,
	`"\u0041\/\"\\\b\f\n\r\t\u0000\u001f\u007f\u00e9\uD83D\uDE00"`,
	`"\ud800\udc00\ud800\ud800\udc00\udc00\uDBFF"`,
	"\"\xff\xfe\xed\xa0\x80\"",
	`{"\ufffd":1,"\ud800":2,"` + "\xff" + `":3}`,
	`[1, 1.0, 1e2, 1E2, 100, -0, 0.5e-3]`,
	" {\n\t\"a\" : [ 1 , 2 ] ,\r\n \"b\" : { } }\n",
	`{"a":1,}`, `[1,]`, `01`, `"\u12"`, `{"a"}`, "\"a\x01\"",
	`{"b":[{"y":"\u00e9","x":[1,{"q":0,"p":"\ud834\udd1e"}]}],"a":{"c":-1.5E-3}}`,
	`{"\u0062":1,"a\/b":2,"A":3,"a":4,"_a":5,"\u0000":6,"\"":7}`,
	`[{"b":1,"a":{"d":{"f":1,"e":2},"c":3}},{"z":{},"y":[]}]`,
	string(benchJSON(400)),
	// Names read a word at a time: up to seven bytes, with and without
	// '_' or '-', near the end of the input and far from it.
	`{"sku":"item-1","qty":2,"a_b":1,"A-B":2,"ab":3,"abcdefg":4,"abcdefgh":5,"Qty":6}`,
	`[{"b":1,"a":2},{"zz":{"y":1,"x":2}},{"k":1}]`,
	`{"z":1,"y":2}`,
	strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth),
	strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1),
}

// decodeJSON decodes src the way a handler using encoding/json would,
// keeping numbers as their literal text.
func decodeJSON(src []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(src))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s), uint64(1))
	}
	f.Fuzz(func(t *testing.T, src []byte, seed uint64) {
		orig := bytes.Clone(src)
		out, err := CanonicalJSON(nil, src)
		again, err2 := CanonicalJSON([]byte("x"), src)
		if !bytes.Equal(src, orig) {
			// The first pass reads a canonical text in place.
			t.Fatalf("CanonicalJSON changed its input %q to %q", orig, src)
		}
		if (err == nil) != (err2 == nil) || err == nil && string(again[1:]) != string(out) {
			t.Fatalf("not deterministic: %q, %v then %q, %v", out, err, again, err2)
		}
		valid := json.Valid(src)
		switch {
		case err == nil && !valid:
			t.Fatalf("accepted %q, which encoding/json rejects", src)
		case errors.Is(err, ErrInvalidJSON) && valid:
			t.Fatalf("rejected %q, which encoding/json accepts: %v", src, err)
		case err != nil && !errors.Is(err, ErrInvalidJSON) && !errors.Is(err, ErrTooDeep):
			t.Fatalf("error %v wraps neither sentinel", err)
		}
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("canonical form %q of %q is not valid JSON", out, src)
		}
		if len(out) > len(src) {
			t.Fatalf("canonical form %q is longer than %q", out, src)
		}
		if twice, err := CanonicalJSON(nil, out); err != nil || !bytes.Equal(twice, out) {
			t.Fatalf("not idempotent: %q -> %q -> %q, %v", src, out, twice, err)
		}
		// A handler decoding either sees the same value.
		v1, err1 := decodeJSON(src)
		v2, err2 := decodeJSON(out)
		if err1 != nil || err2 != nil {
			t.Fatalf("decode: %v, %v", err1, err2)
		}
		if !reflect.DeepEqual(v1, v2) {
			t.Fatalf("%q and its canonical form %q decode differently:\n%#v\n%#v", src, out, v1, v2)
		}
		// Reordering members, changing whitespace and spelling characters
		// as escapes never changes the canonical form.
		n := parseTree(src)
		rng := rand.New(rand.NewPCG(seed, uint64(len(src))))
		for range 3 {
			var b bytes.Buffer
			n.write(&b, rng)
			re, err := CanonicalJSON(nil, b.Bytes())
			if err != nil {
				t.Fatalf("rewritten %q of %q: %v", b.Bytes(), src, err)
			}
			if !bytes.Equal(re, out) {
				t.Fatalf("rewriting %q as %q changed the canonical form:\n%q\n%q", src, b.Bytes(), out, re)
			}
		}
	})
}

func FuzzFingerprint(f *testing.F) {
	for i, s := range jsonSeeds {
		other := jsonSeeds[(i+1)%len(jsonSeeds)]
		f.Add("application/json", "a=1&b=2", "b=2&a=1", []byte(s), []byte(other))
	}
	f.Add("application/json", "", "", []byte(`{"a":1,"b":[1,2]}`), []byte(`{"b":[1,2],"a":1}`))
	f.Add("application/json", "", "", []byte(`{"a":1.0}`), []byte(`{"a":1}`))
	f.Add("application/problem+json; charset=UTF-8", "", "", []byte(`{"a":"\u0041"}`), []byte(`{"a":"A"}`))
	f.Add("application/x-www-form-urlencoded", "a=%41&a=b", "a=A&a=b", []byte("a=1&b=2&a=3"), []byte("b=2&a=1&a=3"))
	f.Add("application/x-www-form-urlencoded", "", "", []byte(`{"name":"a+b"}`), []byte(`{"name":"a b"}`))
	f.Add("application/x-www-form-urlencoded; charset=utf-8", "", "", []byte("%61=1&b=2&a=3&"), []byte("b=2&&%61=1&a=3"))
	f.Add("application/x-www-form-urlencoded", "", "", []byte("x=<a/>&y=2"), []byte("y=2&x=<a/>"))
	f.Add("application/x-www-form-urlencoded", "a=1&a=2", "a=2&a=1", []byte("x=1;y=2"), []byte("x=%zz"))
	f.Add("text/plain; charset=\"utf-8\"; format=flowed", "q=%", "q=+", []byte("hello"), []byte("hello "))
	f.Add("multipart/form-data; boundary=ab", "", "", []byte("--ab--"), []byte("--ab--"))
	f.Add("application/json;", "a", "a=", []byte(`{}`), []byte(`{}`))
	f.Add("", "a=%20", "a=+", []byte(nil), []byte(nil))
	f.Add("", "a=1%26b=2", "a=1&b=2", []byte(nil), []byte(nil))
	f.Add("", "b=%41&&a", "a&&b=%41", []byte(nil), []byte(nil))
	f.Fuzz(func(t *testing.T, ct, q1, q2 string, a, b []byte) {
		sum := func(q string, body []byte) [32]byte { return Sum("POST", "/p", q, ct, body) }
		sa := sum(q1, a)
		if sa != sum(q1, a) {
			t.Fatal("not deterministic")
		}
		s := getScratch()
		_, kind, ctOK := parseMediaType(nil, &s.pairs, ct)
		putScratch(s)
		if !ctOK {
			kind = rawBody
		}

		// Queries: the same exactly when the model reads them alike (their
		// segments as sent, in order among those whose names decode alike),
		// and never for two that url.ParseQuery reads differently.
		if got, want := sum(q1, a) == sum(q2, a), queryModel(q1) == queryModel(q2); got != want {
			t.Fatalf("queries %q and %q: same fingerprint = %v, read alike = %v", q1, q2, got, want)
		}
		v1, err1 := url.ParseQuery(q1)
		v2, err2 := url.ParseQuery(q2)
		if sum(q1, a) == sum(q2, a) && (q1 != q2) && ((err1 == nil) != (err2 == nil) || !reflect.DeepEqual(v1, v2)) {
			t.Fatalf("queries %q and %q url.ParseQuery reads differently share a fingerprint", q1, q2)
		}
		if err1 == nil {
			if p := string(permuteNames([]byte(q1), rand.New(rand.NewPCG(uint64(len(q1)), 1)))); sum(p, a) != sa {
				t.Fatalf("query %q and its reordering %q differ", q1, p)
			}
		}

		// Media types agree with mime.ParseMediaType where both read one.
		checkMediaType(t, ct)

		same := sum(q1, a) == sum(q1, b)
		switch kind {
		case rawBody:
			if same != bytes.Equal(a, b) {
				t.Fatalf("raw bodies %q and %q: same fingerprint = %v", a, b, same)
			}
		case formBody:
			// Exactly the bodies the model reads alike share a fingerprint.
			if want := formModel(a) == formModel(b); same != want {
				t.Fatalf("forms %q and %q: same fingerprint = %v, read alike = %v", a, b, same, want)
			}
		case jsonBody:
			ca, erra := CanonicalJSON(nil, a)
			_, errb := CanonicalJSON(nil, b)
			switch {
			case erra == nil && errb == nil:
				if sum(q1, ca) != sa {
					t.Fatalf("%q and its canonical form %q differ", a, ca)
				}
				va, _ := decodeJSON(a)
				vb, _ := decodeJSON(b)
				equal := reflect.DeepEqual(va, vb)
				if !equal && same {
					t.Fatalf("%q and %q decode differently but share a fingerprint", a, b)
				}
				if equal && !same && plainJSON(a) && plainJSON(b) {
					t.Fatalf("%q and %q decode alike but have different fingerprints", a, b)
				}
			case erra == nil || errb == nil:
				if same {
					t.Fatalf("valid and invalid JSON %q, %q share a fingerprint", a, b)
				}
			default:
				if same != bytes.Equal(a, b) {
					t.Fatalf("invalid JSON %q and %q: same fingerprint = %v", a, b, same)
				}
			}
		}
	})
}

// plainJSON reports whether src is valid JSON that encoding/json decodes
// without losing anything the canonical form keeps: valid UTF-8, no lone
// surrogates, and in every object names that fold apart (encoding/json would
// merge duplicates, and the canonical form keeps the order of names that
// fold together).
func plainJSON(src []byte) bool {
	if !utf8.Valid(src) {
		return false
	}
	n := parseTree(src)
	return n != nil && n.plain()
}

// checkMediaType compares the parameters parseMediaType reads with those
// mime.ParseMediaType reads, when both accept ct.
func checkMediaType(t *testing.T, ct string) {
	s := getScratch()
	defer putScratch(s)
	field, _, ok := parseMediaType(nil, &s.pairs, ct)
	mt, params, err := mime.ParseMediaType(ct)
	if !ok || err != nil || strings.ContainsAny(ct, "*\\") {
		// RFC 2231 continuations are mime's alone; quoted escapes are kept
		// as written.
		return
	}
	next := func() string {
		n := binary.BigEndian.Uint64(field)
		v := string(field[8 : 8+n])
		field = field[8+n:]
		return v
	}
	if got := next(); got != mt {
		t.Fatalf("%q: media type %q, mime reads %q", ct, got, mt)
	}
	got := map[string]string{}
	for len(field) > 0 {
		k := next()
		got[k] = next()
	}
	if cs, ok := params["charset"]; ok {
		params["charset"] = strings.ToLower(cs)
	}
	if len(got) != len(params) || len(got) > 0 && !reflect.DeepEqual(got, params) {
		t.Fatalf("%q: parameters %q, mime reads %q", ct, got, params)
	}
}

// tree is a parsed JSON value that keeps the raw text of its scalars, so
// that it can be written back in another, equivalent way.
type tree struct {
	raw   []byte // a scalar's text
	kind  byte   // '{', '[', '"' or 0 for other scalars
	names [][]byte
	elems []*tree
}

// parseTree parses src, which CanonicalJSON accepts; nil when it does not.
func parseTree(src []byte) *tree {
	if _, err := CanonicalJSON(nil, src); err != nil {
		return nil
	}
	p := &treeParser{src: src}
	return p.value()
}

type treeParser struct {
	src []byte
	pos int
}

func (p *treeParser) space() {
	for p.pos < len(p.src) && strings.IndexByte(" \t\r\n", p.src[p.pos]) >= 0 {
		p.pos++
	}
}

func (p *treeParser) value() *tree {
	p.space()
	start := p.pos
	switch c := p.src[p.pos]; c {
	case '{', '[':
		n := &tree{kind: c}
		p.pos++
		p.space()
		if p.src[p.pos] == c+2 { // '}' or ']'
			p.pos++
			return n
		}
		for {
			if c == '{' {
				p.space()
				name := p.value()
				n.names = append(n.names, name.raw)
				p.space()
				p.pos++ // ':'
			}
			n.elems = append(n.elems, p.value())
			p.space()
			p.pos++
			if p.src[p.pos-1] != ',' {
				return n
			}
		}
	case '"':
		for p.pos++; p.src[p.pos] != '"'; p.pos++ {
			if p.src[p.pos] == '\\' {
				p.pos++
			}
		}
		p.pos++
		return &tree{kind: '"', raw: p.src[start:p.pos]}
	default:
		for p.pos < len(p.src) && strings.IndexByte(" \t\r\n,]}", p.src[p.pos]) < 0 {
			p.pos++
		}
		return &tree{raw: p.src[start:p.pos]}
	}
}

// foldOf returns the folded form of a raw string token.
func foldOf(raw []byte) string {
	c, err := CanonicalJSON(nil, raw)
	if err != nil {
		panic(err)
	}
	return string(appendFoldedName(nil, c[1:len(c)-1]))
}

func (n *tree) plain() bool {
	if n.kind == '"' {
		c, _ := CanonicalJSON(nil, n.raw)
		return !bytes.Contains(c, []byte(`\ud`))
	}
	seen := map[string]bool{}
	for i, e := range n.elems {
		if n.kind == '{' {
			f := foldOf(n.names[i])
			if seen[f] || !(&tree{kind: '"', raw: n.names[i]}).plain() {
				return false
			}
			seen[f] = true
		}
		if !e.plain() {
			return false
		}
	}
	return true
}

// write writes n back with random whitespace, members shuffled (members
// whose names fold together keep their relative order) and some characters
// of strings spelled as escapes.
func (n *tree) write(b *bytes.Buffer, rng *rand.Rand) {
	space := func() {
		for range rng.IntN(3) {
			b.WriteByte(" \t\r\n"[rng.IntN(4)])
		}
	}
	space()
	defer space()
	switch n.kind {
	case 0:
		b.Write(n.raw)
	case '"':
		writeString(b, n.raw, rng)
	case '[':
		b.WriteByte('[')
		for i, e := range n.elems {
			if i > 0 {
				b.WriteByte(',')
			}
			e.write(b, rng)
		}
		b.WriteByte(']')
	case '{':
		b.WriteByte('{')
		order := rng.Perm(len(n.elems))
		// Within each fold class, refill the class's positions in the
		// original order.
		byFold := map[string][]int{}
		for i := range n.elems {
			f := foldOf(n.names[i])
			byFold[f] = append(byFold[f], i)
		}
		used := map[string]int{}
		for k, i := range order {
			f := foldOf(n.names[i])
			order[k] = byFold[f][used[f]]
			used[f]++
		}
		for k, i := range order {
			if k > 0 {
				b.WriteByte(',')
			}
			space()
			writeString(b, n.names[i], rng)
			space()
			b.WriteByte(':')
			n.elems[i].write(b, rng)
		}
		b.WriteByte('}')
	}
}

// writeString writes a raw string token, spelling some of its ASCII
// characters as \u escapes and '/' as \/.
func writeString(b *bytes.Buffer, raw []byte, rng *rand.Rand) {
	b.WriteByte('"')
	body := raw[1 : len(raw)-1]
	for i := 0; i < len(body); i++ {
		c := body[i]
		switch {
		case c == '\\':
			n := 2
			if body[i+1] == 'u' {
				n = 6
			}
			b.Write(body[i : i+n])
			i += n - 1
		case c < utf8.RuneSelf && rng.IntN(4) == 0:
			if c == '/' && rng.IntN(2) == 0 {
				b.WriteString(`\/`)
			} else if rng.IntN(2) == 0 {
				fmt.Fprintf(b, `\u%04x`, c)
			} else {
				fmt.Fprintf(b, `\u%04X`, c)
			}
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}
