package middleware

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// countPrints makes m count the canonical fingerprints it computes, still
// as the default fingerprint.
func countPrints(m *Middleware) *atomic.Int64 {
	var n atomic.Int64
	m.cfg.fingerprint = func(r *http.Request, body []byte) [32]byte {
		n.Add(1)
		return fingerprint.Default(r, body)
	}
	return &n
}

func rawPost(key, body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/orders?x=1", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	return r
}

func created(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusCreated)
	w.Write([]byte(`{"id":1}`))
}

// forgetful is a store that keeps no raw digest, as a store or a version
// that does not keep one.
type forgetful struct{ store.Store }

func (f forgetful) Complete(ctx context.Context, key, token string, rec *store.Record, retention time.Duration) error {
	c := *rec
	c.RawDigest = [32]byte{}
	return f.Store.Complete(ctx, key, token, &c, retention)
}

// TestByteIdenticalRepeatNeedsNoCanonicalForm: with the memory store (a
// store.LazyClaimer) a first run computes the canonical fingerprint once,
// to write its claim, and a repeat with the same bytes replays by the raw
// digest the record keeps, without computing it; a repeat with the JSON
// reordered computes it and replays, and a different request gets 422,
// whether the key is completed or in flight (SPEC step 8). A record kept
// without a raw digest is compared by the fingerprint alone.
func TestByteIdenticalRepeatNeedsNoCanonicalForm(t *testing.T) {
	for _, keepsRaw := range []bool{true, false} {
		mem, err := memory.New()
		if err != nil {
			t.Fatal(err)
		}
		defer mem.Close()
		var st store.Store = mem
		if !keepsRaw {
			st = forgetful{mem}
		}
		m, err := New(st)
		if err != nil {
			t.Fatal(err)
		}
		prints := countPrints(m)
		h := m.Required()(http.HandlerFunc(created))
		serve := func(r *http.Request) int {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w.Code
		}
		if c := serve(rawPost("k", `{"a":1,"b":2}`)); c != http.StatusCreated || prints.Load() != 1 {
			t.Fatalf("keeps raw %v: first run %d, %d fingerprints, want 201 and 1", keepsRaw, c, prints.Load())
		}
		prints.Store(0)
		if c := serve(rawPost("k", `{"a":1,"b":2}`)); c != http.StatusCreated {
			t.Fatalf("keeps raw %v: identical repeat %d", keepsRaw, c)
		}
		want := int64(0)
		if !keepsRaw {
			want = 1
		}
		if n := prints.Load(); n != want {
			t.Errorf("keeps raw %v: the identical repeat computed %d fingerprints, want %d", keepsRaw, n, want)
		}
		if c := serve(rawPost("k", `{"b":2, "a":1}`)); c != http.StatusCreated {
			t.Errorf("keeps raw %v: reordered repeat %d, want the replay", keepsRaw, c)
		}
		if c := serve(rawPost("k", `{"a":1,"b":3}`)); c != http.StatusUnprocessableEntity {
			t.Errorf("keeps raw %v: different request %d, want 422", keepsRaw, c)
		}
	}

	// In flight: the same request 409 (reordered or not), a different one 422.
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	m, err := New(mem)
	if err != nil {
		t.Fatal(err)
	}
	started, finish := make(chan struct{}), make(chan struct{})
	h := m.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-finish
		created(w, r)
	}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(httptest.NewRecorder(), rawPost("f", `{"a":1}`))
	}()
	<-started
	for body, want := range map[string]int{`{"a":1}`: http.StatusConflict, ` {"a" : 1}`: http.StatusConflict, `{"a":2}`: http.StatusUnprocessableEntity} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, rawPost("f", body))
		if w.Code != want {
			t.Errorf("in flight, %s: %d, want %d", body, w.Code, want)
		}
	}
	close(finish)
	<-done
}
