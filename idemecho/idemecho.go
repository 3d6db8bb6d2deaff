// Package idemecho runs idemkey's middleware in an echo (v4) server.
//
// Middleware turns the route middleware that (*middleware.Middleware).Required,
// Optional or Handler returns into an echo.MiddlewareFunc:
//
//	mw, err := middleware.New(st)
//	...
//	e := echo.New()
//	e.Use(auth) // puts the caller into the request's context with scope.NewContext
//	e.POST("/payments", createPayment, idemecho.Middleware(mw.Required(middleware.Deadline(10*time.Second))))
//	e.PUT("/profile", updateProfile, idemecho.Middleware(mw.Optional()))
//
// The handler (and the middleware after this one in the route's list) is
// what idemkey runs once: when the middleware answers by itself (a replay,
// 409, 422, 400, 503) it does not run. While it runs, c.Request() is the
// request the middleware passes on, so its context carries the key and, on
// a transactional store, the request's transaction
// (postgres.Tx(c.Request().Context())), and c.Response() writes into the
// middleware's capture writer: what the handler writes is what is kept.
//
// An error the handler returns is answered there, by the server's
// HTTPErrorHandler (echo's DefaultHTTPErrorHandler unless the server set
// its own), before the middleware sees the end of the handler: the error's
// response is the one kept, or released, by the same rules as any other (a
// 4xx kept and replayed, a 5xx released, DefaultKeep). So nothing is kept
// that the client did not get, and the error is not returned further up the
// chain, where echo would answer it a second time. A handler that returns
// nil and writes nothing answers 200 with no body, as it would under echo.
// Both the request and the response are restored when the handler returns.
//
// The request's Pattern is echo's route ("/payments/:id", c.Path()) unless
// one was set before, so events and metrics name the route as they do
// under ServeMux and chi.
//
// Put idemecho.Middleware after authentication (the scope needs the
// caller) and inside echo's Recover if you use it (idemkey releases the key
// on a panic and lets the panic go on): in a route's own middleware list,
// after e.Use(middleware.Recover()). See package middleware for the rest
// of the order.
package idemecho

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"
)

// Middleware returns echo middleware that runs route around the rest of
// the chain. route is what (*middleware.Middleware).Required, Optional or
// Handler returns (any func(http.Handler) http.Handler that calls its next
// handler on the request goroutine works the same way). It is applied
// once, here. Middleware panics if route is nil or returns nil: a route is
// written in code, so that is a programming error found at start-up.
func Middleware(route func(http.Handler) http.Handler) echo.MiddlewareFunc {
	if route == nil {
		panic("idemkey: idemecho: nil route middleware")
	}
	h := route(http.HandlerFunc(runChain))
	if h == nil {
		panic("idemkey: idemecho: route middleware returned a nil handler")
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			run := &chain{c: c, next: next}
			orig := c.Request()
			r := orig.WithContext(context.WithValue(orig.Context(), chainKey{}, run))
			if r.Pattern == "" {
				r.Pattern = c.Path() // the route's name in events and metrics
			}
			defer c.SetRequest(orig)
			// The middleware writes through echo's own Response, so that what it
			// answers by itself (a replay, 409, 422) is committed there as
			// echo's Logger and the middleware before this one expect.
			h.ServeHTTP(c.Response(), r)
			return nil
		}
	}
}

// chainKey is the context key of the chain one request runs.
type chainKey struct{}

// chain is the echo context of one request and the handler after the
// middleware, for the handler the route middleware calls.
type chain struct {
	c    echo.Context
	next echo.HandlerFunc
}

// runChain is the next handler of the route middleware: the rest of echo's
// chain, on the request and writer the middleware passes on, with an
// error it returns answered there by the server's error handler.
func runChain(w http.ResponseWriter, r *http.Request) {
	run, _ := r.Context().Value(chainKey{}).(*chain)
	if run == nil {
		panic("idemkey: idemecho: the route middleware called its handler with a request it did not get from idemecho")
	}
	c := run.c
	req, resp := c.Request(), c.Response()
	c.SetRequest(r)
	c.SetResponse(echo.NewResponse(w, c.Echo()))
	defer func() { c.SetRequest(req); c.SetResponse(resp) }()
	if err := run.next(c); err != nil {
		c.Error(err)
	}
}
