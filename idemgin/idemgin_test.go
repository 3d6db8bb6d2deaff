package idemgin_test

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/idemgin"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

func init() { gin.SetMode(gin.TestMode) }

// newMiddleware is idemkey over a fresh memory store.
func newMiddleware(t *testing.T, opts ...middleware.Option) *middleware.Middleware {
	t.Helper()
	st, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	mw, err := middleware.New(st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

type answer struct {
	status int
	header http.Header
	body   string
}

// post sends a POST with key (none when "") and body to h.
func post(t *testing.T, h http.Handler, path, key, body string) answer {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return answer{w.Code, w.Header(), w.Body.String()}
}

func replayed(a answer) bool { return a.header.Get("Idempotent-Replayed") == "true" }

// The handlers after idemgin.Handler run once per key; a retry gets the
// first answer, status, headers and body, and a reused key 422; when the
// middleware answers by itself, the rest of the chain does not run, and
// the middleware before it sees the status that went out.
func TestRunsOnceAndReplays(t *testing.T) {
	mw := newMiddleware(t)
	var runs, after atomic.Int32
	var seen []int
	r := gin.New()
	r.Use(func(c *gin.Context) {
		c.Next()
		seen = append(seen, c.Writer.Status())
	})
	r.POST("/payments", idemgin.Handler(mw.Required()), func(c *gin.Context) {
		n := runs.Add(1)
		c.Header("Location", "/payments/1")
		c.JSON(http.StatusCreated, gin.H{"id": n})
	}, func(*gin.Context) { after.Add(1) })

	first := post(t, r, "/payments", "k-1", `{"amount":10}`)
	if first.status != http.StatusCreated || first.body != `{"id":1}` || replayed(first) {
		t.Fatalf("first: %d %q replayed=%v, want 201 {\"id\":1}", first.status, first.body, replayed(first))
	}
	again := post(t, r, "/payments", "k-1", `{ "amount": 10 }`)
	if again.status != http.StatusCreated || again.body != first.body || !replayed(again) {
		t.Errorf("retry: %d %q replayed=%v, want the first answer replayed", again.status, again.body, replayed(again))
	}
	if got := again.header.Get("Location"); got != "/payments/1" {
		t.Errorf("retry Location %q, want the kept /payments/1", got)
	}
	if got := again.header.Get("Content-Type"); got != first.header.Get("Content-Type") {
		t.Errorf("retry Content-Type %q, want %q", got, first.header.Get("Content-Type"))
	}
	reused := post(t, r, "/payments", "k-1", `{"amount":99}`)
	if reused.status != http.StatusUnprocessableEntity {
		t.Errorf("reused key: %d %s, want 422", reused.status, reused.body)
	}
	missing := post(t, r, "/payments", "", `{"amount":10}`)
	if missing.status != http.StatusBadRequest {
		t.Errorf("no key: %d %s, want 400", missing.status, missing.body)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	if n := after.Load(); n != 1 {
		t.Errorf("the handler after it ran %d times, want 1 (the chain is aborted when the middleware answers)", n)
	}
	want := []int{201, 201, 422, 400}
	if len(seen) != len(want) {
		t.Fatalf("the outer middleware saw %v, want %v", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Errorf("the outer middleware saw %v, want %v", seen, want)
			break
		}
	}
}

// gin sends the status with the first byte of the body, so a header set
// after c.Status is still part of the response, and of what is kept; a
// handler that only sets a status, or writes nothing, answers it (200).
func TestGinStatusRules(t *testing.T) {
	mw := newMiddleware(t)
	r := gin.New()
	r.POST("/late-header", idemgin.Handler(mw.Required()), func(c *gin.Context) {
		c.Status(http.StatusAccepted)
		c.Header("X-Late", "yes")
		if c.Writer.Written() || c.Writer.Size() != -1 || c.Writer.Status() != http.StatusAccepted {
			t.Errorf("before the body: Written %v Size %d Status %d, want false -1 202", c.Writer.Written(), c.Writer.Size(), c.Writer.Status())
		}
		if _, err := c.Writer.WriteString("queued"); err != nil {
			t.Error(err)
		}
		c.Status(http.StatusTeapot) // too late: gin ignores it
		if c.Writer.Size() != len("queued") {
			t.Errorf("Size %d after the body, want %d", c.Writer.Size(), len("queued"))
		}
	})
	r.POST("/status-only", idemgin.Handler(mw.Required()), func(c *gin.Context) {
		c.Status(http.StatusNoContent)
	})
	r.POST("/nothing", idemgin.Handler(mw.Required()), func(*gin.Context) {})

	for _, tc := range []struct {
		path, body string
		status     int
		header     string
	}{
		{"/late-header", "queued", http.StatusAccepted, "yes"},
		{"/status-only", "", http.StatusNoContent, ""},
		{"/nothing", "", http.StatusOK, ""},
	} {
		for i, wantReplay := range []bool{false, true} {
			a := post(t, r, tc.path, "k"+tc.path, `{}`)
			if a.status != tc.status || a.body != tc.body || a.header.Get("X-Late") != tc.header || replayed(a) != wantReplay {
				t.Errorf("%s, request %d: %d %q X-Late=%q replayed=%v; want %d %q X-Late=%q replayed=%v",
					tc.path, i+1, a.status, a.body, a.header.Get("X-Late"), replayed(a), tc.status, tc.body, tc.header, wantReplay)
			}
		}
	}
}

// Events name the route by gin's route template.
func TestEventsNameTheRoute(t *testing.T) {
	st, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var routes []string
	mw, err := middleware.New(st, middleware.WithObserver(func(_ *http.Request, e middleware.Event) {
		routes = append(routes, e.Route)
	}))
	if err != nil {
		t.Fatal(err)
	}
	r := gin.New()
	r.POST("/accounts/:id/payments", idemgin.Handler(mw.Required()), func(c *gin.Context) {
		c.String(http.StatusCreated, "ok")
	})
	post(t, r, "/accounts/42/payments", "k-route", `{}`)
	if len(routes) == 0 {
		t.Fatal("no events")
	}
	for _, got := range routes {
		if got != "/accounts/:id/payments" {
			t.Errorf("event route %q, want /accounts/:id/payments", got)
		}
	}
}

// What the middleware puts into the request's context (the key, and on a
// transactional store the request's transaction) reaches the gin handler
// through c.Request, and through c itself with ContextWithFallback.
func TestRequestContextReachesHandler(t *testing.T) {
	mw := newMiddleware(t)
	r := gin.New()
	r.ContextWithFallback = true
	r.POST("/payments", idemgin.Handler(mw.Required()), func(c *gin.Context) {
		k, ok := idemkey.FromContext(c.Request.Context())
		if !ok || k.Value != "k-ctx" {
			t.Errorf("c.Request's context: key %+v %v, want k-ctx", k, ok)
		}
		if k2, ok := idemkey.FromContext(c); !ok || k2 != k {
			t.Errorf("c with ContextWithFallback: key %+v %v, want %+v", k2, ok, k)
		}
		c.String(http.StatusCreated, "ok")
	})
	if a := post(t, r, "/payments", "k-ctx", `{}`); a.status != http.StatusCreated {
		t.Fatalf("%d %s, want 201", a.status, a.body)
	}
}

// A 5xx, an abort with a 5xx and a panic release the key: the retry runs
// the handler again. gin's Recovery before idemgin.Handler answers the
// panic.
func TestFailuresRelease(t *testing.T) {
	mw := newMiddleware(t)
	var runs atomic.Int32
	r := gin.New()
	r.Use(gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, _ any) {
		c.AbortWithStatus(http.StatusInternalServerError)
	}))
	r.POST("/flaky", idemgin.Handler(mw.Required()), func(c *gin.Context) {
		switch runs.Add(1) {
		case 1:
			c.String(http.StatusServiceUnavailable, "later")
		case 2:
			c.AbortWithStatus(http.StatusBadGateway)
		case 3:
			panic("boom")
		default:
			c.String(http.StatusCreated, "made")
		}
	})
	for i, want := range []int{503, 502, 500, 201, 201} {
		a := post(t, r, "/flaky", "k-flaky", `{}`)
		if a.status != want {
			t.Errorf("request %d: %d %q, want %d", i+1, a.status, a.body, want)
		}
	}
	if n := runs.Load(); n != 4 {
		t.Errorf("handler ran %d times, want 4 (three failures released, then one success replayed)", n)
	}
}

// A flush starts a stream, which is kept when it starts; the replay has
// the status and headers and says the body was omitted.
func TestStream(t *testing.T) {
	mw := newMiddleware(t)
	r := gin.New()
	r.POST("/stream", idemgin.Handler(mw.Required()), func(c *gin.Context) {
		c.Header("Content-Type", "text/event-stream")
		c.Status(http.StatusOK)
		c.Writer.WriteString("data: 1\n\n")
		c.Writer.Flush()
		c.Writer.WriteString("data: 2\n\n")
	})
	srv := httptest.NewServer(r)
	defer srv.Close()
	send := func() (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/stream", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "k-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := send()
	if resp.StatusCode != http.StatusOK || body != "data: 1\n\ndata: 2\n\n" {
		t.Errorf("first: %d %q, want the whole stream", resp.StatusCode, body)
	}
	resp, body = send()
	if resp.StatusCode != http.StatusOK || body != "" || resp.Header.Get("Idempotent-Body-Omitted") != "true" || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Errorf("replay: %d %q %v, want 200, no body, Idempotent-Body-Omitted and the kept Content-Type", resp.StatusCode, body, resp.Header)
	}
}

// A handler can hijack the connection before it wrote a body byte (a
// hijacked connection is never kept: the retry runs again), not after.
func TestHijack(t *testing.T) {
	// The client reads the hijacked answer before the handler returns and
	// the key is released: the next request waits for the release.
	released := make(chan struct{}, 4)
	mw := newMiddleware(t, middleware.WithObserver(func(_ *http.Request, e middleware.Event) {
		if e.Kind == middleware.EventReleased {
			released <- struct{}{}
		}
	}))
	var runs atomic.Int32
	r := gin.New()
	r.POST("/upgrade", idemgin.Handler(mw.Required()), func(c *gin.Context) {
		runs.Add(1)
		conn, buf, err := c.Writer.Hijack()
		if err != nil {
			t.Errorf("Hijack: %v", err)
			return
		}
		defer conn.Close()
		buf.WriteString("HTTP/1.1 418 I'm a teapot\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		buf.Flush()
	})
	r.POST("/late", idemgin.Handler(mw.Required()), func(c *gin.Context) {
		c.String(http.StatusOK, "body")
		if _, _, err := c.Writer.Hijack(); err == nil {
			t.Error("Hijack after the body began: no error")
		}
	})
	srv := httptest.NewServer(r)
	defer srv.Close()
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/upgrade", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "k-hijack")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusTeapot {
			t.Errorf("hijacked: %d, want the handler's own 418", resp.StatusCode)
		}
		select {
		case <-released:
		case <-time.After(10 * time.Second):
			t.Fatal("the hijacked request's key was never released")
		}
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("hijacking handler ran %d times, want 2: a hijacked connection is not replayed", n)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/late", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "k-late")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(bufio.NewReader(resp.Body))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "body" {
		t.Errorf("late hijack: %d %q, want 200 body", resp.StatusCode, b)
	}
}

// http.ResponseController works through gin's writer and idemgin's.
func TestResponseController(t *testing.T) {
	mw := newMiddleware(t)
	r := gin.New()
	r.POST("/rc", idemgin.Handler(mw.Required()), func(c *gin.Context) {
		c.Status(http.StatusOK)
		c.Writer.WriteHeaderNow()
		if err := http.NewResponseController(c.Writer).Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			t.Errorf("Flush: %v", err)
		}
	})
	srv := httptest.NewServer(r)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/rc", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "k-rc")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("%d, want 200", resp.StatusCode)
	}
}

func TestNilRoutePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Handler(nil) did not panic")
		}
	}()
	idemgin.Handler(nil)
}
