package middleware

import (
	"strings"
	"testing"

	"github.com/google/uuid"
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
