package memory

import (
	"bytes"
	"encoding/hex"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// FuzzRecordRoundTrip checks that decode gives back every field encode was
// given, and the token.
func FuzzRecordRoundTrip(f *testing.F) {
	f.Add("tok", 201, false, int64(1767322800123456789), int64(1767322801000000000), "Content-Type:application/json\nLocation:/orders/1", []byte(`{"id":1}`))
	f.Add("", 0, true, int64(0), int64(-1), "", []byte{})
	f.Add(strings.Repeat("t", 300), -7, false, int64(-62135596800000000), int64(1<<62), ":\n:\nX::\nX:a\x00b", []byte{0, 0xff, 0})
	f.Fuzz(func(t *testing.T, token string, status int, omitted bool, created, completed int64, header string, body []byte) {
		rec := &store.Record{Status: status, BodyOmitted: omitted, Body: body, Fingerprint: [32]byte{1, 2, 3}}
		// created == 0 and completed == 0 stand for the zero time.
		if created != 0 {
			rec.CreatedAt = time.Unix(0, created)
		}
		if completed != 0 {
			rec.CompletedAt = time.Unix(completed/1e9, completed%1e9).UTC()
		}
		if header != "" {
			rec.Header = http.Header{}
			for line := range strings.SplitSeq(header, "\n") {
				k, v, _ := strings.Cut(line, ":")
				rec.Header[k] = append(rec.Header[k], v)
			}
		}
		b := encode(token, rec)
		if got := string(tokenOf(b)); got != token {
			t.Fatalf("token %q, want %q", got, token)
		}
		got := decode(b, rec.Fingerprint)
		if got.Status != rec.Status || got.BodyOmitted != rec.BodyOmitted || got.Fingerprint != rec.Fingerprint {
			t.Fatalf("decoded %+v, want %+v", got, rec)
		}
		if !got.CreatedAt.Equal(rec.CreatedAt) || got.CreatedAt.IsZero() != rec.CreatedAt.IsZero() {
			t.Fatalf("CreatedAt %v, want %v", got.CreatedAt, rec.CreatedAt)
		}
		if !got.CompletedAt.Equal(rec.CompletedAt) || got.CompletedAt.IsZero() != rec.CompletedAt.IsZero() {
			t.Fatalf("CompletedAt %v, want %v", got.CompletedAt, rec.CompletedAt)
		}
		if !bytes.Equal(got.Body, rec.Body) || cap(got.Body) != len(got.Body) {
			t.Fatalf("Body %q (cap %d), want %q", got.Body, cap(got.Body), rec.Body)
		}
		if len(got.Header) != len(rec.Header) {
			t.Fatalf("Header %q, want %q", got.Header, rec.Header)
		}
		for k, vs := range rec.Header {
			if g, ok := got.Header[k]; !ok || !slices.Equal(g, vs) || cap(g) != len(g) {
				t.Fatalf("Header[%q] = %q (cap %d), want %q", k, g, cap(g), vs)
			}
		}
	})
}

func TestDigestOf(t *testing.T) {
	name := store.KeyName("alice", "pay-1")
	sum, _ := hex.DecodeString(store.DigestOf(name))
	if got, want := digestOf(name), digest(sum); got != want {
		t.Fatalf("digestOf(KeyName) = %x, want the name's digest %x", got, want)
	}
	// Names KeyName does not make are held apart from it and from each
	// other, upper-case hex included.
	others := []string{
		strings.ToUpper(name[:len(name)-1]) + "}",
		store.KeyPrefix + "{" + strings.ToUpper(name[len(store.KeyPrefix)+1:len(name)-1]) + "}",
		name[:len(name)-1],
		name + "x",
		"idem:v2:" + name[len(store.KeyPrefix):],
		"pay-1",
		"",
	}
	seen := map[digest]string{digestOf(name): name}
	for _, o := range others {
		d := digestOf(o)
		if prev, ok := seen[d]; ok {
			t.Errorf("%q and %q share a digest", o, prev)
		}
		seen[d] = o
		if d != digestOf(o) {
			t.Errorf("digestOf(%q) differs between calls", o)
		}
	}
}

// FuzzParseName checks parseName against encoding/hex on names of
// KeyName's shape: it accepts exactly the lower-case hex ones, with the
// digest they hold.
func FuzzParseName(f *testing.F) {
	f.Add(store.KeyName("alice", "pay-1")[len(store.KeyPrefix)+1 : nameLen-1])
	f.Add(strings.Repeat("0", 64))
	f.Add(strings.Repeat("f", 64))
	f.Add(strings.Repeat("F", 64))
	f.Add(strings.Repeat("g", 64))
	f.Add(strings.Repeat("/:`@", 16))
	f.Add(strings.Repeat("\x80\xff", 32))
	f.Fuzz(func(t *testing.T, hexDigits string) {
		if len(hexDigits) != 64 {
			return
		}
		d, ok := parseName(store.KeyPrefix + "{" + hexDigits + "}")
		want, err := hex.DecodeString(hexDigits)
		lower := strings.ToLower(hexDigits) == hexDigits
		if ok != (err == nil && lower) {
			t.Fatalf("parseName(%q) ok = %v; hex.DecodeString error %v, lower case %v", hexDigits, ok, err, lower)
		}
		if ok && !bytes.Equal(d[:], want) {
			t.Fatalf("parseName(%q) = %x, want %x", hexDigits, d, want)
		}
	})
}

func BenchmarkParseName(b *testing.B) {
	name := store.KeyName("alice", "pay-1")
	for b.Loop() {
		if _, ok := parseName(name); !ok {
			b.Fatal("not parsed")
		}
	}
}

// TestParseNameEveryByte puts every byte value at every position of a
// KeyName's hex and checks that parseName accepts exactly the lower-case
// hex digits, with the right value.
func TestParseNameEveryByte(t *testing.T) {
	base := []byte(strings.Repeat("5a", 32))
	for pos := range base {
		for c := range 256 {
			digits := bytes.Clone(base)
			digits[pos] = byte(c)
			d, ok := parseName(store.KeyPrefix + "{" + string(digits) + "}")
			want, err := hex.DecodeString(string(digits))
			valid := err == nil && bytes.Equal(bytes.ToLower(digits), digits)
			if ok != valid || ok && !bytes.Equal(d[:], want) {
				t.Fatalf("byte %#x at %d: parseName = %x, %v; want %x, %v", c, pos, d, ok, want, valid)
			}
		}
	}
}
