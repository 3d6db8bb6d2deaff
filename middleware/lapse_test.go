package middleware_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

// fakeClock is a clock for the memory store that moves only when told to.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// A client that stops reading a large streamed response leaves the handler
// blocked in Write. The key must not run again, however long that lasts:
// here the store's clock moves past the claim's whole life while the
// handler is still blocked, and the retry gets the kept status and headers.
func TestStalledReaderNeverLetsTheKeyRunTwice(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	st, err := memory.New(memory.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	mw, err := middleware.New(st)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	blocked := make(chan struct{}, 1)
	chunk := []byte(strings.Repeat("x", 64<<10))
	h := mw.Required(middleware.Deadline(100 * time.Millisecond))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "text/csv")
		for range 256 { // 16 MiB
			if _, err := w.Write(chunk); err != nil {
				return
			}
			select {
			case blocked <- struct{}{}:
			default:
			}
		}
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	// Client A reads 1 KiB and stops.
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	// A goes away at the end (before the server closes): the handler's
	// writes fail and it returns.
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: export-1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 1<<10)); err != nil {
		t.Fatal(err)
	}
	<-blocked
	// The claim's life (deadline + margin) passes on the store's clock while
	// the handler is stuck writing to A.
	clock.Advance(time.Hour)

	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "export-1")
	req.Header.Set("Content-Type", "application/json")
	retry, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, retry.Body)
	retry.Body.Close()
	if runs.Load() != 1 {
		t.Fatalf("the handler ran %d times for one key", runs.Load())
	}
	if retry.StatusCode != http.StatusOK || retry.Header.Get(idemkey.HeaderReplayed) != "true" ||
		retry.Header.Get(idemkey.HeaderBodyOmitted) != "true" || retry.Header.Get("Content-Type") != "text/csv" || body != "" {
		t.Fatalf("retry: %d replayed %q omitted %q type %q body %d bytes", retry.StatusCode,
			retry.Header.Get(idemkey.HeaderReplayed), retry.Header.Get(idemkey.HeaderBodyOmitted), retry.Header.Get("Content-Type"), len(body))
	}
}

// A handler that runs past its claim's life (it ignores its context) keeps
// the key: the claim is extended while it runs, so a repeat gets 409, not a
// second run, and once it returns the repeat gets its answer.
func TestSlowHandlerKeepsItsKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, err := memory.New()
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		events := &eventLog{}
		mw, _ := middleware.New(st, middleware.WithObserver(events.observe))
		var runs atomic.Int32
		h := mw.Required(middleware.Deadline(time.Second))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			time.Sleep(30 * time.Second) // the claim lives 6 s
			w.WriteHeader(http.StatusCreated)
		}))
		done := make(chan *httptest.ResponseRecorder, 1)
		go func() { done <- serve(h, post("slow", `{}`)) }()

		time.Sleep(20 * time.Second)
		w := serve(h, post("slow", `{}`))
		if runs.Load() != 1 {
			t.Fatalf("the handler ran %d times for one key", runs.Load())
		}
		wantProblem(t, w, http.StatusConflict, idemkey.CodeConflict)

		if first := <-done; first.Code != http.StatusCreated {
			t.Fatalf("first: %d", first.Code)
		}
		if w := serve(h, post("slow", `{}`)); w.Header().Get(idemkey.HeaderReplayed) != "true" || runs.Load() != 1 {
			t.Fatalf("after: %d replayed %q, runs %d", w.Code, w.Header().Get(idemkey.HeaderReplayed), runs.Load())
		}
		if events.has(middleware.EventOwnershipLost) {
			t.Fatalf("ownership lost: %v", events.kinds())
		}
	})
}

// blockingWriter is a client that stops reading: its writes block until
// it is let go.
type blockingWriter struct {
	*httptest.ResponseRecorder
	wrote chan struct{}
	let   chan struct{}
	once  sync.Once
}

func (b *blockingWriter) Write(p []byte) (int, error) {
	b.once.Do(func() { close(b.wrote) })
	<-b.let
	return b.ResponseRecorder.Write(p)
}

// A streamed response whose status is not kept (a 5xx) holds the key until
// the handler returns, then releases it: never two runs at once.
func TestStreamedServerErrorHoldsTheKeyUntilTheHandlerReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, _ := memory.New()
		defer st.Close()
		mw, _ := middleware.New(st, middleware.WithMaxResponseBody(1024))
		var runs atomic.Int32
		h := mw.Required(middleware.Deadline(time.Second))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(http.StatusInternalServerError)
			w.Write(make([]byte, 4096))
		}))
		bw := &blockingWriter{ResponseRecorder: httptest.NewRecorder(), wrote: make(chan struct{}), let: make(chan struct{})}
		done := make(chan struct{})
		go func() {
			h.ServeHTTP(bw, post("k", `{}`))
			close(done)
		}()
		<-bw.wrote
		time.Sleep(time.Minute)
		wantProblem(t, serve(h, post("k", `{}`)), http.StatusConflict, idemkey.CodeConflict)
		close(bw.let)
		<-done
		if w := serve(h, post("k", `{}`)); w.Code != http.StatusInternalServerError || runs.Load() != 2 {
			t.Fatalf("after the release: %d, runs %d; want the handler to run again", w.Code, runs.Load())
		}
	})
}
