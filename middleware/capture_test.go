package middleware_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
)

// interfaces reports which optional interfaces w has.
func interfaces(w http.ResponseWriter) [3]bool {
	_, f := w.(http.Flusher)
	_, h := w.(http.Hijacker)
	_, r := w.(io.ReaderFrom)
	return [3]bool{f, h, r}
}

// servers yields a client and a URL for the same handler served three
// ways: through httptest.ResponseRecorder, a real HTTP/1 server and an
// HTTP/2 TLS server.
type serverKind struct {
	name  string
	start func(t *testing.T, h http.Handler) (*http.Client, string)
}

var serverKinds = []serverKind{
	{"http1", func(t *testing.T, h http.Handler) (*http.Client, string) {
		s := httptest.NewServer(h)
		t.Cleanup(s.Close)
		return s.Client(), s.URL
	}},
	{"http2", func(t *testing.T, h http.Handler) (*http.Client, string) {
		s := httptest.NewUnstartedServer(h)
		s.EnableHTTP2 = true
		s.StartTLS()
		t.Cleanup(s.Close)
		c := s.Client()
		return c, s.URL
	}},
}

func TestCaptureKeepsInterfacesOfEveryWriter(t *testing.T) {
	f := newFixture(t)
	var inner, outer [3]bool
	probe := func(w http.ResponseWriter, r *http.Request) {
		outer = interfaces(w)
		if u, ok := w.(interface{ Unwrap() http.ResponseWriter }); !ok || u.Unwrap() == nil {
			t.Error("no Unwrap")
		}
		w.WriteHeader(http.StatusCreated)
	}
	record := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inner = interfaces(w)
			next.ServeHTTP(w, r)
		})
	}
	h := record(f.mw.Required()(http.HandlerFunc(probe)))

	serve(h, post("rec", `{}`))
	if inner != outer || inner != [3]bool{true, false, false} {
		t.Errorf("recorder: inner %v, handler saw %v", inner, outer)
	}
	for _, k := range serverKinds {
		t.Run(k.name, func(t *testing.T) {
			client, url := k.start(t, h)
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{}`))
			req.Header.Set("Idempotency-Key", "iface-"+k.name)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if inner != outer {
				t.Errorf("inner %v, handler saw %v", inner, outer)
			}
			want := map[string][3]bool{"http1": {true, true, true}, "http2": {true, false, false}}[k.name]
			if inner != want {
				t.Errorf("inner writer %v, want %v (test assumption)", inner, want)
			}
		})
	}
}

// TestFlushStreams checks that a handler that flushes, through
// http.ResponseController and through http.Flusher, sends what it has
// written before it returns, and that its record (status and headers, the
// body omitted) is kept before the first byte goes out: a repeat sent while
// the stream is still open is a replay, never a second run and never 409.
func TestFlushStreams(t *testing.T) {
	for _, k := range serverKinds {
		for _, how := range []string{"controller", "flusher"} {
			t.Run(k.name+"/"+how, func(t *testing.T) {
				f := newFixture(t)
				proceed := make(chan struct{})
				var runs atomic.Int32
				h := f.mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					w.Header().Set("Content-Type", "text/event-stream")
					io.WriteString(w, "first\n")
					if how == "controller" {
						if err := http.NewResponseController(w).Flush(); err != nil {
							t.Errorf("flush: %v", err)
						}
					} else {
						w.(http.Flusher).Flush()
					}
					<-proceed
					io.WriteString(w, "second\n")
				}))
				client, url := k.start(t, h)
				do := func() *http.Response {
					req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{}`))
					req.Header.Set("Idempotency-Key", "stream")
					resp, err := client.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					return resp
				}
				resp := do()
				line, err := bufio.NewReader(resp.Body).ReadString('\n')
				if err != nil || line != "first\n" {
					t.Fatalf("read %q, %v before the handler returned", line, err)
				}
				// The stream is open and the handler still runs.
				again := do()
				body := readAll(t, again.Body)
				again.Body.Close()
				if again.StatusCode != http.StatusOK || again.Header.Get(idemkey.HeaderReplayed) != "true" ||
					again.Header.Get(idemkey.HeaderBodyOmitted) != "true" || again.Header.Get("Content-Type") != "text/event-stream" ||
					body != "" || runs.Load() != 1 {
					t.Fatalf("repeat during the stream: %d replayed %q omitted %q type %q body %q runs %d",
						again.StatusCode, again.Header.Get(idemkey.HeaderReplayed), again.Header.Get(idemkey.HeaderBodyOmitted),
						again.Header.Get("Content-Type"), body, runs.Load())
				}
				close(proceed)
				rest := readAll(t, resp.Body)
				resp.Body.Close()
				if rest != "second\n" {
					t.Fatalf("rest %q", rest)
				}
				if f.store.completes.Load() != 1 {
					t.Fatalf("%d Completes, want 1: the record is kept once, when the stream starts", f.store.completes.Load())
				}
			})
		}
	}
}

func TestRecorderFlushThroughController(t *testing.T) {
	f := newFixture(t)
	w := httptest.NewRecorder()
	var sawBeforeReturn string
	f.mw.Required()(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		io.WriteString(rw, "early")
		if err := http.NewResponseController(rw).Flush(); err != nil {
			t.Fatal(err)
		}
		sawBeforeReturn = w.Body.String()
	})).ServeHTTP(w, post("k", `{}`))
	if sawBeforeReturn != "early" || !w.Flushed {
		t.Fatalf("before return the client had %q (flushed %v)", sawBeforeReturn, w.Flushed)
	}
}

// TestHeldUntilKept shows that a response is not sent before it is kept:
// the client sees nothing while the handler still runs.
func TestHeldUntilKept(t *testing.T) {
	f := newFixture(t)
	w := httptest.NewRecorder()
	var during int
	f.mw.Required()(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.WriteHeader(http.StatusCreated)
		io.WriteString(rw, "body")
		during = w.Body.Len()
		if w.Code != http.StatusOK {
			t.Errorf("status %d sent before the handler returned", w.Code)
		}
	})).ServeHTTP(w, post("k", `{}`))
	if during != 0 || w.Code != http.StatusCreated || w.Body.String() != "body" {
		t.Fatalf("during %d, after %d %q", during, w.Code, w.Body)
	}
	if w.Header().Get("Content-Length") != "4" {
		t.Errorf("Content-Length %q", w.Header().Get("Content-Length"))
	}
}

func TestInformationalPassesThrough(t *testing.T) {
	f := newFixture(t)
	h := f.mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "done")
	}))
	s := httptest.NewServer(h)
	defer s.Close()
	var mu sync.Mutex
	var got []int
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
		mu.Lock()
		got = append(got, code)
		mu.Unlock()
		return nil
	}}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodPost, s.URL, strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "hints")
	resp, err := s.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp.Body)
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0] != http.StatusEarlyHints || resp.StatusCode != http.StatusCreated || body != "done" {
		t.Fatalf("1xx %v, final %d %q", got, resp.StatusCode, body)
	}
}

func TestReadFromAndWriteStringAreCaptured(t *testing.T) {
	f := newFixture(t)
	h := f.mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "a-")
		w.(io.ReaderFrom).ReadFrom(strings.NewReader("b-"))
		w.Write([]byte("c"))
	}))
	s := httptest.NewServer(h)
	defer s.Close()
	var bodies []string
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, s.URL, strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "rf")
		resp, err := s.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, readAll(t, resp.Body))
		resp.Body.Close()
	}
	if bodies[0] != "a-b-c" || bodies[1] != "a-b-c" {
		t.Fatalf("bodies %q", bodies)
	}
}

func TestHijackedConnectionIsNeverReplayed(t *testing.T) {
	f := newFixture(t)
	runs := 0
	h := f.mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
		buf.Flush()
		conn.Close()
	}))
	s := httptest.NewServer(h)
	defer s.Close()
	// The client has its answer before the handler returns and releases
	// the key, so wait for each release before the next request.
	released := func(n int64) {
		for i := 0; i < 500 && f.store.releases.Load() < n; i++ {
			time.Sleep(2 * time.Millisecond)
		}
	}
	for i := range int64(2) {
		req, _ := http.NewRequest(http.MethodPost, s.URL, strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "hj")
		resp, err := s.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if b := readAll(t, resp.Body); b != "hi" || resp.Header.Get(idemkey.HeaderReplayed) != "" {
			t.Fatalf("body %q replayed %q", b, resp.Header.Get(idemkey.HeaderReplayed))
		}
		resp.Body.Close()
		released(i + 1)
	}
	if runs != 2 || f.store.releases.Load() != 2 {
		t.Fatalf("runs %d releases %d", runs, f.store.releases.Load())
	}
}

// TestRetryTheMomentTheReplyArrives sends the repeat as soon as the first
// response's headers reach the client: it must always find the record.
func TestRetryTheMomentTheReplyArrives(t *testing.T) {
	f := newFixture(t)
	h := &counter{}
	s := httptest.NewServer(f.mw.Required()(h))
	defer s.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	for i := range 50 {
		key := "race-" + itoa(int64(i))
		var statuses []int
		var replayed string
		for range 2 {
			req, _ := http.NewRequest(http.MethodPost, s.URL, strings.NewReader(`{}`))
			req.Header.Set("Idempotency-Key", key)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			statuses = append(statuses, resp.StatusCode)
			replayed = resp.Header.Get(idemkey.HeaderReplayed)
			resp.Body.Close()
		}
		if statuses[0] != http.StatusCreated || statuses[1] != http.StatusCreated || replayed != "true" {
			t.Fatalf("key %s: statuses %v, second replayed %q", key, statuses, replayed)
		}
	}
	if h.runs.Load() != 50 {
		t.Fatalf("runs %d", h.runs.Load())
	}
}

// onlyWriter is a ResponseWriter with none of the optional interfaces.
type onlyWriter struct{ w http.ResponseWriter }

func (o onlyWriter) Header() http.Header         { return o.w.Header() }
func (o onlyWriter) Write(p []byte) (int, error) { return o.w.Write(p) }
func (o onlyWriter) WriteHeader(code int)        { o.w.WriteHeader(code) }

// TestFlushThatCannotFlushHoldsTheResponse shows that a flush the wrapped
// writer does not support fails without sending anything: the response is
// still held until it is kept.
func TestFlushThatCannotFlushHoldsTheResponse(t *testing.T) {
	f := newFixture(t)
	rec := httptest.NewRecorder()
	var flushErr error
	var sent string
	var code int
	f.mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "early")
		flushErr = http.NewResponseController(w).Flush()
		sent, code = rec.Body.String(), rec.Code
		io.WriteString(w, " late")
	})).ServeHTTP(onlyWriter{rec}, post("k", `{}`))
	if !errors.Is(flushErr, http.ErrNotSupported) {
		t.Fatalf("flush: %v, want ErrNotSupported", flushErr)
	}
	if sent != "" || code != http.StatusOK {
		t.Fatalf("sent %d %q before the handler returned", code, sent)
	}
	if rec.Code != http.StatusCreated || rec.Body.String() != "early late" || rec.Header().Get("Content-Length") != "10" {
		t.Fatalf("after: %d %q Content-Length %q", rec.Code, rec.Body, rec.Header().Get("Content-Length"))
	}
}

// unwrapOnly is a ResponseWriter wrapper, as other middleware makes them,
// that has Unwrap but none of the optional interfaces.
type unwrapOnly struct{ onlyWriter }

func (u unwrapOnly) Unwrap() http.ResponseWriter { return u.w }

// TestHijackThroughAWrapperIsNeverReplayed shows that a connection hijacked
// through http.ResponseController, when the writer the middleware wraps
// only reaches a Hijacker by Unwrap, is seen as hijacked: the key is
// released and nothing is kept or replayed for it.
func TestHijackThroughAWrapperIsNeverReplayed(t *testing.T) {
	f := newFixture(t)
	var runs atomic.Int64
	inner := f.mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
		buf.Flush()
		conn.Close()
	}))
	done := make(chan struct{}, 2)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { done <- struct{}{} }()
		inner.ServeHTTP(unwrapOnly{onlyWriter{w}}, r)
	}))
	defer s.Close()
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, s.URL, strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "hj-wrapped")
		resp, err := s.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if b := readAll(t, resp.Body); b != "hi" || resp.Header.Get(idemkey.HeaderReplayed) != "" {
			t.Fatalf("body %q replayed %q", b, resp.Header.Get(idemkey.HeaderReplayed))
		}
		resp.Body.Close()
		<-done // the middleware has finished with the key
	}
	if runs.Load() != 2 || f.store.completes.Load() != 0 || f.store.releases.Load() != 2 {
		t.Fatalf("runs %d completes %d releases %d", runs.Load(), f.store.completes.Load(), f.store.releases.Load())
	}
}
