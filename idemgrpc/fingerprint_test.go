package idemgrpc

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/idemkey/idemkey/idemgrpc/internal/testpb"
)

// TestWithoutIsClearedEncoding: dropping the key field's records from the
// deterministic encoding gives the encoding of the message with the field
// cleared, and leaves the message itself alone.
func TestWithoutIsClearedEncoding(t *testing.T) {
	det := proto.MarshalOptions{Deterministic: true}
	msgs := []*testpb.CreatePaymentRequest{
		{RequestId: "k1"},
		{RequestId: "k1", Amount: 5, Currency: "eur"},
		{Amount: 5, Labels: map[string]string{"b": "2", "a": "1", "request_id": "x"}},
		{RequestId: "k2", Amount: -1, Currency: "\x00", Labels: map[string]string{"z": ""}},
	}
	for _, m := range msgs {
		fd := m.ProtoReflect().Descriptor().Fields().ByName("request_id")
		enc, err := det.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		c := proto.Clone(m)
		c.ProtoReflect().Clear(fd)
		want, err := det.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		if got := without(bytes.Clone(enc), fd.Number()); !bytes.Equal(got, want) {
			t.Errorf("%v: without = %x, want %x", m, got, want)
		}
		if bytes.Equal(enc, want) != (m.GetRequestId() == "") {
			t.Errorf("%v: encoding and cleared encoding agree: %v", m, bytes.Equal(enc, want))
		}
		before := m.GetRequestId()
		f1, err := fingerprint("/p.S/M", m, fd)
		if err != nil {
			t.Fatal(err)
		}
		if m.GetRequestId() != before {
			t.Fatalf("fingerprint changed the request")
		}
		f2, _ := fingerprint("/p.S/M", c, nil)
		if f1 != f2 {
			t.Errorf("%v: fingerprint without the field differs from the cleared message's", m)
		}
		if f3, _ := fingerprint("/p.S/N", c, nil); f3 == f2 {
			t.Errorf("two methods share a fingerprint")
		}
	}
	if got := without([]byte{0xff}, 1); !bytes.Equal(got, []byte{0xff}) {
		t.Errorf("unreadable encoding changed: %x", got)
	}
}
