package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"slices"
	"sync"
	"testing"
)

// hinting is an upstream that sends 103 Early Hints naming itself, then
// answers 201, or (fail) drops the connection without an answer.
func hinting(t *testing.T, name string, fail bool) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</"+name+".css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		if fail {
			panic(http.ErrAbortHandler)
		}
		w.Header().Del("Link")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(name))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// hintsSeen sends req and returns the Link of every 1xx the client got,
// and the final answer.
func hintsSeen(t *testing.T, req *http.Request) ([]string, answer) {
	t.Helper()
	var mu sync.Mutex
	var links []string
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		mu.Lock()
		links = append(links, h.Get("Link"))
		mu.Unlock()
		return nil
	}}
	resp, err := http.DefaultClient.Do(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
	if err != nil {
		t.Fatal(err)
	}
	a := read(t, resp)
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(links), a
}

// TestEarlyHintsOfAFailedUpstreamAreNotForwarded: a keyed request goes to
// a, which sends 103 Early Hints and drops the connection, then to b,
// which answers. The client used to get a's hints before b's answer; it
// gets b's only.
func TestEarlyHintsOfAFailedUpstreamAreNotForwarded(t *testing.T) {
	a, b := hinting(t, "a", true), hinting(t, "b", false)
	g, _ := newGateway(t, []string{a.URL, b.URL})
	srv := front(t, g)

	links, ans := hintsSeen(t, postReq(t, context.Background(), srv.URL+"/payments", "k1", `{}`))
	if ans.Status != http.StatusCreated || ans.Body != "b" {
		t.Fatalf("got %d %q, want b's 201", ans.Status, ans.Body)
	}
	if want := []string{"</b.css>; rel=preload"}; !slices.Equal(links, want) {
		t.Errorf("the client got the hints %q, want %q: those of the upstream that answered", links, want)
	}

	// An attempt with no other after it (the only upstream) passes its
	// hints straight through, as they come.
	g, _ = newGateway(t, []string{a.URL})
	links, ans = hintsSeen(t, postReq(t, context.Background(), front(t, g).URL+"/payments", "k2", `{}`))
	if want := []string{"</a.css>; rel=preload"}; ans.Status < 500 || !slices.Equal(links, want) {
		t.Errorf("only a: %d with hints %q, want a 5xx with %q", ans.Status, links, want)
	}
}
