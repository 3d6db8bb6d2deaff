package middleware

import (
	"crypto/rand"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey/store"
)

// An owner token made with a request id is written as crypto/rand.Text
// writes one, and the id is a random version 4 UUID as newRequestID makes;
// neither repeats.
func TestNewTokenWithRequestID(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		token, id := newToken(true)
		if len(token) != tokenLen || strings.Trim(token, base32) != "" {
			t.Fatalf("token %q is not 26 characters of crypto/rand.Text's alphabet", token)
		}
		u, err := uuid.Parse(id)
		if err != nil || u.Version() != 4 || u.Variant() != uuid.RFC4122 || u.String() != id {
			t.Fatalf("request id %q: %v, version %v, variant %v", id, err, u.Version(), u.Variant())
		}
		if seen[token] || seen[id] {
			t.Fatalf("%q or %q made twice", token, id)
		}
		seen[token], seen[id] = true, true
	}
	if token, id := newToken(false); len(token) != tokenLen || id != "" {
		t.Errorf("without an id: %q, %q", token, id)
	}
}

// names makes the key's store name, a token and a request id as
// store.KeyName and newToken make them.
func TestNames(t *testing.T) {
	for _, withID := range []bool{true, false} {
		skey, token, id := names("alice", "k-1", withID)
		if skey != store.KeyName("alice", "k-1") || len(token) != tokenLen || strings.Trim(token, base32) != "" {
			t.Fatalf("names: %q %q", skey, token)
		}
		if _, err := uuid.Parse(id); (err == nil) != withID {
			t.Fatalf("with id %v: id %q", withID, id)
		}
	}
}

// Tokens made at once on many goroutines, each of which may take a
// generator another just put back, never repeat.
func TestNewTokenConcurrentUnique(t *testing.T) {
	const goroutines, each = 8, 2000
	out := make(chan string, goroutines*each*2)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range each {
				token, id := newToken(true)
				out <- token
				out <- id
			}
		})
	}
	wg.Wait()
	close(out)
	seen := map[string]bool{}
	for s := range out {
		if seen[s] {
			t.Fatalf("%q made twice", s)
		}
		seen[s] = true
	}
	if len(seen) != goroutines*each*2 {
		t.Fatalf("%d distinct values, want %d", len(seen), goroutines*each*2)
	}
}

// BenchmarkNewToken measures a first run's owner token and request id
// against reading the same 42 bytes from crypto/rand alone.
func BenchmarkNewToken(b *testing.B) {
	b.Run("newToken", func(b *testing.B) {
		for b.Loop() {
			newToken(true)
		}
	})
	b.Run("crypto-rand-read", func(b *testing.B) {
		var src [tokenLen + 16]byte
		for b.Loop() {
			rand.Read(src[:])
		}
	})
}
