package middleware

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/idemkey/idemkey/store"
)

// capture is the ResponseWriter a claimed request's handler writes to.
//
// It holds the response (status, the headers as they were when the status
// was written, and up to limit bytes of body) and sends nothing until the
// handler returns, so that the middleware can keep the record before the
// client sees the answer. A handler that flushes, or writes past the limit,
// starts streaming: the capture asks its owner to keep the record first
// (owner.streaming), then what was held goes out and the rest passes
// straight through. Informational (1xx) responses pass straight through.
//
// The value the handler sees is built by newCapture: it has Flush and
// ReadFrom exactly when the wrapped writer has them, Hijack when the
// wrapped writer or one its Unwrap chain reaches has it, and always Unwrap
// for http.ResponseController.
type capture struct {
	w     http.ResponseWriter
	limit int
	keep  func(string) bool
	owner streamer

	status int         // final status; 0 until written
	kept   http.Header // headers that may be replayed, snapshotted with the status
	// rec is the record record returns, kept here: no allocation of its
	// own. (WithLocalCache caches a copy, not to keep the capture alive.)
	rec       store.Record
	body      []byte // the held body, up to limit; nil once streaming
	streaming bool   // the response has started to go out
	aborted   bool   // the owner answered in the handler's place: drop what it writes
	hijacked  bool
	// after holds header changes made after the status was written while
	// the response is still held, so that they cannot alter the headers
	// that go out; trailers set there are copied over when it is sent.
	after http.Header

	// The request body the handler reads, here so that one allocation
	// serves the handler's whole exchange, and the value slots of the
	// headers send and the owner set without allocating.
	in      bodyReader
	length  [1]string
	request [1]string
	// values holds the kept header's values, when they fit.
	values [8]string
	// small holds a body of up to its size (most responses to a mutation
	// are a short JSON object) without an allocation of its own.
	small [smallBody]byte
}

// smallBody is the size of a body the capture holds in itself.
const smallBody = 128

// A streamer is told before a held response starts to go out while the
// handler runs, and keeps its record first; it reports false when the
// response must not go out (it answered in the handler's place).
type streamer interface {
	streaming(*capture) bool
}

// errAborted is what a handler's writes return once the middleware has
// answered in its place (a transaction that did not commit).
var errAborted = errors.New("idemkey: middleware: the response was replaced: the record could not be kept")

func (c *capture) Header() http.Header {
	if c.status != 0 && !c.streaming && !c.hijacked && !c.aborted {
		if c.after == nil {
			c.after = c.w.Header().Clone()
		}
		return c.after
	}
	return c.w.Header()
}

func (c *capture) WriteHeader(code int) {
	if c.hijacked || c.aborted || c.status != 0 {
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
	c.kept = keptHeader(c.w.Header(), c.keep, c.values[:])
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
	switch {
	case c.hijacked:
		return 0, http.ErrHijacked
	case c.aborted:
		return 0, errAborted
	}
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(c.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if !c.streaming {
		if len(c.body)+len(p) <= c.limit {
			c.body = append(c.body, p...)
			return len(p), nil
		}
		if err := c.startStream(); err != nil {
			return 0, err
		}
	}
	return out(c.w, p)
}

// startStream starts the response before the handler has returned: the
// owner keeps the record first, then the status, the headers and the held
// body go out.
func (c *capture) startStream() error {
	if c.status == 0 {
		c.status = http.StatusOK
		c.kept = keptHeader(c.w.Header(), c.keep, c.values[:])
	}
	if !c.owner.streaming(c) {
		return errAborted
	}
	return c.send(false)
}

// send writes the status and headers, then the held body. whole says the
// handler has returned, so the held body is all there is.
func (c *capture) send(whole bool) error {
	c.streaming = true
	h := c.w.Header()
	if whole && bodyAllowed(c.status) && headerValue(h, "Content-Length") == "" && headerValue(h, "Transfer-Encoding") == "" && !hasTrailers(h) {
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
	body := c.body
	c.body = nil
	if len(body) == 0 {
		return nil
	}
	_, err := c.w.Write(body)
	return err
}

// finish sends what is still held, once the handler has returned.
func (c *capture) finish() {
	switch {
	case c.hijacked, c.aborted:
	case !c.streaming:
		c.send(true)
	default:
		c.copyTrailers()
	}
}

// replace drops the held response and the headers the handler set, so
// that the owner can answer in its place; what the handler writes from
// then on is dropped. It must be called before anything was sent.
func (c *capture) replace() {
	h := c.w.Header()
	for k := range h {
		delete(h, k)
	}
	c.aborted, c.body, c.after = true, nil, nil
}

// record returns the response as the record to keep: what was held, or,
// for a response that streams (or is about to: streamed), its status and
// headers with the body omitted.
func (c *capture) record(streamed bool) *store.Record {
	c.rec = store.Record{Status: c.status, Header: c.kept, BodyOmitted: true}
	if !streamed && !c.streaming {
		c.rec.BodyOmitted = false
		if len(c.body) > 0 {
			c.rec.Body = c.body
		}
	}
	return &c.rec
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
	switch {
	case c.hijacked:
		return http.ErrHijacked
	case c.aborted:
		return errAborted
	}
	if !canFlush(c.w) {
		// Nothing could be flushed: keep holding the response, rather
		// than start a stream that cannot go out.
		return http.ErrNotSupported
	}
	if !c.streaming {
		if err := c.startStream(); err != nil {
			return err
		}
	}
	return http.NewResponseController(c.w).Flush()
}

// canFlush reports whether http.ResponseController can flush w: w, or a
// writer its Unwrap chain reaches, is an http.Flusher or has FlushError.
func canFlush(w http.ResponseWriter) bool {
	return reaches(w, func(w http.ResponseWriter) bool {
		switch w.(type) {
		case interface{ FlushError() error }, http.Flusher:
			return true
		}
		return false
	})
}

// canHijack reports whether http.ResponseController can hijack w: w, or
// a writer its Unwrap chain reaches, is an http.Hijacker.
func canHijack(w http.ResponseWriter) bool {
	return reaches(w, func(w http.ResponseWriter) bool {
		_, ok := w.(http.Hijacker)
		return ok
	})
}

// reaches reports whether w, or a writer its Unwrap chain reaches (the
// chain http.ResponseController walks), satisfies has.
func reaches(w http.ResponseWriter, has func(http.ResponseWriter) bool) bool {
	for {
		if has(w) {
			return true
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return false
		}
		w = u.Unwrap()
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
	if c.streaming && !c.aborted && !c.hijacked {
		// Nothing more is held: let the wrapped writer copy directly.
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
var (
	_ http.ResponseWriter = (*capture)(nil)
	_ http.Flusher        = (*captureF)(nil)
	_ http.Hijacker       = (*captureH)(nil)
	_ io.ReaderFrom       = (*captureR)(nil)
	_ http.Flusher        = (*captureFH)(nil)
	_ http.Hijacker       = (*captureFH)(nil)
	_ http.Flusher        = (*captureFR)(nil)
	_ io.ReaderFrom       = (*captureFR)(nil)
	_ http.Hijacker       = (*captureHR)(nil)
	_ io.ReaderFrom       = (*captureHR)(nil)
	_ http.Flusher        = (*captureFHR)(nil)
	_ http.Hijacker       = (*captureFHR)(nil)
	_ io.ReaderFrom       = (*captureFHR)(nil)
	_ io.StringWriter     = (*capture)(nil)

	_ interface{ FlushError() error }           = (*capture)(nil)
	_ interface{ Unwrap() http.ResponseWriter } = (*capture)(nil)
)

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
func newCapture(w http.ResponseWriter, limit int, keep func(string) bool, owner streamer) (*capture, http.ResponseWriter) {
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
	c.w, c.limit, c.keep, c.owner = w, limit, keep, owner
	c.body = c.small[:0]
	return c, out
}
