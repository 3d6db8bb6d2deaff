package postgres

import (
	"errors"
	"net/http"
	"reflect"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []http.Header{
		nil,
		{},
		{"Content-Type": {"application/json"}},
		{"X-Empty": {""}, "X-Many": {"a", "b, c", ""}, "Location": {"/p/1"}},
		{"X-None": {}},
	} {
		b, err := encodeHeader(h)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeHeader(b)
		if err != nil {
			t.Fatalf("%v: %v", h, err)
		}
		if len(h) == 0 && len(got) == 0 {
			continue
		}
		want := http.Header{}
		for k, v := range h {
			want[k] = append([]string{}, v...)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("round trip of %v gave %v", h, got)
		}
	}
}

func TestHeaderUnreadable(t *testing.T) {
	good, _ := encodeHeader(http.Header{"A": {"b"}})
	for _, b := range [][]byte{
		{0x02},
		good[:len(good)-1],
		append(append([]byte{}, good...), 0),
		{headerV1, 0, 0, 0, 0}, // an empty name
	} {
		if _, err := decodeHeader(b); !errors.Is(err, ErrUnreadable) {
			t.Errorf("decodeHeader(%x): %v, want ErrUnreadable", b, err)
		}
	}
}

// FuzzDecodeHeader: no input panics, and whatever decodes encodes back to
// the same bytes (names sorted, one way to write each header).
func FuzzDecodeHeader(f *testing.F) {
	for _, h := range []http.Header{{"A": {"b"}}, {"X": {"", "y"}, "Z": {}}} {
		b, _ := encodeHeader(h)
		f.Add(b)
	}
	f.Add([]byte{headerV1})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeHeader(b)
		if err != nil {
			return
		}
		again, err := encodeHeader(h)
		if err != nil {
			t.Fatal(err)
		}
		if len(h) == 0 {
			return
		}
		if string(again) != string(b) {
			t.Fatalf("%x decoded to %v, which encodes to %x", b, h, again)
		}
	})
}
