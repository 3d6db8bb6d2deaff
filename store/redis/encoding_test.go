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
	if got.Status != want.Status || got.BodyOmitted != want.BodyOmitted || got.Fingerprint != want.Fingerprint {
		t.Errorf("record fields = %d %v %x, want %d %v %x", got.Status, got.BodyOmitted, got.Fingerprint, want.Status, want.BodyOmitted, want.Fingerprint)
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
	}
	for name, rec := range cases {
		t.Run(name, func(t *testing.T) {
			b, err := encodeRecord(rec)
			if err != nil {
				t.Fatal(err)
			}
			if b[0] != tagRecordV1 {
				t.Fatalf("tag %#x, want %#x", b[0], tagRecordV1)
			}
			got, err := decodeRecord(string(b))
			if err != nil {
				t.Fatal(err)
			}
			sameRecord(t, got, rec)
		})
	}
}

func TestRecordEncodingIsCompact(t *testing.T) {
	rec := &store.Record{Status: 200, Body: bytes.Repeat([]byte{0xff}, 1000)}
	b, err := encodeRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	// The body is kept as raw bytes after a fixed head: no base64, no JSON.
	if want := recordFixed + 1000; len(b) != want {
		t.Errorf("encoded %d bytes, want %d", len(b), want)
	}
}

func TestRecordEncodingIsDeterministic(t *testing.T) {
	a, _ := encodeRecord(sampleRecord())
	for i := 0; i < 20; i++ { // map order varies from run to run
		b, _ := encodeRecord(sampleRecord())
		if !bytes.Equal(a, b) {
			t.Fatal("two encodings of one record differ")
		}
	}
}

// TestRecordV1Golden pins the version 1 layout: a record written by this
// version must stay readable by every later one. Regenerate the file only
// with a new version tag, never for tag 0x12.
func TestRecordV1Golden(t *testing.T) {
	b, err := encodeRecord(sampleRecord())
	if err != nil {
		t.Fatal(err)
	}
	const path = "testdata/record-v1.hex"
	if os.Getenv("IDEMKEY_WRITE_GOLDEN") != "" {
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
	if !bytes.Equal(b, golden) {
		t.Errorf("encoding changed:\n got %x\nwant %x", b, golden)
	}
	got, err := decodeRecord(string(golden))
	if err != nil {
		t.Fatal(err)
	}
	sameRecord(t, got, sampleRecord())
}

func TestInFlightRoundTrip(t *testing.T) {
	fp := [32]byte{9, 8, 7}
	created := time.Unix(1767225600, 5)
	v := encodeInFlight("tok-123", fp, created)
	if !bytes.HasPrefix(v, ownerPrefix("tok-123")) {
		t.Fatalf("value %x does not open with its owner", v)
	}
	f, err := decodeInFlight(string(v))
	if err != nil {
		t.Fatal(err)
	}
	if f.token != "tok-123" || f.fingerprint != fp || !f.created.Equal(created) {
		t.Errorf("decoded %+v", f)
	}
	// A longer token that starts with the same bytes is another owner.
	if bytes.HasPrefix(v, ownerPrefix("tok-1234")) || bytes.HasPrefix(encodeInFlight("tok-1234", fp, created), ownerPrefix("tok-123")) {
		t.Error("owner prefixes of tok-123 and tok-1234 overlap")
	}
}

func TestDecodeRejects(t *testing.T) {
	rec, _ := encodeRecord(sampleRecord())
	fl := encodeInFlight("tok", [32]byte{}, time.Time{})
	cases := map[string]struct {
		v        string
		inFlight bool
	}{
		"empty record":          {"", false},
		"future record version": {"\x22" + string(rec[1:]), false},
		"in flight as record":   {string(fl), false},
		"unknown flags":         {string(rec[:1]) + "\x80" + string(rec[2:]), false},
		"empty claim":           {"", true},
		"future claim version":  {"\x21" + string(fl[1:]), true},
		"claim too long":        {string(fl) + "x", true},
		"record as claim":       {string(rec), true},
	}
	for i := 1; i < recordFixed+40; i++ { // every cut inside the head and header block
		cases["record cut at "+strconv.Itoa(i)] = struct {
			v        string
			inFlight bool
		}{string(rec[:i]), false}
	}
	for i := 1; i < len(fl); i++ {
		cases["claim cut at "+strconv.Itoa(i)] = struct {
			v        string
			inFlight bool
		}{string(fl[:i]), true}
	}
	for name, c := range cases {
		var err error
		if c.inFlight {
			_, err = decodeInFlight(c.v)
		} else {
			_, err = decodeRecord(c.v)
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
	if _, err := encodeRecord(&store.Record{Status: 70000}); err == nil {
		t.Error("status 70000 encoded")
	}
	if _, err := encodeRecord(&store.Record{Status: 200, Header: http.Header{strings.Repeat("n", 70000): {"v"}}}); err == nil {
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

// FuzzDecodeRecord: no input panics the decoder, and whatever it accepts
// encodes back to a value that decodes to the same record.
func FuzzDecodeRecord(f *testing.F) {
	full, _ := encodeRecord(sampleRecord())
	min, _ := encodeRecord(&store.Record{Status: 200})
	f.Add(full)
	f.Add(min)
	f.Add(encodeInFlight("tok", [32]byte{1}, time.Unix(1, 0)))
	f.Add([]byte{})
	f.Add([]byte{tagRecordV1})
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := decodeRecord(string(b))
		if err != nil {
			if !errors.Is(err, ErrUnreadable) {
				t.Fatalf("error %v does not wrap ErrUnreadable", err)
			}
			return
		}
		again, err := encodeRecord(rec)
		if err != nil {
			t.Fatalf("decoded record does not encode: %v", err)
		}
		rec2, err := decodeRecord(string(again))
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		sameRecord(t, rec2, rec)
	})
}

// FuzzDecodeInFlight: no input panics the claim decoder, and an accepted
// claim re-encodes to the same bytes.
func FuzzDecodeInFlight(f *testing.F) {
	f.Add(encodeInFlight("tok", [32]byte{1}, time.Unix(1, 0)))
	f.Add(encodeInFlight(strings.Repeat("t", MaxTokenLen), [32]byte{}, time.Time{}))
	f.Add([]byte{tagInFlightV1, 200})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeInFlight(string(b))
		if err != nil {
			if !errors.Is(err, ErrUnreadable) {
				t.Fatalf("error %v does not wrap ErrUnreadable", err)
			}
			return
		}
		if got := encodeInFlight(c.token, c.fingerprint, c.created); !bytes.Equal(got, b) {
			t.Fatalf("re-encoded %x, want %x", got, b)
		}
	})
}
