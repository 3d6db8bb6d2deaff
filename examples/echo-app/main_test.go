package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/examples/internal/paymentstest"
	idem "github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

// TestEndToEnd runs the service on echo, in-process on a free port, with
// the in-memory store, against real Redis and against PostgreSQL: the
// suite chi-app and nethttp-app pass; see package paymentstest.
func TestEndToEnd(t *testing.T) {
	paymentstest.Run(t, routes)
}

// An echo handler's returned error is answered inside the idempotency
// layer by WriteErrors: a 5xx is released (the retry runs again), a 4xx
// kept and replayed; the handler reads the key from c.Request().
func TestWrapMiddlewareWithErrors(t *testing.T) {
	st, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	mw, err := idem.New(st)
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	e := echo.New()
	e.POST("/orders", func(c echo.Context) error {
		runs++
		if k, ok := idemkey.FromContext(c.Request().Context()); !ok || k.Value != "k-1" {
			t.Errorf("c.Request()'s key: %+v %v, want k-1", k, ok)
		}
		switch runs {
		case 1:
			return echo.NewHTTPError(http.StatusServiceUnavailable, "later")
		case 2:
			return echo.NewHTTPError(http.StatusBadRequest, "no such product")
		}
		return c.String(http.StatusCreated, "ordered")
	}, echo.WrapMiddleware(mw.Required()), WriteErrors)

	for i, want := range []struct {
		status   int
		body     string
		replayed bool
	}{
		{http.StatusServiceUnavailable, `{"message":"later"}` + "\n", false},
		{http.StatusBadRequest, `{"message":"no such product"}` + "\n", false},
		{http.StatusBadRequest, `{"message":"no such product"}` + "\n", true},
	} {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"sku":"x"}`))
		r.Header.Set("Idempotency-Key", "k-1")
		w := httptest.NewRecorder()
		e.ServeHTTP(w, r)
		if w.Code != want.status || w.Body.String() != want.body || (w.Header().Get("Idempotent-Replayed") == "true") != want.replayed {
			t.Errorf("request %d: %d %q replayed=%q; want %d %q replayed=%v",
				i+1, w.Code, w.Body.String(), w.Header().Get("Idempotent-Replayed"), want.status, want.body, want.replayed)
		}
	}
	if runs != 2 {
		t.Errorf("handler ran %d times, want 2: the 503 released, the 400 kept", runs)
	}
}
