package middleware_test

import (
	"bytes"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idemkey/idemkey/internal/benchbody"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

// payload1K is the benchmarks' shared 1 KiB JSON request body.
var payload1K = benchbody.JSON(false)

var okBody = []byte(`{"id":"pay_123","status":"created"}`)

func okHandler(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(okBody)
}

// discard is a ResponseWriter that keeps nothing, so the benchmark measures
// the middleware, not the recorder.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}

// benchRequest builds a request the way a server hands it over: parsed,
// with a body to read.
func benchRequest(key string) *http.Request {
	return &http.Request{
		Method:        http.MethodPost,
		URL:           &url.URL{Path: "/payments", RawQuery: "x=1"},
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {key}},
		Body:          io.NopCloser(bytes.NewReader(payload1K)),
		ContentLength: int64(len(payload1K)),
		Host:          "example.com",
	}
}

// benchStore is a memory store large enough that a benchmark of fresh keys
// never fills it (a full store answers 503, a different path).
func benchStore(b *testing.B) *memory.Store {
	st, err := memory.New(memory.WithMaxRecords(50_000_000), memory.WithMaxBytes(32<<30))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	return st
}

func benchMiddleware(b *testing.B) http.Handler {
	mw, err := middleware.New(benchStore(b))
	if err != nil {
		b.Fatal(err)
	}
	return mw.Required()(http.HandlerFunc(okHandler))
}

// BenchmarkBare is the baseline: the handler alone, with the same request
// and writer set-up as the other benchmarks (each builds a fresh request and
// writer per iteration, inside the timed loop, so the difference between
// two benchmarks is the middleware's cost).
func BenchmarkBare(b *testing.B) {
	h := http.HandlerFunc(okHandler)
	b.ReportAllocs()
	b.SetBytes(int64(len(payload1K)))
	i := 0
	for b.Loop() {
		i++
		r, w := benchRequest("first-"+strconv.Itoa(i)), &discard{h: http.Header{}}
		h.ServeHTTP(w, r)
	}
}

func BenchmarkFirstRun(b *testing.B) {
	h := benchMiddleware(b)
	b.ReportAllocs()
	b.SetBytes(int64(len(payload1K)))
	i := 0
	for b.Loop() {
		i++
		r, w := benchRequest("first-"+strconv.Itoa(i)), &discard{h: http.Header{}}
		h.ServeHTTP(w, r)
	}
}

func BenchmarkReplay(b *testing.B) {
	h := benchMiddleware(b)
	h.ServeHTTP(&discard{h: http.Header{}}, benchRequest("replay"))
	b.ReportAllocs()
	b.SetBytes(int64(len(payload1K)))
	for b.Loop() {
		r, w := benchRequest("replay"), &discard{h: http.Header{}}
		h.ServeHTTP(w, r)
	}
}

func BenchmarkConflict(b *testing.B) {
	mw, _ := middleware.New(benchStore(b))
	block := make(chan struct{})
	started := make(chan struct{})
	h := mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-block
	}))
	go h.ServeHTTP(&discard{h: http.Header{}}, benchRequest("busy"))
	<-started
	defer close(block)
	b.ReportAllocs()
	for b.Loop() {
		r, w := benchRequest("busy"), &discard{h: http.Header{}}
		h.ServeHTTP(w, r)
	}
}

func BenchmarkReused(b *testing.B) {
	h := benchMiddleware(b)
	h.ServeHTTP(&discard{h: http.Header{}}, benchRequest("reused"))
	b.ReportAllocs()
	for b.Loop() {
		r, w := benchRequest("reused"), &discard{h: http.Header{}}
		r.URL.RawQuery = "x=2"
		h.ServeHTTP(w, r)
	}
}

// BenchmarkParallel runs many callers at once, on fresh keys and on one hot
// key that is replayed.
func BenchmarkParallel(b *testing.B) {
	b.Run("fresh-keys", func(b *testing.B) {
		h := benchMiddleware(b)
		var n atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				h.ServeHTTP(&discard{h: http.Header{}}, benchRequest("p-"+strconv.FormatInt(n.Add(1), 10)))
			}
		})
	})
	b.Run("hot-key", func(b *testing.B) {
		h := benchMiddleware(b)
		h.ServeHTTP(&discard{h: http.Header{}}, benchRequest("hot"))
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				h.ServeHTTP(&discard{h: http.Header{}}, benchRequest("hot"))
			}
		})
	})
}
