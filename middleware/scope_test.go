package middleware

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/scope"
	"github.com/idemkey/idemkey/store/memory"
)

// TestEmptyScopeIsAnError: a scope function that returns "" (for a
// signed-in caller it does not recognise, say) used to put the request in
// the anonymous namespace, where it shares keys with every anonymous
// caller. It is now refused with 500 scope_missing and reported.
func TestEmptyScopeIsAnError(t *testing.T) {
	st, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var events []Event
	m, err := New(st, WithScope(func(r *http.Request) string {
		if p, ok := scope.FromContext(r.Context()); ok && p == "bob" {
			return "" // a caller the function does not know
		}
		return scope.Principal(r)
	}), WithObserver(func(_ *http.Request, e Event) { events = append(events, e) }))
	if err != nil {
		t.Fatal(err)
	}
	req := func(user string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("{}"))
		if user != "" {
			r = r.WithContext(scope.NewContext(r.Context(), user))
		}
		return r
	}

	w := httptest.NewRecorder()
	sc, ok := m.scopeOf(w, req("bob"))
	if ok || sc != "" {
		t.Fatalf("scope %q, %v for an empty scope; want none", sc, ok)
	}
	var p idemkey.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != http.StatusInternalServerError || p.Code != idemkey.CodeScopeMissing {
		t.Errorf("answer %d %s, want 500 %s", w.Code, w.Body, idemkey.CodeScopeMissing)
	}
	if len(events) != 1 || events[0].Kind != EventScopeMissing || events[0].Status != http.StatusInternalServerError {
		t.Errorf("events %+v, want one %v with status 500", events, EventScopeMissing)
	}
	if EventScopeMissing.String() != "scope_missing" {
		t.Errorf("event name %q", EventScopeMissing.String())
	}

	// Other callers keep their scopes and get no answer from scopeOf.
	for user, want := range map[string]string{"alice": "alice", "": scope.Anonymous, "anonymous": "\x00anonymous"} {
		w := httptest.NewRecorder()
		if sc, ok := m.scopeOf(w, req(user)); !ok || sc != want || w.Body.Len() != 0 {
			t.Errorf("user %q: scope %q, %v, wrote %q; want %q", user, sc, ok, w.Body, want)
		}
	}
}
