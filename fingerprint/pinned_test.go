package fingerprint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/internal/benchbody"
)

// pinnedBodies are JSON bodies whose fingerprints are kept in stores
// already: changing how they are read would make a retry look like a
// different request.
var pinnedBodies = []struct {
	name string
	body string
}{
	{"small-objects-unsorted", string(benchbody.JSON(false))},
	{"small-objects-sorted", string(benchbody.JSON(true))},
	// The body benchJSON(400) gave while a bug made it fall back to a flat
	// object for every size.
	{"payload", `{"b":"` + strings.Repeat("x", 384) + `","a":1}`},
	{"items", string(benchJSON(2 << 10))},
	{"nested", `{"b":[{"y":"\u00e9","x":[1,{"q":0,"p":"\ud834\udd1e"}]}],"a":{"c":-1.5E-3}}`},
	{"folding", `{"\u0062":1,"a\/b":2,"A":3,"a":4,"_a":5,"\u0000":6,"\"":7,"id":8,"ID":9,"user_id":10,"userId":11,"K":12,"\u212a":13}`},
	{"mixed", `[{"b":1,"a":{"d":{"f":1,"e":2},"c":3}},{"z":{},"y":[]},{"c":{"b":{"a":0}},"b":{"c":[{"z":1,"y":2,"x":3,"w":4,"v":5,"u":6,"t":7,"s":8,"r":9}]}}]`},
	{"deep", strings.Repeat(`{"b":0,"a":`, 40) + `"` + strings.Repeat("x", 600) + `"` + strings.Repeat("}", 40)},
	{"invalid", `{"b":1,"a":}`},
}

// pinnedDigests are the fingerprints of pinnedBodies sent as
// POST /v1/orders?b=2&a=1 with Content-Type application/json, and the
// SHA-256 of their canonical forms ("" when the body is not valid JSON).
var pinnedDigests = map[string][2]string{
	"small-objects-unsorted": {"c201b1d2dec154635aea03ce1867ab4bb400ccf59262fe1ae241aff3a0da1814", "a1a7743d31ef7d24a13fae53b6bfbe2ff96cfb6f1ff000a9234b430ed2088d9e"},
	"small-objects-sorted":   {"c201b1d2dec154635aea03ce1867ab4bb400ccf59262fe1ae241aff3a0da1814", "a1a7743d31ef7d24a13fae53b6bfbe2ff96cfb6f1ff000a9234b430ed2088d9e"},
	"items":                  {"63b9a3a2791c4513aa3dd02b5b18c7dee2f31c50df71b90c780e4085e52984b6", "b512e5c00d1c94ad72b6509fd4af887219433ff993a774ea42a76e593f6dc125"},
	"payload":                {"bc167f9d95ec140ec774500823b0d9c9e7dbfce88b342f5e81262f3b4668782b", "58bb1b6b0c4c013cb08e5753cfca4e70ce384e4545de832ced33293e6c575738"},
	"nested":                 {"8551f0c2da2f1bef48f23311485bba08d3fbba1f3566e8acc7b90c907272e262", "d1d9838066d53ed787086310a7a739a2435e471255e08322a80ef9026763dde0"},
	"folding":                {"253bef2ed0b409ef8538e1becf5e6ffcd6515d64a33b41ad1ce42ebd6099c57e", "91a83f9b3f94f2c09d3ff8da3253780c4fedad1ba86ebbbfcdc39e422e63cafd"},
	"mixed":                  {"38955e6593c6432c8d3dcf03543632e394c8c6617aa3755bb870b81f7fcf2851", "469de925f822c669ef52413bcfe68bca7e156f91c78b19f0f60a437aaaa6eaba"},
	"deep":                   {"9d30fee6135537a5f41f806d2d8385226e7cb2984ff01e564c74608f0dce2c13", "9648a403748291ef7f4869795475cea70ae6f1fd324a9b15548e7abe7c3f7f07"},
	"invalid":                {"d214117a7f5cd0dd693cd035edeaa89898071d8ce02c16c186ad25653d89da94", ""},
}

func TestPinnedDigests(t *testing.T) {
	for _, c := range pinnedBodies {
		want, ok := pinnedDigests[c.name]
		if !ok {
			t.Fatalf("%s: no pinned digest", c.name)
		}
		d := Sum("POST", "/v1/orders", "b=2&a=1", "application/json", []byte(c.body))
		if got := hex.EncodeToString(d[:]); got != want[0] {
			t.Errorf("%s: fingerprint %s, pinned %s", c.name, got, want[0])
		}
		var canonical string
		if out, err := CanonicalJSON(nil, []byte(c.body)); err == nil {
			h := sha256.Sum256(out)
			canonical = hex.EncodeToString(h[:])
		}
		if canonical != want[1] {
			t.Errorf("%s: canonical form's SHA-256 %q, pinned %q", c.name, canonical, want[1])
		}
	}
}

// orderNames are canonical member names whose folded forms share long
// prefixes, hold zero bytes, and run either side of eight bytes, where the
// comparison of folded names changes from its first word to the rest.
var orderNames = []string{
	``, `a`, `A`, `_a`, `a-`, `\u0000`, `a\u0000`, `a\u0000\u0000`, `ab`, `aB`,
	`abcdefg`, `abcdefgh`, `abcdefgh\u0000`, `abcdefghi`, `ABCDEFGHI`, `abcdefgh_i`,
	`abcdefghij`, `abcdefgha`, `abcdefg\u0000`, `abcdefg\u0000\u0000`,
	`é`, `É`, `\ud800`, "\xff", `ﬀ`, `K`, `k`, `id`, `ID`, `user_id`, `userId`,
	`zzzzzzzzzzzzzzzzzzzz`, `zzzzzzzzzzzzzzzzzzz`, `\"`, `\\`, `\t`,
}

func foldedName(name string) []byte { return appendFoldedName(nil, []byte(name)) }

func TestCompareMembersMatchesBytes(t *testing.T) {
	var c canonJSON
	ms := make([]member, len(orderNames))
	for i, n := range orderNames {
		start := len(c.fold)
		c.fold = appendFoldedName(c.fold, []byte(n))
		ms[i] = member{foldStart: start, foldEnd: len(c.fold), key: foldKey(c.fold[start:])}
	}
	for i := range ms {
		for j := range ms {
			want := bytes.Compare(foldedName(orderNames[i]), foldedName(orderNames[j]))
			got := c.compareMembers(&ms[i], &ms[j])
			if (got < 0) != (want < 0) || (got > 0) != (want > 0) {
				t.Errorf("compare %q with %q: %d, want the sign of %d", orderNames[i], orderNames[j], got, want)
			}
		}
	}
}

// TestMemberOrder checks objects of shuffled members against their
// members stable-sorted by folded name, both where an object is put in
// order as it is read (a small object with no object inside) and where it
// is put in order afterwards (a large one, or one holding an object).
func TestMemberOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for round := range 300 {
		n := 1 + rng.IntN(14)
		names := make([]string, n)
		for i := range names {
			names[i] = orderNames[rng.IntN(len(orderNames))]
		}
		value := func(i int) string { return strconv.Itoa(i) }
		switch round % 3 {
		case 1:
			value = func(i int) string { return `{"y":` + strconv.Itoa(i) + `,"x":0}` }
		case 2:
			pad := strings.Repeat("p", maxRewrite/n)
			value = func(i int) string { return `"` + pad + strconv.Itoa(i) + `"` }
		}
		var src strings.Builder
		src.WriteByte('{')
		for i, name := range names {
			if i > 0 {
				src.WriteByte(',')
			}
			src.WriteString(`"` + name + `":` + value(i))
		}
		src.WriteByte('}')

		order := make([]int, n)
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int {
			return bytes.Compare(foldedName(names[a]), foldedName(names[b]))
		})
		var want strings.Builder
		want.WriteByte('{')
		for k, i := range order {
			if k > 0 {
				want.WriteByte(',')
			}
			v := value(i)
			if round%3 == 1 {
				v = `{"x":0,"y":` + strconv.Itoa(i) + `}`
			}
			want.WriteString(`"` + string(canonName(t, names[i])) + `":` + v)
		}
		want.WriteByte('}')

		for _, wrap := range []string{"%s", `[%s,{"b":%[1]s,"a":%[1]s}]`} {
			doc := fmt.Sprintf(wrap, src.String())
			got, err := CanonicalJSON(nil, []byte(doc))
			if err != nil {
				t.Fatalf("%s: %v", doc, err)
			}
			if w := fmt.Sprintf(wrap, want.String()); wrap != "%s" {
				w = fmt.Sprintf(`[%s,{"a":%[1]s,"b":%[1]s}]`, want.String())
				if string(got) != w {
					t.Fatalf("%s:\ngot  %s\nwant %s", doc, got, w)
				}
			} else if string(got) != w {
				t.Fatalf("%s:\ngot  %s\nwant %s", doc, got, w)
			}
		}
	}
}

// canonName returns the canonical form of a member name written as name.
func canonName(t *testing.T, name string) []byte {
	t.Helper()
	out, err := CanonicalJSON(nil, []byte(`"`+name+`"`))
	if err != nil {
		t.Fatal(err)
	}
	return out[1 : len(out)-1]
}

// pinnedRequests are fingerprints of requests other than JSON bodies, kept
// in stores already.
var pinnedRequests = []struct {
	name                             string
	method, path, query, contentType string
	body                             string
	contentEncoding                  []string
	digest                           string
}{
	// Raw bodies, queries and media types: unchanged since the first
	// release.
	{"text", "POST", "/v1/orders", "b=2&a=1", "text/plain; charset=utf-8", "hello, world", nil, "8bcb055937beb037e3def314118053f3dbda93e27a79331b19116a15834b60dd"},
	{"octet-stream", "POST", "/v1/orders", "b=2&a=1", "application/octet-stream", "\x00\x01&\xff", nil, "481c30bd5803e48ab15781322dd199c73c1170b1d434a9e585c6bfd14117a30f"},
	{"no content type", "POST", "/v1/orders", "b=2&a=1", "", `{"b":1,"a":2}`, nil, "3e9b202762b58d0f42a36bf0f4c0c9d69e8210fd55c7061fb1518ec3bfd68bac"},
	{"multipart", "POST", "/v1/orders", "b=2&a=1", "multipart/form-data; boundary=xyz", "--xyz\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--xyz--\r\n", nil, "4cce55fcc8d080694d7e572f88692a87320cdac8183a14b8372195058c3c580a"},
	{"malformed content type", "POST", "/v1/orders", "b=2&a=1", "application/json; x", `{"a":1}`, nil, "32b578323fb5ba0fdd8d938851fe167bcb2404677986383e187e999fa40d4e36"},
	{"no body", "DELETE", "/v1/orders/1", "", "", "", nil, "206d783af695dc0949c7644351648f7a3bb70397511689443737c97ae909645a"},
	{"malformed query", "POST", "/search", "q=a+b&q=%41&q=;", "", "", nil, "3cb25d5d9a670d1eb6e16fcb37e1e08ae42d79091732817a887e3d2832fc4f46"},
	// A query that is not plain (an escape, a '+', a name without '=').
	// Until this release it was written decoded (tag 'Q'), which gave
	// queries a handler reading RawQuery tells apart one fingerprint
	// (q=%41 and q=A); it is now written as sent (tag 'S'), so this
	// fingerprint changed: such a request kept before the upgrade and
	// retried after it gets 422 instead of its replay. The earlier value
	// was 3a429e62.... Plain queries (b=2&a=1 above) are unchanged.
	{"query", "POST", "/search", "q=a+b&q=%41&r", "", "", nil, "a6158a865af223845f59b7a2197963582af18413cc2d64e81741f1fc13160cd2"},
	// Form bodies url.ParseQuery rejects: their raw bytes, unchanged.
	{"form with ';'", "POST", "/v1/orders", "", "application/x-www-form-urlencoded", "a=1;b=2", nil, "0fbabe92ee8cef012693c35fd9fac0869b9a99436451201f94e80b5bbaccba5a"},
	{"form with a bad escape", "POST", "/v1/orders", "", "application/x-www-form-urlencoded", "a=%zz&b=2", nil, "c293a5eba071404047f265fe7223653b9d4fa6cdedefd4dd014b557446bea968"},
	// Form bodies url.ParseQuery reads. Until this release their pairs were
	// written decoded (tag 'F'), which gave {"name":"a+b"}, {"name":"a b"}
	// and {"name":"a%20b"} one fingerprint though a handler decoding JSON
	// tells them apart. They are now written as sent (tag 'U', or 'f' for a
	// body a JSON or XML decoder could read), so these fingerprints changed:
	// a form request kept before the upgrade and retried after it gets 422
	// instead of its replay. The earlier values were e41cb1bc...,
	// 64752566... and 0f40c06c..., in this order.
	{"form", "POST", "/v1/orders", "", "application/x-www-form-urlencoded", "name=J%C3%B6rg+M&email=jorg%40example.com", nil, "f87e5bf7c4fc37b57dc41f983e696b0173bc280e24586f40dfd70f8b6a89359d"},
	{"form read as JSON", "POST", "/v1/orders", "", "application/x-www-form-urlencoded", `{"name":"a+b"}`, nil, "37f9aacc87847bb186669c519a92dbed9e761a685dce65eeb7deb36a1c615799"},
	{"form with a repeated name", "POST", "/v1/orders", "", "application/x-www-form-urlencoded", "b=2&a=1&a=3", nil, "4f3a9ba3d1dd8bfd2685a8939e7f76810544926e05e6182837d009b3ca1d94da"},
	// Requests with a Content-Encoding, covered since this release (the
	// field is written only when the header is there).
	{"gzip JSON", "POST", "/v1/orders", "", "application/json", "\x1f\x8b\x08\x00", []string{"gzip"}, "9c3295aab2b905d38efe8308a855ff5345929c08337db9895634d2641b80e8ea"},
	{"two encodings", "POST", "/v1/orders", "", "application/x-www-form-urlencoded", "b=2&a=1", []string{"gzip, br", "x"}, "0d5b57c57e958f82c2cdb2262226a70152b3c56c3fa6b0a139fcd4fa9f82d463"},
}

func TestPinnedRequests(t *testing.T) {
	for _, c := range pinnedRequests {
		d := Sum(c.method, c.path, c.query, c.contentType, []byte(c.body), c.contentEncoding...)
		if got := hex.EncodeToString(d[:]); got != c.digest {
			t.Errorf("%s: fingerprint %s, pinned %s", c.name, got, c.digest)
		}
	}
}
