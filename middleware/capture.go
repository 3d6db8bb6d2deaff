package middleware

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// capture is the ResponseWriter a claimed request's handler writes to.
//
// It holds the response (status, the headers as they were when the status
// was written, and up to limit bytes of body) and sends nothing until the
// handler returns, so that the middleware can keep the record before the
// client sees the answer. A handler that flushes, or writes past the limit,
// switches it to streaming: what was held goes out, and the rest passes
// straight through while the first limit bytes are still teed for the
// record (past the limit the record omits the body). Informational (1xx)
// responses pass straight through.
//
// The value the handler sees is built by newCapture: it has Flush and
// ReadFrom exactly when the wrapped writer has them, Hijack when the
// wrapped writer or one its Unwrap chain reaches has it, and always Unwrap
// for http.ResponseController.
type capture struct {
	w     http.ResponseWriter
	limit int
	keep  func(string) bool

	status    int         // final status; 0 until written
	kept      http.Header // headers that may be replayed, snapshotted with the status
	body      []byte      // the held or teed body, up to limit
	overflow  bool        // the body passed limit: the record omits it
	streaming bool        // the response has started to go out
	hijacked  bool
	// after holds header changes made after the status was written while
	// the response is still held, so that they cannot alter the headers
	// that go out; trailers set there are copied over when it is sent.
	after http.Header

	// These live here so that one allocation serves the whole exchange:
	// ctx is the handler's context, in the request body the handler reads,
	// and length the value slot of the Content-Length header send sets.
	ctx    runContext
	in     bodyReader
	length [1]string
}

func (c *capture) Header() http.Header {
	if c.status != 0 && !c.streaming && !c.hijacked {
		if c.after == nil {
			c.after = c.w.Header().Clone()
		}
		return c.after
	}
	return c.w.Header()
}

func (c *capture) WriteHeader(code int) {
	if c.hijacked || c.status != 0 {
		return
	}
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		c.w.WriteHeader(code)
		return
	}
	c.status = code
	c.kept = keptHeader(c.w.Header(), c.keep)
}

func (c *capture) Write(p []byte) (int, error) {
	return write(c, p, http.ResponseWriter.Write)
}

func (c *capture) WriteString(s string) (int, error) {
	return write(c, s, writeString)
}

func writeString(w http.ResponseWriter, s string) (int, error) { return io.WriteString(w, s) }

// write is the one capture path for Write, WriteString and ReadFrom; out
// writes p to the wrapped writer.
func write[T string | []byte](c *capture, p T, out func(http.ResponseWriter, T) (int, error)) (int, error) {
	if c.hijacked {
		return 0, http.ErrHijacked
	}
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(c.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if !c.overflow {
		if len(c.body)+len(p) <= c.limit {
			c.body = append(c.body, p...)
			if !c.streaming {
				return len(p), nil
			}
		} else {
			c.overflow = true
			if !c.streaming {
				if err := c.send(false); err != nil {
					return 0, err
				}
			}
			c.body = nil
		}
	}
	return out(c.w, p)
}

// send starts the response: the status and headers, then the held body.
// whole says the handler has returned, so the held body is all there is.
func (c *capture) send(whole bool) error {
	c.streaming = true
	if c.status == 0 {
		c.status = http.StatusOK
		c.kept = keptHeader(c.w.Header(), c.keep)
	}
	h := c.w.Header()
	if whole && bodyAllowed(c.status) && h.Get("Content-Length") == "" && h.Get("Transfer-Encoding") == "" && !hasTrailers(h) {
		// Say how long the body is rather than chunk it, as net/http does
		// for a handler that returns after one write: not when trailers
		// are declared, which need a chunked body. (h.Set, without
		// allocating the value slice.)
		c.length[0] = strconv.Itoa(len(c.body))
		h["Content-Length"] = c.length[:]
	}
	c.w.WriteHeader(c.status)
	c.copyTrailers()
	// From here on the handler's header changes go to the wrapped writer:
	// what after held is out of date, and copying it again when the
	// handler returns would undo trailers set since.
	c.after = nil
	if len(c.body) == 0 {
		return nil
	}
	_, err := c.w.Write(c.body)
	return err
}

// finish sends what is still held, once the handler has returned.
func (c *capture) finish() {
	if c.hijacked {
		return
	}
	if !c.streaming {
		c.send(true)
		return
	}
	c.copyTrailers()
}

// copyTrailers moves trailer values set in after to the wrapped writer.
func (c *capture) copyTrailers() {
	if c.after == nil {
		return
	}
	h := c.w.Header()
	declared := h.Values("Trailer")
	for k, v := range c.after {
		if strings.HasPrefix(k, http.TrailerPrefix) || declaredTrailer(declared, k) {
			h[k] = v
		}
	}
}

// hasTrailers reports whether h declares trailers, as net/http judges it
// when it decides between a Content-Length and a chunked body: a Trailer
// header, or a name with http.TrailerPrefix.
func hasTrailers(h http.Header) bool {
	if len(h["Trailer"]) > 0 {
		return true
	}
	for k := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			return true
		}
	}
	return false
}

func declaredTrailer(declared []string, name string) bool {
	for _, d := range declared {
		for f := range strings.SplitSeq(d, ",") {
			if http.CanonicalHeaderKey(strings.TrimSpace(f)) == name {
				return true
			}
		}
	}
	return false
}

// FlushError flushes through to the client, switching to streaming; it is
// what http.ResponseController.Flush calls. It returns an error matching
// http.ErrNotSupported when the wrapped writer cannot flush.
func (c *capture) FlushError() error {
	if c.hijacked {
		return http.ErrHijacked
	}
	if !canFlush(c.w) {
		// Nothing could be flushed: keep holding the response, rather
		// than send it before it is kept.
		return http.ErrNotSupported
	}
	if !c.streaming {
		if err := c.send(false); err != nil {
			return err
		}
	}
	return http.NewResponseController(c.w).Flush()
}

// canFlush reports whether http.ResponseController can flush w: w, or a
// writer its Unwrap chain reaches, has FlushError or Flush.
func canFlush(w http.ResponseWriter) bool {
	for {
		switch t := w.(type) {
		case interface{ FlushError() error }, http.Flusher:
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return false
		}
	}
}

// canHijack reports whether http.ResponseController can hijack w: w, or
// a writer its Unwrap chain reaches, is an http.Hijacker.
func canHijack(w http.ResponseWriter) bool {
	for {
		switch t := w.(type) {
		case http.Hijacker:
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return false
		}
	}
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (c *capture) Unwrap() http.ResponseWriter { return c.w }

func (c *capture) flush() { c.FlushError() }

func (c *capture) hijack() (net.Conn, *bufio.ReadWriter, error) {
	// Through the controller: w may reach its Hijacker only by Unwrap.
	conn, rw, err := http.NewResponseController(c.w).Hijack()
	if err == nil {
		c.hijacked = true
	}
	return conn, rw, err
}

func (c *capture) readFrom(src io.Reader) (int64, error) {
	if c.streaming && c.overflow {
		// Nothing more is captured: let the wrapped writer copy directly.
		return c.w.(io.ReaderFrom).ReadFrom(src)
	}
	return io.Copy(writerOnly{c}, src)
}

// writerOnly hides capture's other methods from io.Copy.
type writerOnly struct{ io.Writer }

func bodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified && status >= 200
}

// The writers the handler sees: capture with the optional interfaces of
// the writer it wraps (see newCapture). Each embeds capture by value, so that
// the handler's writer is a single allocation.
type (
	captureF   struct{ capture }
	captureH   struct{ capture }
	captureR   struct{ capture }
	captureFH  struct{ capture }
	captureFR  struct{ capture }
	captureHR  struct{ capture }
	captureFHR struct{ capture }
)

func (c *captureF) Flush()   { c.flush() }
func (c *captureFH) Flush()  { c.flush() }
func (c *captureFR) Flush()  { c.flush() }
func (c *captureFHR) Flush() { c.flush() }

func (c *captureH) Hijack() (net.Conn, *bufio.ReadWriter, error)   { return c.hijack() }
func (c *captureFH) Hijack() (net.Conn, *bufio.ReadWriter, error)  { return c.hijack() }
func (c *captureHR) Hijack() (net.Conn, *bufio.ReadWriter, error)  { return c.hijack() }
func (c *captureFHR) Hijack() (net.Conn, *bufio.ReadWriter, error) { return c.hijack() }

func (c *captureR) ReadFrom(src io.Reader) (int64, error)   { return c.readFrom(src) }
func (c *captureFR) ReadFrom(src io.Reader) (int64, error)  { return c.readFrom(src) }
func (c *captureHR) ReadFrom(src io.Reader) (int64, error)  { return c.readFrom(src) }
func (c *captureFHR) ReadFrom(src io.Reader) (int64, error) { return c.readFrom(src) }

// newCapture returns a capture of w that holds up to limit bytes of body
// and keeps the headers keep accepts, and the writer the handler sees: the
// capture itself, with exactly the optional interfaces (http.Flusher,
// http.Hijacker, io.ReaderFrom) that w has, and http.Hijacker also when
// w's Unwrap chain reaches one. Both are one allocation.
func newCapture(w http.ResponseWriter, limit int, keep func(string) bool) (*capture, http.ResponseWriter) {
	_, f := w.(http.Flusher)
	// A writer that reaches a Hijacker only by Unwrap can be hijacked
	// through http.ResponseController: the capture must offer Hijack then,
	// or the controller would unwrap past it and the hijack go unseen.
	h := canHijack(w)
	_, r := w.(io.ReaderFrom)
	var c *capture
	var out http.ResponseWriter
	switch {
	case f && h && r:
		x := new(captureFHR)
		c, out = &x.capture, x
	case f && h:
		x := new(captureFH)
		c, out = &x.capture, x
	case f && r:
		x := new(captureFR)
		c, out = &x.capture, x
	case h && r:
		x := new(captureHR)
		c, out = &x.capture, x
	case f:
		x := new(captureF)
		c, out = &x.capture, x
	case h:
		x := new(captureH)
		c, out = &x.capture, x
	case r:
		x := new(captureR)
		c, out = &x.capture, x
	default:
		c = new(capture)
		out = c
	}
	c.w, c.limit, c.keep = w, limit, keep
	return c, out
}
