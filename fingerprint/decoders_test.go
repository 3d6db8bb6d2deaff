package fingerprint

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// This file checks the rule a fingerprint holds over the whole
// canonicaliser: two requests a handler could tell apart never share a
// fingerprint. For a body, "a handler could tell apart" is read as: some
// decoder a handler plausibly runs on a body of that label gives a
// different value, or fails for one and not the other. The decoders are:
//
//   - JSON labels (application/json and every +json type): encoding/json,
//     as json.Unmarshal into any (with and without UseNumber) and into a
//     struct, and as a json.Decoder's first value (with UseNumber) and
//     whether anything follows it. Raw bytes are not a decoder here: the
//     contract lets member order and whitespace be normalised, and a
//     handler that reads the bytes of a JSON body another way gets what it
//     asked for.
//   - Form labels (application/x-www-form-urlencoded): url.ParseQuery (the
//     values, and whether it reports an error; r.ParseForm reads a body
//     with it), the JSON decoders above (a handler may decode JSON whatever
//     the label: curl labels a body sent with -d as a form), and
//     xml.Unmarshal's first element (curl -d @order.xml is labelled a form
//     too). The order of pairs with different names is allowed to be
//     normalised, so raw bytes are not a decoder here either.
//   - Every other label, and any body with a Content-Encoding: the raw
//     bytes. Two such bodies that share a fingerprint are equal.
//
// The property is checked on generated pairs (reordered pairs, respelled
// escapes, empty segments, JSON-looking forms, rewritten JSON) under every
// label, and by FuzzDecoders.

// label is how a body is sent: its Content-Type (none when "") and its
// Content-Encoding header lines.
type label struct {
	name            string
	contentType     string
	contentEncoding []string
}

var labels = []label{
	{"none", "", nil},
	{"json", "application/json", nil},
	{"json charset", "application/json; charset=utf-8", nil},
	{"+json", "application/merge-patch+json", nil},
	{"form", "application/x-www-form-urlencoded", nil},
	{"form charset", "application/x-www-form-urlencoded; charset=UTF-8", nil},
	{"form upper case", "Application/X-WWW-Form-URLEncoded", nil},
	{"text", "text/plain; charset=utf-8", nil},
	{"octet-stream", "application/octet-stream", nil},
	{"multipart", "multipart/form-data; boundary=xyz", nil},
	{"xml", "application/xml", nil},
	{"malformed", "application/json; x", nil},
	{"form gzip", "application/x-www-form-urlencoded", []string{"gzip"}},
	{"json br", "application/json", []string{"br"}},
	{"json empty encoding", "application/json", []string{""}},
}

type labelKind int

const (
	kindRaw labelKind = iota
	kindJSON
	kindForm
)

// kind is how a handler may read a body of l, found independently of the
// package's own media type parser.
func (l label) kind() labelKind {
	if len(l.contentEncoding) > 0 {
		return kindRaw
	}
	mt, _, err := mime.ParseMediaType(l.contentType)
	switch {
	case err != nil:
		return kindRaw
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		return kindJSON
	case mt == "application/x-www-form-urlencoded":
		return kindForm
	}
	return kindRaw
}

// sum is the Default fingerprint of a POST /p of body under l.
func (l label) sum(body []byte) [32]byte {
	r := &http.Request{Method: "POST", URL: &url.URL{Path: "/p"}, Header: http.Header{}}
	if l.contentType != "" {
		r.Header.Set("Content-Type", l.contentType)
	}
	for _, v := range l.contentEncoding {
		r.Header.Add("Content-Encoding", v)
	}
	return Default(r, body)
}

// A decoder reads a body the way a handler might and describes what it saw:
// the value, and whether it failed.
type decoder struct {
	name string
	read func([]byte) string
}

func describe(v any, err error) string {
	return fmt.Sprintf("%#v (error: %t)", v, err != nil)
}

// jsonProbe is a struct a handler might decode into: encoding/json matches
// its fields case-insensitively.
type jsonProbe struct {
	A, B, ID, Name any
	UserID         any `json:"user_id"`
	Nested         *jsonProbe
}

var jsonDecoders = []decoder{
	{"json.Unmarshal into any", func(b []byte) string {
		var v any
		err := json.Unmarshal(b, &v)
		return describe(v, err)
	}},
	{"json.Unmarshal into any with UseNumber", func(b []byte) string {
		if !json.Valid(b) {
			return describe(nil, io.ErrUnexpectedEOF)
		}
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		var v any
		err := d.Decode(&v)
		return describe(v, err)
	}},
	{"json.Unmarshal into a struct", func(b []byte) string {
		var v jsonProbe
		err := json.Unmarshal(b, &v)
		return describe(v, err)
	}},
	{"json.Decoder's first value", func(b []byte) string {
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		var v any
		err := d.Decode(&v)
		if err != nil {
			return describe(v, err)
		}
		var rest any
		end := d.Decode(&rest) == io.EOF
		return describe(v, err) + fmt.Sprintf(" then end: %t", end)
	}},
}

// xmlElement is whatever element xml.Unmarshal finds first.
type xmlElement struct {
	XMLName xml.Name
	Attrs   []xml.Attr `xml:",any,attr"`
	Inner   string     `xml:",innerxml"`
}

var formDecoders = append([]decoder{
	{"url.ParseQuery", func(b []byte) string {
		v, err := url.ParseQuery(string(b))
		if len(v) == 0 {
			v = nil
		}
		return describe(v, err)
	}},
	{"xml.Unmarshal's first element", func(b []byte) string {
		var v xmlElement
		err := xml.Unmarshal(b, &v)
		return describe(v, err)
	}},
}, jsonDecoders...)

var rawDecoders = []decoder{
	{"raw bytes", func(b []byte) string { return fmt.Sprintf("%q", b) }},
}

func (k labelKind) decoders() []decoder {
	switch k {
	case kindJSON:
		return jsonDecoders
	case kindForm:
		return formDecoders
	}
	return rawDecoders
}

// propertyCheck runs pairs of bodies through every label and counts, per
// kind of label, the pairs of different bodies that shared a fingerprint.
type propertyCheck struct {
	t      testing.TB
	shared [3]int
	// reported holds the decoders (per kind of label) that told a pair
	// apart already: each is reported once.
	reported map[string]bool
}

// check reports a pair of different bodies that share a fingerprint under
// some label although a decoder of that label tells them apart.
func (p *propertyCheck) check(a, b []byte) {
	p.t.Helper()
	if bytes.Equal(a, b) {
		return
	}
	for _, l := range labels {
		if l.sum(a) != l.sum(b) {
			continue
		}
		k := l.kind()
		p.shared[k]++
		for _, d := range k.decoders() {
			if va, vb := d.read(a), d.read(b); va != vb {
				key := fmt.Sprint(k, d.name)
				if p.reported[key] {
					continue
				}
				if p.reported == nil {
					p.reported = map[string]bool{}
				}
				p.reported[key] = true
				p.t.Errorf("label %q (Content-Type %q, Content-Encoding %q): %s and %s share a fingerprint, but %s tells them apart:\n%s\n%s",
					l.name, l.contentType, l.contentEncoding, short(a), short(b), d.name, shortText(va), shortText(vb))
			}
		}
	}
}

// checkVariants checks a against the variants of it that a generator might
// make share a fingerprint: reorderings, respelled escapes, other empty
// segments and, for JSON, the rewrites of its tree.
func (p *propertyCheck) checkVariants(a []byte, rng *rand.Rand) {
	p.t.Helper()
	for range 4 {
		p.check(a, permuteSegments(a, rng))
		p.check(a, respell(a, rng))
		p.check(a, changeEmptySegments(a, rng))
		p.check(a, respell(permuteSegments(a, rng), rng))
	}
	p.check(a, sortSegmentsByName(a))
	if n := parseTree(a); n != nil {
		for range 2 {
			var w bytes.Buffer
			n.write(&w, rng)
			p.check(a, w.Bytes())
		}
	}
	p.checkFormOrder(a, rng)
}

// checkFormOrder checks the other half of the rule for form bodies: the
// order of pairs with different names never makes two bodies differ, when
// none of the decoders of a form label can see it.
func (p *propertyCheck) checkFormOrder(a []byte, rng *rand.Rand) {
	p.t.Helper()
	if !plainForm(a) {
		return
	}
	b := permuteNames(a, rng)
	for _, l := range labels {
		if l.kind() == kindForm && l.sum(a) != l.sum(b) {
			p.t.Fatalf("label %q: %s and %s differ only in the order of pairs with different names, but their fingerprints differ", l.name, short(a), short(b))
		}
	}
}

// plainForm reports whether a handler's form and JSON readers cannot tell
// body from any reordering of its pairs that keeps the order of each name's
// values: url.ParseQuery reads every segment, and no decoder finds anything
// in it (no JSON value at the start of a segment, no XML element, no
// control bytes).
func plainForm(body []byte) bool {
	if bytes.ContainsAny(body, "<;\x7f") || bytes.ContainsFunc(body, func(r rune) bool { return r < 0x20 }) {
		return false
	}
	for seg := range strings.SplitSeq(string(body), "&") {
		name, value, _ := strings.Cut(seg, "=")
		if _, err := url.QueryUnescape(name); err != nil {
			return false
		}
		if _, err := url.QueryUnescape(value); err != nil {
			return false
		}
		seg = strings.TrimLeft(seg, " ")
		if seg != "" && strings.IndexByte(`{["-0123456789`, seg[0]) >= 0 {
			return false
		}
		for _, lit := range []string{"true", "false", "null"} {
			if strings.HasPrefix(seg, lit) {
				return false
			}
		}
	}
	return true
}

// formModel is what the fingerprint of a form body depends on: for a plain
// one, the number of '&' in it and its non-empty segments as sent, sorted
// stably by decoded name; for any other, its bytes.
func formModel(body []byte) string {
	if !plainForm(body) {
		return "raw " + string(body)
	}
	segs := segments(body)
	kept := slices.DeleteFunc(slices.Clone(segs), func(s string) bool { return s == "" })
	slices.SortStableFunc(kept, func(a, b string) int {
		na, _ := decodedName(a)
		nb, _ := decodedName(b)
		return strings.Compare(na, nb)
	})
	return fmt.Sprintf("%d %q", len(segs)-1, kept)
}

// short shortens b for a message.
func short(b []byte) string {
	if len(b) > 200 {
		return fmt.Sprintf("%q... (%d bytes)", b[:200], len(b))
	}
	return fmt.Sprintf("%q", b)
}

// shortText shortens s for a message.
func shortText(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

func segments(body []byte) []string { return strings.Split(string(body), "&") }

func permuteSegments(body []byte, rng *rand.Rand) []byte {
	s := segments(body)
	rng.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	return []byte(strings.Join(s, "&"))
}

// decodedName is the name url.ParseQuery reads from a segment, and false
// when it rejects the segment.
func decodedName(seg string) (string, bool) {
	name, _, _ := strings.Cut(seg, "=")
	n, err := url.QueryUnescape(name)
	return n, err == nil
}

// sortSegmentsByName sorts the segments of body stably by the names
// url.ParseQuery reads from them (body unchanged when it rejects one).
func sortSegmentsByName(body []byte) []byte {
	s := segments(body)
	for _, seg := range s {
		if _, ok := decodedName(seg); !ok {
			return body
		}
	}
	slices.SortStableFunc(s, func(a, b string) int {
		na, _ := decodedName(a)
		nb, _ := decodedName(b)
		return strings.Compare(na, nb)
	})
	return []byte(strings.Join(s, "&"))
}

// permuteNames shuffles the segments of body, keeping the relative order of
// those whose names url.ParseQuery reads alike.
func permuteNames(body []byte, rng *rand.Rand) []byte {
	s := segments(body)
	order := rng.Perm(len(s))
	byName := map[string][]int{}
	for i, seg := range s {
		n, _ := decodedName(seg)
		byName[n] = append(byName[n], i)
	}
	used := map[string]int{}
	out := make([]string, len(s))
	for k, i := range order {
		n, _ := decodedName(s[i])
		out[k] = s[byName[n][used[n]]]
		used[n]++
	}
	return []byte(strings.Join(out, "&"))
}

// respell writes one character of body another way a form decoder reads
// alike: as a percent escape, '+' for a space and back, or an escape's hex
// in the other case.
func respell(body []byte, rng *rand.Rand) []byte {
	if len(body) == 0 {
		return body
	}
	i := rng.IntN(len(body))
	c := body[i]
	var with string
	switch {
	case c == '%' && i+2 < len(body) && string(body[i:i+3]) == "%20":
		with = "+"
	case c == '%' && i+2 < len(body):
		with = "%" + flipCase(string(body[i+1:i+3]))
		return slices.Concat(body[:i], []byte(with), body[i+3:])
	case c == '+':
		with = [...]string{" ", "%20", "%2B"}[rng.IntN(3)]
	case c == ' ':
		with = [...]string{"+", "%20"}[rng.IntN(2)]
	case c == '&' || c == '=':
		return body
	default:
		with = fmt.Sprintf([...]string{"%%%02X", "%%%02x"}[rng.IntN(2)], c)
	}
	return slices.Concat(body[:i], []byte(with), body[i+1:])
}

func flipCase(s string) string {
	if strings.ToUpper(s) != s {
		return strings.ToUpper(s)
	}
	return strings.ToLower(s)
}

// changeEmptySegments adds an empty segment to body, or removes one.
func changeEmptySegments(body []byte, rng *rand.Rand) []byte {
	s := segments(body)
	if i := slices.Index(s, ""); i >= 0 && rng.IntN(2) == 0 {
		return []byte(strings.Join(slices.Delete(s, i, i+1), "&"))
	}
	s = slices.Insert(s, rng.IntN(len(s)+1), "")
	return []byte(strings.Join(s, "&"))
}

// formFragments are the pieces generated form bodies are made of: plain
// names, escapes of the same bytes, spaces spelled three ways, JSON and XML
// values, and what url.ParseQuery rejects.
var formFragments = []string{
	"a", "b", "A", "%61", "%41", "name", "a+b", "a%20b", "a b", "+", "%2B", "%2b", "%20",
	"1", "-1", "0", "12", "1.5", "true", "false", "null", "nulls", "tru", "n", "t",
	`{"a":"b"}`, `{"a":"c"}`, `{"name":"a+b"}`, `[1]`, `"s"`, `"`, "{", " {}", " 1", "\t1", "\n",
	"<x>1</x>", "<y/>", "x<y/>", "=", "%3D", "%26", "é", "%C3%A9", "%c3%a9", "x.y", "~*!'()",
	";", "%zz", "%", "%2", "\x00", "\x7f",
}

func genForm(rng *rand.Rand) []byte {
	frag := func() string {
		s := formFragments[rng.IntN(len(formFragments))]
		if rng.IntN(4) == 0 {
			s += formFragments[rng.IntN(len(formFragments))]
		}
		return s
	}
	n := rng.IntN(6)
	segs := make([]string, n)
	for i := range segs {
		switch rng.IntN(8) {
		case 0:
			segs[i] = ""
		case 1:
			segs[i] = frag()
		default:
			segs[i] = frag() + "=" + frag()
		}
	}
	return []byte(strings.Join(segs, "&"))
}

// issueBodies are the bodies of the defect reports: JSON sent with curl -d,
// which labels it a form.
var issueBodies = [][2]string{
	{`{"name":"a+b"}`, `{"name":"a b"}`},
	{`{"name":"a+b"}`, `{"name":"a%20b"}`},
	{`{"name":"a b"}`, `{"name":"a%20b"}`},
	{`{"a":"b"}&{"a":"c"}`, `{"a":"c"}&{"a":"b"}`},
	{`null&a=1`, `a=1&null`},
	{`true=1&a=2`, `a=2&true=1`},
	{`1&a=2`, `a=2&1`},
	{`<x>1</x>&<y>2</y>`, `<y>2</y>&<x>1</x>`},
	{`x=<a>1</a>&y=2`, `y=2&x=<a>1</a>`},
	{"a=1&" + strings.Repeat("&", 9999), "a=1"},
}

func TestDecodersProperty(t *testing.T) {
	p := &propertyCheck{t: t}
	for _, pair := range issueBodies {
		p.check([]byte(pair[0]), []byte(pair[1]))
		p.check([]byte(pair[1]), []byte(pair[0]))
	}
	rng := rand.New(rand.NewPCG(11, 12))
	rounds := 3000
	if testing.Short() {
		rounds = 300
	}
	for range rounds {
		p.checkVariants(genForm(rng), rng)
	}
	for _, s := range jsonSeeds {
		p.checkVariants([]byte(s), rng)
	}
	for _, pair := range issueBodies {
		p.checkVariants([]byte(pair[0]), rng)
	}
	// The check means something only if it met shared fingerprints.
	for k, least := range map[labelKind]int{kindForm: 100, kindJSON: 100} {
		if p.shared[k] < least {
			t.Errorf("kind %d: only %d pairs of different bodies shared a fingerprint; the generators no longer reach the property", k, p.shared[k])
		}
	}
}

// FuzzDecoders checks the property on a pair of bodies and on the variants
// of the first.
func FuzzDecoders(f *testing.F) {
	for _, pair := range issueBodies {
		if len(pair[0]) < 100 {
			f.Add([]byte(pair[0]), []byte(pair[1]), uint64(1))
		}
	}
	f.Add([]byte("b=2&a=1&a=3"), []byte("a=1&b=2&a=3"), uint64(2))
	f.Add([]byte("a=%41&%61=b&&c"), []byte("%61=b&a=%41&c&"), uint64(3))
	f.Add([]byte(`{"b":[1,{"d":0,"c":1}],"a":"\u00e9"}`), []byte(`{"a":"é","b":[1,{"c":1,"d":0}]}`), uint64(4))
	f.Fuzz(func(t *testing.T, a, b []byte, seed uint64) {
		p := &propertyCheck{t: t}
		p.check(a, b)
		p.checkVariants(a, rand.New(rand.NewPCG(seed, uint64(len(a)))))
	})
}

// queryDecoders read a query the ways a handler might: r.URL.Query()
// (url.ParseQuery: the values, and whether it failed), and r.URL.RawQuery
// split on '&' as it was sent, its empty segments dropped as every decoder
// drops them (SPEC: "empty segments dropped"). The order of segments with
// different names is allowed to be normalised, so the raw reader sees the
// segments as a sorted list.
var queryDecoders = []decoder{
	{"url.ParseQuery", func(b []byte) string {
		v, err := url.ParseQuery(string(b))
		if len(v) == 0 {
			v = nil
		}
		return describe(v, err)
	}},
	{"RawQuery's segments", func(b []byte) string {
		s := slices.DeleteFunc(segments(b), func(s string) bool { return s == "" })
		slices.Sort(s)
		return fmt.Sprintf("%q", s)
	}},
}

// querySum is the Default fingerprint of a POST /p?q with no body.
func querySum(q []byte) [32]byte {
	return Default(&http.Request{Method: "POST", URL: &url.URL{Path: "/p", RawQuery: string(q)}, Header: http.Header{}}, nil)
}

// queryCheck is propertyCheck for queries.
type queryCheck struct {
	t        testing.TB
	shared   int
	reported map[string]bool
}

// check reports two different queries that share a fingerprint although
// a query decoder tells them apart.
func (p *queryCheck) check(a, b []byte) {
	p.t.Helper()
	if bytes.Equal(a, b) || querySum(a) != querySum(b) {
		return
	}
	p.shared++
	for _, d := range queryDecoders {
		if va, vb := d.read(a), d.read(b); va != vb && !p.reported[d.name] {
			if p.reported == nil {
				p.reported = map[string]bool{}
			}
			p.reported[d.name] = true
			p.t.Errorf("queries %s and %s share a fingerprint, but %s tells them apart:\n%s\n%s", short(a), short(b), d.name, shortText(va), shortText(vb))
		}
	}
}

// checkVariants checks a against its respellings, reorderings and changed
// empty segments, and that reordering the segments of different names of
// a query url.ParseQuery reads never changes its fingerprint.
func (p *queryCheck) checkVariants(a []byte, rng *rand.Rand) {
	p.t.Helper()
	for range 4 {
		p.check(a, permuteSegments(a, rng))
		p.check(a, respell(a, rng))
		p.check(a, changeEmptySegments(a, rng))
		p.check(a, respell(permuteSegments(a, rng), rng))
	}
	p.check(a, sortSegmentsByName(a))
	if _, err := url.ParseQuery(string(a)); err == nil {
		if b := permuteNames(a, rng); querySum(a) != querySum(b) {
			p.t.Fatalf("queries %s and %s differ only in the order of segments with different names, but their fingerprints differ", short(a), short(b))
		}
	}
}

// TestQueryDecodersProperty: two queries a handler could tell apart, by
// r.URL.Query() or by reading r.URL.RawQuery, never share a fingerprint
// (a=%20 and a=+, a=%41 and a=A, a=1%26b=2 and a=1&b=2 used to), and the
// order of segments with different names never makes two differ.
func TestQueryDecodersProperty(t *testing.T) {
	p := &queryCheck{t: t}
	for _, pair := range [][2]string{
		{"a=%20", "a=+"}, {"a=%41", "a=A"}, {"a=1%26b=2", "a=1&b=2"}, {"a", "a="}, {"a=1&&b=2", "a=1&b=2"},
	} {
		p.check([]byte(pair[0]), []byte(pair[1]))
	}
	rng := rand.New(rand.NewPCG(13, 14))
	rounds := 3000
	if testing.Short() {
		rounds = 300
	}
	for range rounds {
		p.checkVariants(genForm(rng), rng)
	}
	// The check means something only if it met shared fingerprints.
	if p.shared < 100 {
		t.Errorf("only %d pairs of different queries shared a fingerprint; the generators no longer reach the property", p.shared)
	}
}

// FuzzQueryDecoders checks the query property on a pair of queries and on
// the variants of the first.
func FuzzQueryDecoders(f *testing.F) {
	f.Add([]byte("a=%20"), []byte("a=+"), uint64(1))
	f.Add([]byte("a=%41&b=1"), []byte("b=1&a=A"), uint64(2))
	f.Add([]byte("a=1%26b=2"), []byte("a=1&b=2"), uint64(3))
	f.Add([]byte("%61=1&a=2&&b"), []byte("b&a=2&%61=1&"), uint64(4))
	f.Fuzz(func(t *testing.T, a, b []byte, seed uint64) {
		p := &queryCheck{t: t}
		p.check(a, b)
		p.checkVariants(a, rand.New(rand.NewPCG(seed, uint64(len(a)))))
	})
}

// queryModel is what the fingerprint of a query depends on: for one
// url.ParseQuery reads, its non-empty segments as sent, sorted stably by
// decoded name; for any other, its bytes without its empty segments.
func queryModel(q string) string {
	// Empty segments count for nothing, whatever else the query holds.
	kept := slices.DeleteFunc(strings.Split(q, "&"), func(s string) bool { return s == "" })
	if _, err := url.ParseQuery(q); err != nil {
		return "raw " + strings.Join(kept, "&")
	}
	slices.SortStableFunc(kept, func(a, b string) int {
		na, _ := decodedName(a)
		nb, _ := decodedName(b)
		return strings.Compare(na, nb)
	})
	return fmt.Sprintf("%q", kept)
}
