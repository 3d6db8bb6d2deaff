package sqlcore

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []http.Header{
		nil,
		{"Content-Type": {"application/json"}},
		{"A": {"1", "2"}, "B": {""}, "Location": {"/x/1"}},
	} {
		got, err := DecodeHeader(EncodeHeader(h))
		if err != nil {
			t.Fatal(err)
		}
		if len(h) == 0 && len(got) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, h) {
			t.Errorf("round trip of %v gave %v", h, got)
		}
	}
	b := EncodeHeader(http.Header{"A": {"value"}})
	for _, bad := range [][]byte{{0x09}, b[:len(b)-1], append([]byte{headerV1}, 0, 0)} {
		if _, err := DecodeHeader(bad); !errors.Is(err, ErrHeaderBlock) {
			t.Errorf("DecodeHeader(%x) = %v, want ErrHeaderBlock", bad, err)
		}
	}
}

func TestFoundResult(t *testing.T) {
	c := store.Claim{Token: "t", Fingerprint: [32]byte{1}, TTL: 10 * time.Second}
	fp := c.Fingerprint[:]
	now := time.Now().Truncate(time.Microsecond)
	cases := []struct {
		f    Found
		want store.State
		same bool
	}{
		{Found{Kind: HeldSame}, store.InFlight, true},
		{Found{Kind: HeldOther}, store.InFlight, false},
		{Found{Kind: Row, Token: "other", Fingerprint: fp, CreatedAt: now, Remaining: time.Second}, store.InFlight, true},
		{Found{Kind: Row, Token: "t", Fingerprint: fp, CreatedAt: now, Remaining: time.Second}, store.Mine, true},
		{Found{Kind: Row, Token: "t", Fingerprint: fp, Kept: true, Status: 201, CreatedAt: now, RawDigest: make([]byte, 32)}, store.Completed, true},
	}
	for i, tc := range cases {
		res, err := tc.f.Result(c)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if res.State != tc.want || (res.Fingerprint == c.Fingerprint) != tc.same {
			t.Errorf("case %d: %v same fingerprint %v, want %v %v", i, res.State, res.Fingerprint == c.Fingerprint, tc.want, tc.same)
		}
		if res.State == store.Completed && (res.Record.Status != 201 || res.Record.Body == nil) {
			t.Errorf("case %d: record %+v", i, res.Record)
		}
	}
	if _, err := (&Found{Kind: Row, Fingerprint: []byte{1}}).Result(c); err == nil {
		t.Error("a fingerprint of one byte was read")
	}
	if _, err := (&Found{Kind: Row, Fingerprint: fp, Kept: true, RawDigest: []byte{1}}).Result(c); err == nil {
		t.Error("a raw digest of one byte was read")
	}
}

func TestRetry(t *testing.T) {
	n := 0
	done, err := Retry(context.Background(), 0, func() (Outcome, error) {
		n++
		return Lost, errors.New("lost")
	})
	if n != Attempts || done || err == nil || err.Error() != "lost" {
		t.Errorf("%d attempts, %v", n, err)
	}
	n = 0
	done, err = Retry(context.Background(), time.Millisecond, func() (Outcome, error) {
		n++
		if n == 3 {
			return Done, nil
		}
		return Again, nil
	})
	if n != 3 || !done || err != nil {
		t.Errorf("%d attempts, %v", n, err)
	}
}

func TestLocks(t *testing.T) {
	a1, a2 := LockIDs("t", "k", [32]byte{})
	b1, b2 := LockIDs("u", "k", [32]byte{})
	_, c2 := LockIDs("t", "k", [32]byte{1})
	if a1 == b1 || a2 == b2 || a1 == a2 || a2 == c2 {
		t.Error("lock ids collide")
	}
	if n := LockName([]byte("db"), []byte("t"), []byte("k")); len(n) != 64 {
		t.Errorf("lock name %q of %d characters", n, len(n))
	}
}

func TestStartContext(t *testing.T) {
	ctx, cancel := StartContext(context.Background())
	defer cancel()
	if d, ok := ctx.Deadline(); !ok || time.Until(d) > DefaultStartTimeout {
		t.Errorf("deadline %v %v", d, ok)
	}
}
