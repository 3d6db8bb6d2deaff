// Package idemgin runs idemkey's middleware in a gin engine.
//
// Handler turns the route middleware that (*middleware.Middleware).Required,
// Optional or Handler returns into a gin.HandlerFunc:
//
//	mw, err := middleware.New(st)
//	...
//	r := gin.New()
//	r.Use(auth) // puts the caller into c.Request's context with scope.NewContext
//	r.POST("/payments", idemgin.Handler(mw.Required(middleware.Deadline(10*time.Second))), createPayment)
//	r.PUT("/profile", idemgin.Handler(mw.Optional()), updateProfile)
//
// The handlers after it in gin's chain are what idemkey runs once: when the
// middleware answers by itself (a replay, 409, 422, 400, 503) the chain is
// aborted and they do not run. While they run, c.Request is the request the
// middleware passes on, so its context carries the key and, on a
// transactional store, the request's transaction (postgres.Tx(c.Request.Context());
// with the engine's ContextWithFallback set, postgres.Tx(c) too), and
// c.Writer is a gin.ResponseWriter over the middleware's capture writer:
// what the handlers write is what is kept. gin's own rules hold: the status
// set with c.Status goes out with the first byte of the body (headers set
// before then are kept with it), and a handler that writes nothing answers
// 200. Both are restored when the chain returns. The request's Pattern is
// gin's route ("/payments/:id", c.FullPath()) unless one was set before, so
// events and metrics name the route as they do under ServeMux and chi.
//
// Put idemgin.Handler after authentication (the scope needs the caller) and
// after gin's Recovery if you use it (idemkey releases the key on a panic
// and lets the panic go on); see package middleware for the rest of the
// order.
package idemgin

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"
)

// Handler returns gin middleware that runs route around the rest of the
// chain. route is what (*middleware.Middleware).Required, Optional or
// Handler returns (any func(http.Handler) http.Handler that calls its next
// handler on the request goroutine works the same way). It is applied once,
// here. Handler panics if route is nil or returns nil: a route is written
// in code, so that is a programming error found at start-up.
func Handler(route func(http.Handler) http.Handler) gin.HandlerFunc {
	if route == nil {
		panic("idemkey: idemgin: nil route middleware")
	}
	h := route(http.HandlerFunc(runChain))
	if h == nil {
		panic("idemkey: idemgin: route middleware returned a nil handler")
	}
	return func(c *gin.Context) {
		run := &chain{c: c}
		r := c.Request.WithContext(context.WithValue(c.Request.Context(), chainKey{}, run))
		if r.Pattern == "" {
			r.Pattern = c.FullPath() // the route's name in events and metrics
		}
		h.ServeHTTP(c.Writer, r)
		if !run.ran {
			c.Abort() // the middleware answered by itself
		}
	}
}

// chainKey is the context key of the chain one request runs.
type chainKey struct{}

// chain is the gin context of one request, for the handler the route
// middleware calls.
type chain struct {
	c   *gin.Context
	ran bool
}

// runChain is the next handler of the route middleware: the rest of gin's
// chain, on the request and writer the middleware passes on.
func runChain(w http.ResponseWriter, r *http.Request) {
	run, _ := r.Context().Value(chainKey{}).(*chain)
	if run == nil {
		panic("idemkey: idemgin: the route middleware called its handler with a request it did not get from idemgin")
	}
	run.ran = true
	c := run.c
	req, writer := c.Request, c.Writer
	gw := &responseWriter{ResponseWriter: w, ctx: r.Context(), size: noWritten, status: http.StatusOK}
	c.Request, c.Writer = r, gw
	defer func() { c.Request, c.Writer = req, writer }()
	c.Next()
	gw.WriteHeaderNow()
}

const noWritten = -1

// responseWriter is gin's view of the middleware's capture writer. It
// keeps gin's rules: WriteHeader records the status, which goes out with
// the first write, Flush or WriteHeaderNow.
type responseWriter struct {
	http.ResponseWriter
	ctx    context.Context // the request's, for CloseNotify
	size   int             // bytes of body written; noWritten before the status went out
	status int
}

var _ gin.ResponseWriter = (*responseWriter)(nil)

// Unwrap returns the capture writer, for http.ResponseController.
func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// WriteHeader records the status; it goes out with the first write. An
// informational status (1xx but 101) goes out at once and is not the
// response's status. A status after the response began is ignored, as gin
// does.
func (w *responseWriter) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		w.ResponseWriter.WriteHeader(code)
		return
	}
	if code > 0 && !w.Written() {
		w.status = code
	}
}

// WriteHeaderNow sends the status and the headers if they have not gone
// out yet.
func (w *responseWriter) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.ResponseWriter.WriteHeader(w.status)
	}
}

func (w *responseWriter) Write(b []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.ResponseWriter.Write(b)
	w.size += n
	return n, err
}

func (w *responseWriter) WriteString(s string) (int, error) {
	w.WriteHeaderNow()
	n, err := io.WriteString(w.ResponseWriter, s)
	w.size += n
	return n, err
}

// Status is the response's status: 200 until one is set.
func (w *responseWriter) Status() int { return w.status }

// Size is the number of body bytes written, -1 before the status went out.
func (w *responseWriter) Size() int { return w.size }

// Written reports whether the status went out.
func (w *responseWriter) Written() bool { return w.size != noWritten }

// Flush sends the status and what was written so far. Through idemkey's
// writer a flush starts a stream: the record is kept when it starts.
func (w *responseWriter) Flush() {
	w.WriteHeaderNow()
	_ = http.NewResponseController(w.ResponseWriter).Flush() // gin's Flush has no error to return
}

// errHijackAfterBody is Hijack's answer once body bytes went out.
var errHijackAfterBody = errors.New("idemkey: idemgin: hijack after the response body began")

// Hijack takes over the connection, through the capture writer (a hijacked
// connection is never replayed), before any body byte was written.
func (w *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.size > 0 {
		return nil, nil, errHijackAfterBody
	}
	if w.size < 0 {
		w.size = 0
	}
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// CloseNotify returns a channel that receives true once the request's
// context is done: the client went away, or the route's deadline passed.
// (gin's interface still has this method; use c.Request.Context().)
func (w *responseWriter) CloseNotify() <-chan bool {
	ch := make(chan bool, 1)
	context.AfterFunc(w.ctx, func() { ch <- true })
	return ch
}

// Pusher returns the capture writer's http.Pusher, or nil.
func (w *responseWriter) Pusher() http.Pusher {
	if p, ok := w.ResponseWriter.(http.Pusher); ok {
		return p
	}
	return nil
}
