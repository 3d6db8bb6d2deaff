package idemecho_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	echomw "github.com/labstack/echo/v4/middleware"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/idemecho"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

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

// The handler after idemecho.Middleware runs once per key; a retry gets
// the first answer, status, headers and body, and a reused key 422; when
// the middleware answers by itself the handler does not run, and the
// middleware before it sees the status that went out and no error.
func TestRunsOnceAndReplays(t *testing.T) {
	mw := newMiddleware(t)
	var runs, inner atomic.Int32
	var seen []int
	var errs []error
	e := echo.New()
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			err := next(c)
			seen = append(seen, c.Response().Status)
			errs = append(errs, err)
			return err
		}
	})
	e.POST("/payments", func(c echo.Context) error {
		n := runs.Add(1)
		c.Response().Header().Set("Location", "/payments/1")
		return c.JSON(http.StatusCreated, map[string]int32{"id": n})
	}, idemecho.Middleware(mw.Required()), func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error { inner.Add(1); return next(c) }
	})

	first := post(t, e, "/payments", "k-1", `{"amount":10}`)
	if first.status != http.StatusCreated || first.body != "{\"id\":1}\n" || replayed(first) {
		t.Fatalf("first: %d %q replayed=%v, want 201 {\"id\":1}", first.status, first.body, replayed(first))
	}
	again := post(t, e, "/payments", "k-1", `{ "amount": 10 }`)
	if again.status != http.StatusCreated || again.body != first.body || !replayed(again) {
		t.Errorf("retry: %d %q replayed=%v, want the first answer replayed", again.status, again.body, replayed(again))
	}
	if got := again.header.Get("Location"); got != "/payments/1" {
		t.Errorf("retry Location %q, want the kept /payments/1", got)
	}
	if got := again.header.Get("Content-Type"); got != first.header.Get("Content-Type") {
		t.Errorf("retry Content-Type %q, want %q", got, first.header.Get("Content-Type"))
	}
	if reused := post(t, e, "/payments", "k-1", `{"amount":99}`); reused.status != http.StatusUnprocessableEntity {
		t.Errorf("reused key: %d %s, want 422", reused.status, reused.body)
	}
	if missing := post(t, e, "/payments", "", `{"amount":10}`); missing.status != http.StatusBadRequest {
		t.Errorf("no key: %d %s, want 400", missing.status, missing.body)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	if n := inner.Load(); n != 1 {
		t.Errorf("the middleware after it ran %d times, want 1", n)
	}
	want := []int{201, 201, 422, 400}
	if len(seen) != len(want) {
		t.Fatalf("the outer middleware saw %v, want %v", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] || errs[i] != nil {
			t.Errorf("the outer middleware saw %v and errors %v, want %v and none", seen, errs, want)
			break
		}
	}
}

// A handler's returned error is answered inside the idempotency layer by
// the server's error handler, the server's own when it set one: the client
// gets that answer, and it is what is kept (a 4xx, replayed with its body)
// or released (a 5xx, a plain error's 500: the retry runs again). Through
// echo.WrapMiddleware alone the client got the 400 while an empty 200 was
// kept and replayed.
func TestReturnedErrors(t *testing.T) {
	for _, custom := range []bool{false, true} {
		mw := newMiddleware(t)
		var runs atomic.Int32
		e := echo.New()
		if custom {
			e.HTTPErrorHandler = func(err error, c echo.Context) {
				code := http.StatusInternalServerError
				var he *echo.HTTPError
				if errors.As(err, &he) {
					code = he.Code
				}
				c.String(code, "custom: "+http.StatusText(code))
			}
		}
		e.POST("/orders", func(c echo.Context) error {
			switch runs.Add(1) {
			case 1:
				return echo.NewHTTPError(http.StatusServiceUnavailable, "later")
			case 2:
				return errors.New("the database is down")
			case 3:
				return echo.NewHTTPError(http.StatusBadRequest, "no such product")
			}
			return c.String(http.StatusCreated, "ordered")
		}, idemecho.Middleware(mw.Required()))

		body := func(code int, msg string) string {
			if custom {
				return "custom: " + http.StatusText(code)
			}
			return `{"message":"` + msg + `"}` + "\n"
		}
		for i, want := range []struct {
			status   int
			body     string
			replayed bool
		}{
			{http.StatusServiceUnavailable, body(503, "later"), false},
			{http.StatusInternalServerError, body(500, "Internal Server Error"), false},
			{http.StatusBadRequest, body(400, "no such product"), false},
			{http.StatusBadRequest, body(400, "no such product"), true},
		} {
			a := post(t, e, "/orders", "k-err", `{"sku":"x"}`)
			if a.status != want.status || a.body != want.body || replayed(a) != want.replayed {
				t.Errorf("custom=%v, request %d: %d %q replayed=%v; want %d %q replayed=%v",
					custom, i+1, a.status, a.body, replayed(a), want.status, want.body, want.replayed)
			}
		}
		if n := runs.Load(); n != 3 {
			t.Errorf("custom=%v: handler ran %d times, want 3: the 503 and the 500 released, the 400 kept", custom, n)
		}
	}
}

// A handler that returns nil having written nothing answers 200 with no
// body, kept; one that sets headers and a status with NoContent keeps them.
func TestNothingWritten(t *testing.T) {
	mw := newMiddleware(t)
	e := echo.New()
	e.POST("/nothing", func(echo.Context) error { return nil }, idemecho.Middleware(mw.Required()))
	e.POST("/accepted", func(c echo.Context) error {
		c.Response().Header().Set("X-Queued", "yes")
		return c.NoContent(http.StatusAccepted)
	}, idemecho.Middleware(mw.Required()))
	for _, tc := range []struct {
		path   string
		status int
		header string
	}{
		{"/nothing", http.StatusOK, ""},
		{"/accepted", http.StatusAccepted, "yes"},
	} {
		for i, wantReplay := range []bool{false, true} {
			a := post(t, e, tc.path, "k"+tc.path, `{}`)
			if a.status != tc.status || a.body != "" || a.header.Get("X-Queued") != tc.header || replayed(a) != wantReplay {
				t.Errorf("%s, request %d: %d %q X-Queued=%q replayed=%v; want %d, no body, %q, replayed=%v",
					tc.path, i+1, a.status, a.body, a.header.Get("X-Queued"), replayed(a), tc.status, tc.header, wantReplay)
			}
		}
	}
}

// Events name the route by echo's route path.
func TestEventsNameTheRoute(t *testing.T) {
	var routes []string
	mw := newMiddleware(t, middleware.WithObserver(func(_ *http.Request, e middleware.Event) {
		routes = append(routes, e.Route)
	}))
	e := echo.New()
	e.POST("/accounts/:id/payments", func(c echo.Context) error {
		return c.String(http.StatusCreated, "ok")
	}, idemecho.Middleware(mw.Required()))
	post(t, e, "/accounts/42/payments", "k-route", `{}`)
	if len(routes) == 0 {
		t.Fatal("no events")
	}
	for _, got := range routes {
		if got != "/accounts/:id/payments" {
			t.Errorf("event route %q, want /accounts/:id/payments", got)
		}
	}
}

// What the middleware puts into the request's context reaches the echo
// handler through c.Request(); after the handler, the request and the
// response are echo's own again.
func TestRequestContextReachesHandler(t *testing.T) {
	mw := newMiddleware(t)
	e := echo.New()
	var before, after *echo.Response
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			before = c.Response()
			err := next(c)
			after = c.Response()
			if _, ok := idemkey.FromContext(c.Request().Context()); ok {
				t.Error("the key is still in c.Request() after the handler")
			}
			return err
		}
	})
	e.POST("/payments", func(c echo.Context) error {
		k, ok := idemkey.FromContext(c.Request().Context())
		if !ok || k.Value != "k-ctx" {
			t.Errorf("c.Request()'s context: key %+v %v, want k-ctx", k, ok)
		}
		return c.String(http.StatusCreated, "ok")
	}, idemecho.Middleware(mw.Required()))
	if a := post(t, e, "/payments", "k-ctx", `{}`); a.status != http.StatusCreated {
		t.Fatalf("%d %s, want 201", a.status, a.body)
	}
	if before != after || !after.Committed || after.Status != http.StatusCreated {
		t.Errorf("echo's response after the handler: same=%v committed=%v status=%d, want the same, committed, 201", before == after, after.Committed, after.Status)
	}
}

// A 5xx and a panic release the key: the retry runs the handler again.
// echo's Recover, before idemecho.Middleware, answers the panic.
func TestFailuresRelease(t *testing.T) {
	mw := newMiddleware(t)
	var runs atomic.Int32
	e := echo.New()
	e.Use(echomw.RecoverWithConfig(echomw.RecoverConfig{DisablePrintStack: true, LogErrorFunc: func(_ echo.Context, err error, _ []byte) error { return err }}))
	e.POST("/flaky", func(c echo.Context) error {
		switch runs.Add(1) {
		case 1:
			return c.String(http.StatusServiceUnavailable, "later")
		case 2:
			panic("boom")
		default:
			return c.String(http.StatusCreated, "made")
		}
	}, idemecho.Middleware(mw.Required()))
	for i, want := range []int{503, 500, 201, 201} {
		if a := post(t, e, "/flaky", "k-flaky", `{}`); a.status != want {
			t.Errorf("request %d: %d %q, want %d", i+1, a.status, a.body, want)
		}
	}
	if n := runs.Load(); n != 3 {
		t.Errorf("handler ran %d times, want 3 (two failures released, then one success replayed)", n)
	}
}

// A flush starts a stream, which is kept when it starts; the replay has
// the status and headers and says the body was omitted.
func TestStream(t *testing.T) {
	mw := newMiddleware(t)
	e := echo.New()
	e.POST("/stream", func(c echo.Context) error {
		c.Response().Header().Set("Content-Type", "text/event-stream")
		c.Response().WriteHeader(http.StatusOK)
		io.WriteString(c.Response(), "data: 1\n\n")
		c.Response().Flush()
		io.WriteString(c.Response(), "data: 2\n\n")
		return nil
	}, idemecho.Middleware(mw.Required()))
	srv := httptest.NewServer(e)
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

// A repeat while the first still runs gets 409, and the handler runs once.
func TestConflict(t *testing.T) {
	mw := newMiddleware(t)
	started, finish := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	e := echo.New()
	e.POST("/slow", func(c echo.Context) error {
		runs.Add(1)
		close(started)
		<-finish
		return c.String(http.StatusCreated, "done")
	}, idemecho.Middleware(mw.Required()))
	done := make(chan answer)
	go func() { done <- post(t, e, "/slow", "k-slow", `{}`) }()
	<-started
	if a := post(t, e, "/slow", "k-slow", `{}`); a.status != http.StatusConflict || a.header.Get("Retry-After") == "" {
		t.Errorf("repeat while running: %d %q Retry-After=%q, want 409 with Retry-After", a.status, a.body, a.header.Get("Retry-After"))
	}
	close(finish)
	if a := <-done; a.status != http.StatusCreated {
		t.Errorf("first: %d %q, want 201", a.status, a.body)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

func TestNilRoutePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Middleware(nil) did not panic")
		}
	}()
	idemecho.Middleware(nil)
}
