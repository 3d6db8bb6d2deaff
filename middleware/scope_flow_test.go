package middleware_test

import (
	"net/http"
	"testing"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/scope"
	"github.com/idemkey/idemkey/store/memory"
)

// TestEmptyScopeIsRefused: a scope function that names no scope ("") for
// a signed-in caller is refused with 500 scope_missing: the caller never
// lands in the anonymous namespace, where another's kept answer would be
// replayed to it.
func TestEmptyScopeIsRefused(t *testing.T) {
	st, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var kinds []middleware.EventKind
	mw, err := middleware.New(st, middleware.WithScope(func(r *http.Request) string {
		if p, ok := scope.FromContext(r.Context()); ok && p == "bob" {
			return ""
		}
		return scope.Principal(r)
	}), middleware.WithObserver(func(_ *http.Request, e middleware.Event) { kinds = append(kinds, e.Kind) }))
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	h := mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs++; w.WriteHeader(201) }))
	if w := serve(h, post("k", `{}`)); w.Code != 201 {
		t.Fatalf("anonymous: %d", w.Code)
	}
	bob := post("k", `{}`)
	bob = bob.WithContext(scope.NewContext(bob.Context(), "bob"))
	w := serve(h, bob)
	if w.Code != http.StatusInternalServerError || runs != 1 || w.Header().Get("Idempotent-Replayed") != "" {
		t.Errorf("bob with an empty scope: %d replayed %q, %d runs; want 500 and no replay of the anonymous k", w.Code, w.Header().Get("Idempotent-Replayed"), runs)
	}
	if len(kinds) == 0 || kinds[len(kinds)-1] != middleware.EventScopeMissing {
		t.Errorf("events %v", kinds)
	}
}
