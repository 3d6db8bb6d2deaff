package memory

import (
	"net/http"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// counted is a store.Fingerprinter that counts how often it is asked.
type counted struct {
	fp    [32]byte
	asked int
}

func (c *counted) Fingerprint() [32]byte {
	c.asked++
	return c.fp
}

// TestClaimLazyAsksOnlyToWriteTheClaim: ClaimLazy asks for the fingerprint
// once when the key is free and writes the claim with it, and never when
// the key is in flight or completed; the claim it wrote is what a repeat
// sees.
func TestClaimLazyAsksOnlyToWriteTheClaim(t *testing.T) {
	s := mustNew(t)
	ctx := t.Context()
	key := store.KeyName("s", "k")
	fp := &counted{fp: [32]byte{7}}
	c := store.Claim{Token: "owner", TTL: time.Hour}
	res, err := s.ClaimLazy(ctx, key, c, fp)
	if err != nil || res.State != store.Claimed || res.Fingerprint != fp.fp || fp.asked != 1 {
		t.Fatalf("free key: %+v %v, asked %d, want claimed with the fingerprint, asked once", res, err, fp.asked)
	}
	repeat := &counted{fp: [32]byte{8}}
	res, err = s.ClaimLazy(ctx, key, store.Claim{Token: "repeat", TTL: time.Hour}, repeat)
	if err != nil || res.State != store.InFlight || res.Fingerprint != fp.fp || repeat.asked != 0 {
		t.Fatalf("in flight: %+v %v, asked %d, want the owner's fingerprint, never asked", res, err, repeat.asked)
	}
	raw := [32]byte{9, 9}
	if err := s.Complete(ctx, key, "owner", &store.Record{Status: 201, Fingerprint: fp.fp, RawDigest: raw, Header: http.Header{"A": {"b"}}}, time.Hour); err != nil {
		t.Fatal(err)
	}
	res, err = s.ClaimLazy(ctx, key, store.Claim{Token: "repeat", TTL: time.Hour}, repeat)
	if err != nil || res.State != store.Completed || repeat.asked != 0 {
		t.Fatalf("completed: %+v %v, asked %d, want completed, never asked", res, err, repeat.asked)
	}
	if res.Record.RawDigest != raw || res.Record.Fingerprint != fp.fp || res.Record.Header.Get("A") != "b" {
		t.Fatalf("record %+v: want its raw digest and fingerprint kept", res.Record)
	}
}

// TestRecordWithoutRawDigest: a record kept with no raw digest reads back
// with a zero one, and the rest unchanged.
func TestRecordWithoutRawDigest(t *testing.T) {
	for _, raw := range [][32]byte{{}, {1}, {0xff, 2, 3}} {
		rec := &store.Record{Status: 200, Body: []byte("x"), RawDigest: raw, CreatedAt: time.Unix(5, 6), CompletedAt: time.Unix(7, 8), BodyOmitted: raw[0] == 1}
		got := decode(encode("tok", rec), [32]byte{4})
		if got.RawDigest != raw || string(got.Body) != "x" || !got.CreatedAt.Equal(rec.CreatedAt) || !got.CompletedAt.Equal(rec.CompletedAt) || got.BodyOmitted != rec.BodyOmitted {
			t.Errorf("raw %x: decoded %+v", raw[:3], got)
		}
	}
}
