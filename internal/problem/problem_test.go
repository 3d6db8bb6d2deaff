package problem

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/idemkey/idemkey"
)

func TestWrite(t *testing.T) {
	p := New("conflict", http.StatusConflict, "Request in progress", "Retry later.")
	p.RetryAfter = 3
	w := httptest.NewRecorder()
	w.Header().Set("Retry-After", "99")
	Write(w, p, nil)
	if w.Code != http.StatusConflict || w.Header().Get("Content-Type") != "application/problem+json" ||
		w.Header().Get("Cache-Control") != "no-store" || w.Header().Get("Retry-After") != "3" ||
		w.Header().Get("Content-Length") != strconv.Itoa(w.Body.Len()) {
		t.Fatalf("response %d %v", w.Code, w.Header())
	}
	var got map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"type": idemkey.ProblemTypePrefix + "conflict", "title": "Request in progress", "status": float64(409), "detail": "Retry later.", "code": "conflict"}
	if !maps.Equal(got, want) {
		t.Fatalf("body %v, want %v", got, want)
	}
	// No Retry-After: none is sent, even one set before.
	p.RetryAfter = 0
	w = httptest.NewRecorder()
	w.Header().Set("Retry-After", "99")
	Write(w, p, p.Body())
	if _, ok := w.Header()["Retry-After"]; ok {
		t.Fatalf("Retry-After %q without one in the problem", w.Header().Get("Retry-After"))
	}
}
