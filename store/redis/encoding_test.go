package redis

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

func sampleRecord() *store.Record {
	return &store.Record{
		Status: 201,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/orders/42"},
			"Vary":         {"Accept", "Accept-Encoding"},
			"X-Empty":      {""},
		},
		Body:        []byte("{\"id\":42}\x00\xff binary too"),
		Fingerprint: [32]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32},
		CreatedAt:   time.Unix(1767225600, 123456789),
		CompletedAt: time.Unix(1767225601, 987654321),
	}
}

func sameRecord(t *testing.T, got, want *store.Record) {
	t.Helper()
	if got.Status != want.Status || got.BodyOmitted != want.BodyOmitted || got.Fingerprint != want.Fingerprint || got.RawDigest != want.RawDigest {
		t.Errorf("record fields = %d %v %x %x, want %d %v %x %x", got.Status, got.BodyOmitted, got.Fingerprint, got.RawDigest, want.Status, want.BodyOmitted, want.Fingerprint, want.RawDigest)
	}
	if !got.CreatedAt.Equal(want.CreatedAt) || !got.CompletedAt.Equal(want.CompletedAt) {
		t.Errorf("times = %v %v, want %v %v", got.CreatedAt, got.CompletedAt, want.CreatedAt, want.CompletedAt)
	}
	if !bytes.Equal(got.Body, want.Body) {
		t.Errorf("body = %q, want %q", got.Body, want.Body)
	}
	if len(got.Header) != len(want.Header) || (len(want.Header) > 0 && !reflect.DeepEqual(got.Header, want.Header)) {
		t.Errorf("header = %v, want %v", got.Header, want.Header)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	big := bytes.Repeat([]byte{0, 1, 2, 0xfe, 0xff}, 300000)
	cases := map[string]*store.Record{
		"full":    sampleRecord(),
		"minimal": {Status: 204},
		"omitted": {Status: 200, Header: http.Header{"Content-Type": {"text/plain"}}, BodyOmitted: true},
		"big":     {Status: 200, Body: big},
		"zero times and long header": {Status: 400, Header: http.Header{
			"X-Long": {strings.Repeat("v", 70000)},
		}},
		"raw digest":          withRawDigest(sampleRecord()),
		"raw digest, omitted": {Status: 200, BodyOmitted: true, RawDigest: [32]byte{31: 1}},
		"raw digest only":     {Status: 204, RawDigest: [32]byte{0: 0xff}},
	}
	for name, rec := range cases {
		t.Run(name, func(t *testing.T) {
			b, err := encodeRecord(rec, "tok-123")
			if err != nil {
				t.Fatal(err)
			}
			if b[0] != tagRecordV2 {
				t.Fatalf("tag %#x, want %#x", b[0], tagRecordV2)
			}
			got, token, err := decodeRecord(string(b))
			if err != nil {
				t.Fatal(err)
			}
			if token != "tok-123" {
				t.Errorf("token %q, want tok-123", token)
			}
			sameRecord(t, got, rec)
		})
	}
}

func withRawDigest(rec *store.Record) *store.Record {
	for i := range rec.RawDigest {
		rec.RawDigest[i] = byte(0xa0 + i)
	}
	return rec
}

// TestRecordRawDigest: a record that keeps a raw digest costs 32 bytes
// more and sets flag bit 1; one without it is written as before the flag
// existed, byte for byte, so that an earlier release reads it.
func TestRecordRawDigest(t *testing.T) {
	without, err := encodeRecord(sampleRecord(), "tok")
	if err != nil {
		t.Fatal(err)
	}
	with, err := encodeRecord(withRawDigest(sampleRecord()), "tok")
	if err != nil {
		t.Fatal(err)
	}
	if len(with) != len(without)+32 {
		t.Errorf("with a raw digest %d bytes, without %d: want 32 more", len(with), len(without))
	}
	flags := 2 + len("tok")
	if without[flags] != 0 || with[flags] != flagRawDigest {
		t.Errorf("flags %#x without, %#x with a raw digest", without[flags], with[flags])
	}
	// Cut short inside the digest.
	if _, _, err := decodeRecord(string(with[:flags+1+2+32+16])); !errors.Is(err, ErrUnreadable) {
		t.Errorf("a record cut inside its raw digest: %v, want ErrUnreadable", err)
	}
}

// TestRecordOpensWithOwner checks what complete.lua relies on: a record
// opens with the same bytes as its owner's claim prefix but for the tag, so
// that a resent complete recognises the record it kept, and only that one.
func TestRecordOpensWithOwner(t *testing.T) {
	for _, token := range []string{"t", "tok-123", strings.Repeat("x", MaxTokenLen)} {
		p := ownerPrefix(token)
		b, err := encodeRecord(sampleRecord(), token)
		if err != nil {
			t.Fatal(err)
		}
		if b[0]%16 != kindRecord || p[0]%16 != kindInFlight || !bytes.Equal(b[1:len(p)], p[1:]) {
			t.Errorf("record %x... does not open with its owner %x but for the tag", b[:len(p)], p)
		}
		other, _ := encodeRecord(sampleRecord(), token+"x")
		if bytes.Equal(other[:len(p)], b[:len(p)]) {
			t.Errorf("records of %q and %q open alike", token, token+"x")
		}
	}
}

func TestRecordEncodingIsCompact(t *testing.T) {
	rec := &store.Record{Status: 200, Body: bytes.Repeat([]byte{0xff}, 1000)}
	b, err := encodeRecord(rec, "tok")
	if err != nil {
		t.Fatal(err)
	}
	// The body is kept as raw bytes after a fixed head: no base64, no JSON.
	if want := 2 + 3 + recordFixed + 1000; len(b) != want {
		t.Errorf("encoded %d bytes, want %d", len(b), want)
	}
}

func TestRecordEncodingIsDeterministic(t *testing.T) {
	a, _ := encodeRecord(sampleRecord(), "tok")
	for i := 0; i < 20; i++ { // map order varies from run to run
		b, _ := encodeRecord(sampleRecord(), "tok")
		if !bytes.Equal(a, b) {
			t.Fatal("two encodings of one record differ")
		}
	}
}

// goldenToken is the owner token of the pinned version 2 record.
const goldenToken = "0123456789abcdef0123456789abcdef"

// TestRecordV1Golden pins the version 1 layout: records written before
// version 2 (by earlier releases, which no longer write it) must stay
// readable by every later one. Never regenerate this file.
func TestRecordV1Golden(t *testing.T) {
	golden := readGolden(t, "testdata/record-v1.hex", nil)
	if golden[0] != tagRecordV1 {
		t.Fatalf("tag %#x, want %#x", golden[0], tagRecordV1)
	}
	got, token, err := decodeRecord(string(golden))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		t.Errorf("version 1 record decoded with token %q", token)
	}
	sameRecord(t, got, sampleRecord())
	if st, err := stateOf(string(golden[:1])); err != nil || st != store.Completed {
		t.Errorf("stateOf(v1 record) = %v, %v", st, err)
	}
}

// TestRecordV2Golden pins the version 2 layout: a record written by this
// version must stay readable by every later one. Regenerate the file
// (IDEMKEY_WRITE_GOLDEN=1) only for a new version tag, never for tag 0x22.
func TestRecordV2Golden(t *testing.T) {
	b, err := encodeRecord(sampleRecord(), goldenToken)
	if err != nil {
		t.Fatal(err)
	}
	golden := readGolden(t, "testdata/record-v2.hex", b)
	if !bytes.Equal(b, golden) {
		t.Errorf("encoding changed:\n got %x\nwant %x", b, golden)
	}
	got, token, err := decodeRecord(string(golden))
	if err != nil {
		t.Fatal(err)
	}
	if token != goldenToken {
		t.Errorf("token %q, want %q", token, goldenToken)
	}
	sameRecord(t, got, sampleRecord())
}

// TestRecordV2RawDigestGolden pins the version 2 layout of a record that
// keeps a raw digest (flag bit 1): it must stay readable by every later
// version. Never regenerate it for tag 0x22.
func TestRecordV2RawDigestGolden(t *testing.T) {
	want := withRawDigest(sampleRecord())
	b, err := encodeRecord(want, goldenToken)
	if err != nil {
		t.Fatal(err)
	}
	golden := readGolden(t, "testdata/record-v2-raw.hex", b)
	if !bytes.Equal(b, golden) {
		t.Errorf("encoding changed:\n got %x\nwant %x", b, golden)
	}
	got, token, err := decodeRecord(string(golden))
	if err != nil {
		t.Fatal(err)
	}
	if token != goldenToken {
		t.Errorf("token %q, want %q", token, goldenToken)
	}
	sameRecord(t, got, want)
}

// readGolden reads a hex file from testdata, first writing b to it when
// IDEMKEY_WRITE_GOLDEN is set and b is not nil.
func readGolden(t *testing.T, path string, b []byte) []byte {
	t.Helper()
	if os.Getenv("IDEMKEY_WRITE_GOLDEN") != "" && b != nil {
		if err := os.WriteFile(path, []byte(hex.EncodeToString(b)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	golden, err := hex.DecodeString(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	return golden
}

// v1Record returns the pinned version 1 encoding of sampleRecord.
func v1Record(t testing.TB) []byte {
	t.Helper()
	raw, err := os.ReadFile("testdata/record-v1.hex")
	if err != nil {
		t.Fatal(err)
	}
	b, err := hex.DecodeString(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestInFlightRoundTrip(t *testing.T) {
	fp := [32]byte{9, 8, 7}
	created := time.Unix(1767225600, 5)
	expires := created.Add(35 * time.Second)
	v := encodeInFlight("tok-123", fp, created, expires)
	if v[0] != tagInFlightV2 || !bytes.HasPrefix(v, ownerPrefix("tok-123")) {
		t.Fatalf("value %x does not open with its owner", v)
	}
	f, err := decodeInFlight(string(v))
	if err != nil {
		t.Fatal(err)
	}
	if f.token != "tok-123" || f.fingerprint != fp || !f.created.Equal(created) || !f.expires.Equal(expires) {
		t.Errorf("decoded %+v", f)
	}
	// extend.lua rewrites expires-at 40 bytes after the owner.
	p := ownerPrefix("tok-123")
	later := expires.Add(time.Minute)
	copy(v[len(p)+40:], appendTime(nil, later))
	if f, err := decodeInFlight(string(v)); err != nil || !f.expires.Equal(later) || !f.created.Equal(created) {
		t.Errorf("after rewriting expires-at: %+v, %v", f, err)
	}
	// A longer token that starts with the same bytes is another owner.
	if bytes.HasPrefix(v, ownerPrefix("tok-1234")) || bytes.HasPrefix(encodeInFlight("tok-1234", fp, created, expires), ownerPrefix("tok-123")) {
		t.Error("owner prefixes of tok-123 and tok-1234 overlap")
	}
}

// v1Claim returns a claim in the version 1 layout, which earlier releases
// wrote: tag 0x11, the owner, fingerprint and created-at, no expiry.
func v1Claim(token string, fp [32]byte, created time.Time) []byte {
	b := appendOwner(nil, tagInFlightV1, token)
	b = append(b, fp[:]...)
	return appendTime(b, created)
}

// TestClaimGolden pins the claim layouts: version 2, which this version
// writes, and version 1, which claims of earlier releases still hold while
// they run. Regenerate claim-v2.hex (IDEMKEY_WRITE_GOLDEN=1) only for a new
// version tag; never claim-v1.hex.
func TestClaimGolden(t *testing.T) {
	fp := sampleRecord().Fingerprint
	created := time.Unix(1767225600, 123456789)
	expires := created.Add(35 * time.Second)
	for _, c := range []struct {
		path    string
		b       []byte
		expires time.Time
	}{
		{"testdata/claim-v1.hex", v1Claim(goldenToken, fp, created), time.Time{}},
		{"testdata/claim-v2.hex", encodeInFlight(goldenToken, fp, created, expires), expires},
	} {
		golden := readGolden(t, c.path, c.b)
		if !bytes.Equal(c.b, golden) {
			t.Errorf("%s: encoding changed:\n got %x\nwant %x", c.path, c.b, golden)
		}
		f, err := decodeInFlight(string(golden))
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		if f.token != goldenToken || f.fingerprint != fp || !f.created.Equal(created) || !f.expires.Equal(c.expires) {
			t.Errorf("%s: decoded %+v", c.path, f)
		}
		if st, err := stateOf(string(golden[:1])); err != nil || st != store.InFlight {
			t.Errorf("%s: stateOf = %v, %v", c.path, st, err)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	rec, _ := encodeRecord(sampleRecord(), "tok")
	v1 := v1Record(t)
	fl := encodeInFlight("tok", [32]byte{}, time.Time{}, time.Time{})
	fl1 := v1Claim("tok", [32]byte{}, time.Time{})
	type input struct {
		v        string
		inFlight bool
	}
	head := 2 + len("tok") // the owner before the record's fields
	cases := map[string]input{
		"empty record":          {"", false},
		"future record version": {"\x32" + string(rec[1:]), false},
		"in flight as record":   {string(fl), false},
		"unknown flags":         {string(rec[:head]) + "\x80" + string(rec[head+1:]), false},
		"unknown v1 flags":      {string(v1[:1]) + "\x80" + string(v1[2:]), false},
		"token past the end":    {"\x22\xff" + string(rec[2:40]), false},
		"empty claim":           {"", true},
		"future claim version":  {"\x31" + string(fl[1:]), true},
		"claim too long":        {string(fl) + "x", true},
		"v1 claim too long":     {string(fl1) + "x", true},
		"v1 claim as v2":        {"\x21" + string(fl1[1:]), true},
		"v2 claim as v1":        {"\x11" + string(fl[1:]), true},
		"record as claim":       {string(rec), true},
		"v1 record as claim":    {string(v1), true},
	}
	for i := 1; i < head+recordFixed+40; i++ { // every cut inside the head and header block
		cases["record cut at "+strconv.Itoa(i)] = input{string(rec[:i]), false}
	}
	for i := 1; i < 1+recordFixed+40; i++ {
		cases["v1 record cut at "+strconv.Itoa(i)] = input{string(v1[:i]), false}
	}
	for i := 1; i < len(fl); i++ {
		cases["claim cut at "+strconv.Itoa(i)] = input{string(fl[:i]), true}
	}
	for i := 1; i < len(fl1); i++ {
		cases["v1 claim cut at "+strconv.Itoa(i)] = input{string(fl1[:i]), true}
	}
	for name, c := range cases {
		var err error
		if c.inFlight {
			_, err = decodeInFlight(c.v)
		} else {
			_, _, err = decodeRecord(c.v)
		}
		if !errors.Is(err, ErrUnreadable) {
			t.Errorf("%s: err = %v, want ErrUnreadable", name, err)
		}
		if errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s: unreadable value reported as unavailable", name)
		}
	}
}

func TestEncodeRejects(t *testing.T) {
	if _, err := encodeRecord(&store.Record{Status: 70000}, "tok"); err == nil {
		t.Error("status 70000 encoded")
	}
	if _, err := encodeRecord(&store.Record{Status: 200, Header: http.Header{strings.Repeat("n", 70000): {"v"}}}, "tok"); err == nil {
		t.Error("header name of 70000 bytes encoded")
	}
	if err := checkToken(""); err == nil {
		t.Error("empty token accepted")
	}
	if err := checkToken(strings.Repeat("t", MaxTokenLen+1)); err == nil {
		t.Error("token over MaxTokenLen accepted")
	}
	if err := checkToken(strings.Repeat("t", MaxTokenLen)); err != nil {
		t.Errorf("token of MaxTokenLen refused: %v", err)
	}
}

// FuzzDecodeRecord: no input panics the decoder, whatever it accepts (of
// either version) encodes back to a value that decodes to the same record
// and token, and the claim decoder refuses it.
func FuzzDecodeRecord(f *testing.F) {
	full, _ := encodeRecord(sampleRecord(), "tok")
	min, _ := encodeRecord(&store.Record{Status: 200}, "t")
	f.Add(full)
	f.Add(min)
	f.Add(v1Record(f))
	f.Add(encodeInFlight("tok", [32]byte{1}, time.Unix(1, 0), time.Unix(2, 0)))
	f.Add([]byte{})
	f.Add([]byte{tagRecordV1})
	f.Add([]byte{tagRecordV2, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, token, err := decodeRecord(string(b))
		if err != nil {
			if !errors.Is(err, ErrUnreadable) {
				t.Fatalf("error %v does not wrap ErrUnreadable", err)
			}
			return
		}
		if _, err := decodeInFlight(string(b)); err == nil {
			t.Fatalf("%x reads both as a record and as a claim", b)
		}
		if b[0] == tagRecordV1 {
			token = "v1"
		}
		again, err := encodeRecord(rec, token)
		if err != nil {
			t.Fatalf("decoded record does not encode: %v", err)
		}
		rec2, token2, err := decodeRecord(string(again))
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if token2 != token {
			t.Fatalf("token %q came back as %q", token, token2)
		}
		sameRecord(t, rec2, rec)
	})
}

// FuzzDecodeInFlight: no input panics the claim decoder, an accepted claim
// re-encodes to the same bytes (version 2) or fields (version 1), and the
// record decoder refuses it.
func FuzzDecodeInFlight(f *testing.F) {
	f.Add(encodeInFlight("tok", [32]byte{1}, time.Unix(1, 0), time.Unix(2, 0)))
	f.Add(encodeInFlight(strings.Repeat("t", MaxTokenLen), [32]byte{}, time.Time{}, time.Time{}))
	f.Add(v1Claim("tok", [32]byte{1}, time.Unix(1, 0)))
	f.Add([]byte{tagInFlightV1, 200})
	f.Add([]byte{tagInFlightV2, 200})
	f.Add(v1Record(f))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeInFlight(string(b))
		if err != nil {
			if !errors.Is(err, ErrUnreadable) {
				t.Fatalf("error %v does not wrap ErrUnreadable", err)
			}
			return
		}
		if _, _, err := decodeRecord(string(b)); err == nil {
			t.Fatalf("%x reads both as a claim and as a record", b)
		}
		var got []byte
		if b[0] == tagInFlightV1 {
			got = v1Claim(c.token, c.fingerprint, c.created)
		} else {
			got = encodeInFlight(c.token, c.fingerprint, c.created, c.expires)
		}
		if !bytes.Equal(got, b) {
			t.Fatalf("re-encoded %x, want %x", got, b)
		}
	})
}

// TestInFlightMarked: a version 2 claim a waiter marked (one 'w' after its
// fixed fields, mark.lua) decodes as the claim it was; any other byte
// there, or two, is unreadable.
func TestInFlightMarked(t *testing.T) {
	created := time.Unix(1767225600, 5)
	expires := created.Add(time.Minute)
	v := encodeInFlight("tok", [32]byte{9}, created, expires)
	f, err := decodeInFlight(string(v) + "w")
	if err != nil || f.token != "tok" || f.fingerprint != [32]byte{9} || !f.created.Equal(created) || !f.expires.Equal(expires) {
		t.Errorf("marked claim decoded as %+v, %v", f, err)
	}
	for _, bad := range []string{"x", "ww", "\x00"} {
		if _, err := decodeInFlight(string(v) + bad); !errors.Is(err, ErrUnreadable) {
			t.Errorf("claim followed by %q: %v, want ErrUnreadable", bad, err)
		}
	}
}

// TestBulkReply reads the claim's reply as the protocol sends it: nil in
// RESP2 and RESP3, a bulk string of any bytes; anything else (an error
// reply, a redirection, a malformed length) is not a claim's answer.
func TestBulkReply(t *testing.T) {
	for _, tc := range []struct {
		in       string
		v        string
		free, ok bool
	}{
		{"_\r\n", "", true, true},
		{"$-1\r\n", "", true, true},
		{"$0\r\n\r\n", "", false, true},
		{"$5\r\na\r\nb\x00\r\n", "a\r\nb\x00", false, true},
		{"-MOVED 3999 127.0.0.1:6381\r\n", "", false, false},
		{"-LOADING Redis is loading\r\n", "", false, false},
		{"!5\r\nerror\r\n", "", false, false},
		{"+OK\r\n", "", false, false},
		{"$5\r\nabc\r\n", "", false, false},
		{"$x\r\nabc\r\n", "", false, false},
		{"", "", false, false},
	} {
		v, free, ok := bulkReply([]byte(tc.in))
		if v != tc.v || free != tc.free || ok != tc.ok {
			t.Errorf("bulkReply(%q) = %q, %v, %v; want %q, %v, %v", tc.in, v, free, ok, tc.v, tc.free, tc.ok)
		}
	}
}
