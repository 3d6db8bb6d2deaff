package middleware_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestTrailersReachTheClient shows that trailers a handler declares are
// sent as net/http sends them: a held response is not given a
// Content-Length that would leave no room for them.
func TestTrailersReachTheClient(t *testing.T) {
	for _, k := range serverKinds {
		t.Run(k.name, func(t *testing.T) {
			f := newFixture(t)
			h := f.mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Trailer", "X-Sum")
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "body")
				w.Header().Set("X-Sum", "abc")
			}))
			client, url := k.start(t, h)
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{}`))
			req.Header.Set("Idempotency-Key", "trailers")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated || body != "body" || resp.Trailer.Get("X-Sum") != "abc" {
				t.Fatalf("%d %q trailer %q", resp.StatusCode, body, resp.Trailer.Get("X-Sum"))
			}
		})
	}
}

// TestStreamedTrailerKeepsItsLastValue shows that a trailer set while the
// response was held and set again after a flush goes out with the value
// set last.
func TestStreamedTrailerKeepsItsLastValue(t *testing.T) {
	for _, k := range serverKinds {
		t.Run(k.name, func(t *testing.T) {
			f := newFixture(t)
			h := f.mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Trailer", "X-Sum")
				w.WriteHeader(http.StatusOK)
				w.Header().Set("X-Sum", "early")
				io.WriteString(w, "first\n")
				w.(http.Flusher).Flush()
				io.WriteString(w, "second\n")
				w.Header().Set("X-Sum", "final")
			}))
			client, url := k.start(t, h)
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{}`))
			req.Header.Set("Idempotency-Key", "stream-trailer")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if body != "first\nsecond\n" || resp.Trailer.Get("X-Sum") != "final" {
				t.Fatalf("%q trailer %q", body, resp.Trailer.Get("X-Sum"))
			}
		})
	}
}
