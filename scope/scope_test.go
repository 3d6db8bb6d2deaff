package scope_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemkey/idemkey/scope"
)

// No id is mapped to the anonymous namespace, and no two ids share one.
func TestOfKeepsKindsApart(t *testing.T) {
	ids := []string{"alice", "anonymous", "Anonymous", "\x00anonymous", "\x00\x00anonymous", "\x00", "", "x\x00"}
	seen := map[string]string{}
	for _, id := range ids {
		s := scope.Of(id)
		if s == scope.Anonymous {
			t.Errorf("Of(%q) is the anonymous scope", id)
		}
		if prev, ok := seen[s]; ok {
			t.Errorf("Of(%q) = Of(%q) = %q", id, prev, s)
		}
		seen[s] = id
	}
	if got := scope.Of("alice"); got != "alice" {
		t.Errorf("Of(alice) = %q: an ordinary id must map to itself, so existing records keep their names", got)
	}
}

func FuzzOf(f *testing.F) {
	f.Add("anonymous", "\x00anonymous")
	f.Add("a", "\x00a")
	f.Fuzz(func(t *testing.T, a, b string) {
		if scope.Of(a) == scope.Anonymous {
			t.Fatalf("Of(%q) is the anonymous scope", a)
		}
		if a != b && scope.Of(a) == scope.Of(b) {
			t.Fatalf("Of(%q) = Of(%q)", a, b)
		}
	})
}

func TestPrincipal(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	if got := scope.Principal(r); got != scope.Anonymous {
		t.Errorf("not signed in: %q, want %q", got, scope.Anonymous)
	}
	for _, id := range []string{"alice", "anonymous"} {
		got := scope.Principal(r.WithContext(scope.NewContext(r.Context(), id)))
		if got != scope.Of(id) {
			t.Errorf("signed in as %q: %q, want %q", id, got, scope.Of(id))
		}
	}
	type key struct{}
	f := scope.FromContextValue(key{})
	if got := f(r.WithContext(context.WithValue(r.Context(), key{}, "anonymous"))); got == scope.Anonymous {
		t.Errorf("FromContextValue: a caller named anonymous got the anonymous scope")
	}
	if got := f(r); got != scope.Anonymous {
		t.Errorf("FromContextValue without a value: %q, want %q", got, scope.Anonymous)
	}
}

// An authentication middleware puts the verified caller into the context;
// the default scope function reads it.
func Example() {
	authenticate := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if user := r.Header.Get("X-Verified-User"); user != "" { // set by a trusted gateway
				r = r.WithContext(scope.NewContext(r.Context(), user))
			}
			next.ServeHTTP(w, r)
		})
	}
	show := authenticate(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Printf("%q\n", scope.Principal(r))
	}))

	r := httptest.NewRequest(http.MethodPost, "/payments", nil)
	show.ServeHTTP(httptest.NewRecorder(), r)
	r.Header.Set("X-Verified-User", "alice")
	show.ServeHTTP(httptest.NewRecorder(), r)
	r.Header.Set("X-Verified-User", "anonymous")
	show.ServeHTTP(httptest.NewRecorder(), r)
	// Output:
	// "anonymous"
	// "alice"
	// "\x00anonymous"
}
