package redis_test

import (
	"context"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// TestDecodeValue reads back what the store wrote: a claim, then the record
// that completed it.
func TestDecodeValue(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := goredis.NewClient(&goredis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	st, err := redis.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := store.KeyName("alice", "inspect-1")
	fp := [32]byte{9, 8, 7}
	before := time.Now()
	if _, err := st.Claim(ctx, key, store.Claim{Token: "tok-123", Fingerprint: fp, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	raw := mr.DB(0).Keys()
	if len(raw) != 1 || raw[0] != key {
		t.Fatalf("keys %v, want [%s]", raw, key)
	}
	v, _ := mr.Get(key)
	got, err := redis.DecodeValue(v)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != store.InFlight || got.Fingerprint != fp || got.Record != nil || got.Size != len(v) {
		t.Errorf("claim decoded as %+v", got)
	}
	if got.CreatedAt.Before(before.Add(-time.Second)) || got.CreatedAt.After(time.Now().Add(time.Second)) {
		t.Errorf("claim created at %v, want about %v", got.CreatedAt, before)
	}
	if st, err := redis.StateOf(v[:1]); err != nil || st != store.InFlight {
		t.Errorf("StateOf(claim's first byte) = %v, %v", st, err)
	}

	rec := &store.Record{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":1}`), Fingerprint: fp, CreatedAt: got.CreatedAt, CompletedAt: got.CreatedAt.Add(time.Millisecond)}
	if err := st.Complete(ctx, key, "tok-123", rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	v, _ = mr.Get(key)
	got, err = redis.DecodeValue(v)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != store.Completed || got.Fingerprint != fp || got.Record == nil || got.Size != len(v) {
		t.Fatalf("record decoded as %+v", got)
	}
	if got.Record.Status != 201 || string(got.Record.Body) != `{"id":1}` || got.Record.Header.Get("Content-Type") != "application/json" ||
		!got.Record.CompletedAt.Equal(rec.CompletedAt) || !got.CreatedAt.Equal(rec.CreatedAt) {
		t.Errorf("record decoded as %+v", got.Record)
	}
	if st, err := redis.StateOf(v[:1]); err != nil || st != store.Completed {
		t.Errorf("StateOf(record's first byte) = %v, %v", st, err)
	}
}

func TestDecodeValueUnreadable(t *testing.T) {
	for name, v := range map[string]string{
		"empty":          "",
		"later version":  "\x31rest",
		"unknown kind":   "\x13",
		"short claim":    "\x11\x05ab",
		"short record":   "\x12\x00\x00",
		"plain text":     "hello",
		"json elsewhere": `{"status":201}`,
	} {
		if _, err := redis.DecodeValue(v); !errors.Is(err, redis.ErrUnreadable) {
			t.Errorf("%s: DecodeValue error %v, want ErrUnreadable", name, err)
		}
	}
	if _, err := redis.StateOf(""); !errors.Is(err, redis.ErrUnreadable) {
		t.Errorf("StateOf(\"\") error %v", err)
	}
}

// TestDecodeValueV1Record reads a record in the version 1 format, which
// earlier releases wrote and which stays in Redis for its retention after
// an upgrade: operators' tools must keep showing it.
func TestDecodeValueV1Record(t *testing.T) {
	raw, err := os.ReadFile("testdata/record-v1.hex")
	if err != nil {
		t.Fatal(err)
	}
	b, err := hex.DecodeString(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	got, err := redis.DecodeValue(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if got.State != store.Completed || got.Record == nil || got.Record.Status != 201 ||
		got.Record.Header.Get("Location") != "/orders/42" || got.Size != len(b) ||
		!got.CreatedAt.Equal(time.Unix(1767225600, 123456789)) {
		t.Errorf("v1 record decoded as %+v", got)
	}
	if st, err := redis.StateOf(string(b[:1])); err != nil || st != store.Completed {
		t.Errorf("StateOf(v1 record's first byte) = %v, %v", st, err)
	}
}
