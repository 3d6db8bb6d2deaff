package fingerprint

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

func canon(t *testing.T, src string) string {
	t.Helper()
	out, err := CanonicalJSON(nil, []byte(src))
	if err != nil {
		t.Fatalf("CanonicalJSON(%q): %v", src, err)
	}
	return string(out)
}

func TestCanonicalJSONForms(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{}`, `{}`},
		{` [ ] `, `[]`},
		{"\t{ \"b\" : 1 ,\r\n \"a\" : [ true , false , null ] }\n", `{"a":[true,false,null],"b":1}`},
		{`{"b":{"d":1,"c":2},"a":[{"z":0,"y":0}]}`, `{"a":[{"y":0,"z":0}],"b":{"c":2,"d":1}}`},
		{`"\u0041\/\"\\\b\f\n\r\t"`, `"A/\"\\\b\f\n\r\t"`},
		{`"\u0022\u005c\u002F\u0008\u000C\u000a\u000D\u0009"`, `"\"\\/\b\f\n\r\t"`},
		{`"\u0000\u001F\u007f"`, "\"\\u0000\\u001f\x7f\""},
		{`"\u00e9\u00E9é"`, `"ééé"`},
		{`"\ud83d\ude00\uD83D\uDE00😀"`, `"😀😀😀"`},
		{`"\uD800"`, `"\ud800"`},                       // a lone surrogate stays an escape
		{`"\uDC00\uD800x"`, `"\udc00\ud800x"`},         // low then high is no pair
		{`"\ud800\ud800\udc00"`, `"\ud800𐀀"`},          // the second high one pairs
		{"\"\xff\xfe\"", "\"\xff\xfe\""},               // invalid UTF-8 stays as it is
		{`"\ufffd"`, "\"\xef\xbf\xbd\""},               // U+FFFD is a character like any other
		{`-0.5e+10`, `-0.5e+10`},                       // numbers keep their text
		{`[1.0,1E2,1e2,-0]`, `[1.0,1E2,1e2,-0]`},       //
		{`{"a":1,"a":2}`, `{"a":1,"a":2}`},             // duplicates keep their order
		{`{"b":0,"a":2,"a":1}`, `{"a":2,"a":1,"b":0}`}, //
		{`{"ID":1,"a":0,"id":2}`, `{"a":0,"ID":1,"id":2}`},
		{`{"id":2,"a":0,"ID":1}`, `{"a":0,"id":2,"ID":1}`},
		{`{"user_id":1,"userId":2,"a":0}`, `{"a":0,"user_id":1,"userId":2}`},
		{`{"\u212a":1,"k":2}`, "{\"\u212a\":1,\"k\":2}"}, // Kelvin sign folds with k
		{`{"b\"":1,"b":2,"a\\":3}`, `{"a\\":3,"b":2,"b\"":1}`},
	}
	for _, tt := range tests {
		got := canon(t, tt.in)
		if got != tt.want {
			t.Errorf("CanonicalJSON(%q)\n got %q\nwant %q", tt.in, got, tt.want)
		}
		if again := canon(t, got); again != got {
			t.Errorf("CanonicalJSON not idempotent on %q: %q", got, again)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("canonical form %q of %q is not valid JSON", got, tt.in)
		}
	}
}

func TestCanonicalJSONAppends(t *testing.T) {
	dst := []byte("prefix:")
	out, err := CanonicalJSON(dst, []byte(`{"b":[1,{"d":0,"c":0}],"a":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(out), `prefix:{"a":"x","b":[1,{"c":0,"d":0}]}`; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	out, err = CanonicalJSON(dst, []byte(`{"a":`))
	if err == nil || string(out) != "prefix:" {
		t.Fatalf("on error got %q, %v; want dst unchanged and an error", out, err)
	}
}

func TestCanonicalJSONInvalid(t *testing.T) {
	invalid := []string{
		``, ` `, `{`, `}`, `[1,]`, `[,1]`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{a:1}`,
		`{"a" 1}`, `{"a":1 "b":2}`, `[1 2]`, `01`, `1.`, `.5`, `-`, `1e`, `1e+`,
		`+1`, `0x10`, `NaN`, `Infinity`, `tru`, `nulll`, `True`, `"abc`, "\"a\x01\"",
		`"\x"`, `"\u12"`, `"\u12G4"`, `"\`, `'a'`, `1 2`, "\xef\xbb\xbf{}", `{"a":1}x`,
		`[1]]`, `{"a":1}}`, "[\v]", `"\U0041"`,
	}
	for _, in := range invalid {
		out, err := CanonicalJSON(nil, []byte(in))
		if !errors.Is(err, ErrInvalidJSON) {
			t.Errorf("CanonicalJSON(%q) = %q, %v; want ErrInvalidJSON", in, out, err)
		}
		if json.Valid([]byte(in)) {
			t.Errorf("test case %q is valid to encoding/json", in)
		}
	}
}

func TestCanonicalJSONDepth(t *testing.T) {
	nest := func(n int, open, close string) string {
		return strings.Repeat(open, n) + "0" + strings.Repeat(close, n)
	}
	for _, tt := range []struct{ open, close string }{{"[", "]"}, {`{"a":`, "}"}, {`[{"b":0,"a":`, "}]"}} {
		// Each repetition of the third pattern opens two containers.
		per := strings.Count(tt.open, "[") + strings.Count(tt.open, "{")
		ok := nest(MaxDepth/per, tt.open, tt.close)
		if _, err := CanonicalJSON(nil, []byte(ok)); err != nil {
			t.Errorf("depth %d: %v", MaxDepth, err)
		}
		deep := tt.open + ok + tt.close
		_, err := CanonicalJSON(nil, []byte(deep))
		if !errors.Is(err, ErrTooDeep) {
			t.Errorf("depth %d: err = %v, want ErrTooDeep", MaxDepth+per, err)
		}
	}
	// Depth counts open containers, not containers seen.
	wide := strings.Repeat(nest(MaxDepth, "[", "]")+",", 3)
	if _, err := CanonicalJSON(nil, []byte("["+wide+"0]")); !errors.Is(err, ErrTooDeep) {
		t.Errorf("siblings at depth %d inside an array: err = %v, want ErrTooDeep", MaxDepth, err)
	}
	flat := "[" + strings.Repeat(nest(MaxDepth-1, "[", "]")+",", 3) + "0]"
	if _, err := CanonicalJSON(nil, []byte(flat)); err != nil {
		t.Errorf("siblings at depth %d: %v", MaxDepth, err)
	}
}

func TestCanonicalJSONErrorOffset(t *testing.T) {
	_, err := CanonicalJSON(nil, []byte(`{"a":[1,2,x]}`))
	if err == nil || !strings.Contains(err.Error(), "offset 10") {
		t.Fatalf("err = %v, want it to name offset 10", err)
	}
}

// TestCanonicalJSONEquivalent lists texts that must share a canonical form,
// and TestCanonicalJSONDistinct texts that must not.
func TestCanonicalJSONEquivalent(t *testing.T) {
	pairs := [][2]string{
		{`{"a":1,"b":2}`, `{"b":2,"a":1}`},
		{`{"a":1,"b":2}`, " {\n  \"a\": 1,\n  \"b\": 2\n}\n"},
		{`{"x":{"a":1,"b":[{"d":1,"c":2}]}}`, `{"x":{"b":[{"c":2,"d":1}],"a":1}}`},
		{`"A"`, `"\u0041"`},
		{`"/"`, `"\/"`},
		{`"é"`, `"\u00E9"`},
		{`"😀"`, `"\uD83D\uDE00"`},
		{`"\n"`, `"\u000a"`},
		{`"\""`, `"\u0022"`},
		{`{"A":1}`, `{"\u0041":1}`},
		{`{"a":1,"a":2,"b":3}`, `{"b":3,"a":1,"a":2}`},
		{`{"a":1,"b":2,"a":3}`, `{"a":1,"a":3,"b":2}`},
		{`{"id":1,"ID":2,"x":0}`, `{"x":0,"id":1,"ID":2}`},
		{`{"\ud800":1,"\udc00":2}`, `{"\uD800":1,"\uDC00":2}`},
	}
	for _, p := range pairs {
		if a, b := canon(t, p[0]), canon(t, p[1]); a != b {
			t.Errorf("%q and %q canonicalise differently: %q, %q", p[0], p[1], a, b)
		}
	}
}

func TestCanonicalJSONDistinct(t *testing.T) {
	pairs := [][2]string{
		{`1`, `1.0`},
		{`1e2`, `100`},
		{`1e2`, `1E2`},
		{`0`, `-0`},
		{`{"a":1,"a":2}`, `{"a":2,"a":1}`},
		{`{"a":1,"a":2}`, `{"a":2}`},
		{`{"id":1,"ID":2}`, `{"ID":2,"id":1}`},
		{`{"user_id":1,"userid":2}`, `{"userid":2,"user_id":1}`},
		{`{"\u212a":1,"k":2}`, `{"k":2,"\u212a":1}`},
		{`{"\ufffd":1,"\ud800":2}`, `{"\ud800":2,"\ufffd":1}`},
		{"{\"\xff\":1,\"\\ufffd\":2}", "{\"\\ufffd\":2,\"\xff\":1}"},
		{`[1,2]`, `[2,1]`},
		{`"a"`, `"A"`},
		{`"\ud800"`, `"\ufffd"`},
		{"\"\xff\"", `"\ufffd"`},
		{"\"\xed\xa0\x80\"", `"\ud800"`},
		{`{"a":{"b":1}}`, `{"a":{"b":2}}`},
		{`{"a":[{"b":1}]}`, `{"a":[{"c":1}]}`},
		{`{"a":"1"}`, `{"a":1}`},
		{`null`, `{}`},
		{`[]`, `{}`},
		{`""`, `null`},
		{`{"a":null}`, `{}`},
		{`[[]]`, `[]`},
		{`{"a":[1]}`, `{"a":1}`},
		{`"a b"`, `"ab"`},
	}
	for _, p := range pairs {
		if a, b := canon(t, p[0]), canon(t, p[1]); a == b {
			t.Errorf("%q and %q share the canonical form %q", p[0], p[1], a)
		}
	}
}

// TestSpecial checks that special finds the first byte of a word that does
// not stand for itself in a JSON string, or that there is none.
func TestSpecial(t *testing.T) {
	want := func(w [8]byte) int {
		for i, b := range w {
			if !plain[b] {
				return i
			}
		}
		return -1
	}
	check := func(w [8]byte) {
		got := -1
		if m := special(binary.LittleEndian.Uint64(w[:])); m != 0 {
			got = firstFlagged(m)
		}
		if got != want(w) {
			t.Fatalf("first special byte of %q: %d, want %d", w[:], got, want(w))
		}
	}
	// Every byte value in every position, among fillers on both sides of
	// the thresholds.
	for _, fill := range []byte{'a', 0x20, 0x21, '"' + 1, '\\' + 1, 0x7f, 0x80, 0xff, '"', '\\', 0, 0x1f} {
		for pos := range 8 {
			for b := range 256 {
				var w [8]byte
				for i := range w {
					w[i] = fill
				}
				w[pos] = byte(b)
				check(w)
			}
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 100000 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], rng.Uint64())
		check(w)
	}
}

// TestNameFastPath checks the names read a word at a time against the
// general reading: the canonical name written, its folded form and its
// key, for names of every length up to three words, every printable byte,
// and input ending just after the name or running on.
func TestNameFastPath(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	check := func(name string, tail string) {
		src := []byte(`"` + name + `"` + tail)
		var c canonJSON
		c.reset(src)
		c.out = append(c.out, "prefix"...)
		c.fold = append(c.fold, "FOLD"...)
		key, err := c.name()
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		wantFold := appendFoldedName(nil, []byte(name))
		c.flush() // what is still in the pending run
		if got := string(c.out); got != `prefix"`+name+`"` {
			t.Fatalf("%q: wrote %q", src, got)
		}
		if got := string(c.fold); got != "FOLD"+string(wantFold) {
			t.Fatalf("%q: folded %q, want %q", src, got, wantFold)
		}
		if want := foldKey(wantFold); key != want {
			t.Fatalf("%q: key %#x, want %#x", src, key, want)
		}
		if c.pos != len(name)+2 {
			t.Fatalf("%q: stopped at %d", src, c.pos)
		}
	}
	for range 20000 {
		n := rng.IntN(27)
		b := make([]byte, n)
		for i := range b {
			switch rng.IntN(4) {
			case 0:
				b[i] = "_-aAzZ`{@["[rng.IntN(10)]
			default:
				for b[i] = byte(0x20 + rng.IntN(0x60)); b[i] == '"' || b[i] == '\\'; {
					b[i] = byte(0x20 + rng.IntN(0x60))
				}
			}
		}
		check(string(b), "")
		check(string(b), ":1}")
		check(string(b), strings.Repeat(" ", rng.IntN(20))+`:"\u00e9\xff"}`)
	}
}
