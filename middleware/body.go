package middleware

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"
)

// The request body is read in full before the claim, so that it can be
// fingerprinted, and given to the handler again from memory.

var errTooLarge = errors.New("idemkey: middleware: request body too large")

// readBody reads r's body in full, up to limit bytes, into buf, within the
// body timeout. A declared Content-Length over limit is refused at once;
// otherwise the buffer grows as bytes arrive, so a client that declares a
// large body and sends little pins little memory.
func (m *Middleware) readBody(w http.ResponseWriter, r *http.Request, buf *bodyBuffer) ([]byte, error) {
	limit := m.cfg.maxRequestBody
	if r.ContentLength > limit {
		return nil, errTooLarge
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, nil
	}
	var rc *http.ResponseController
	if d := m.bodyTimeout(r); d > 0 && canSetReadDeadline(w) {
		rc = http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(d)) != nil {
			rc = nil
		}
	}
	b, err := readInto(r.Body, buf.b[:0], limit)
	if rc != nil && err == nil {
		// Read in full: lift the bound. After a failed read it stays, so
		// that the server's own attempt to drain the rest of the body
		// ends at once too (and the connection is closed).
		rc.SetReadDeadline(time.Time{})
	}
	if cap(b) <= maxPooledBody {
		buf.b = b[:0] // keep what append grew, for the next request
	} else {
		buf.own = true
	}
	return b, err
}

// bodyTimeout is how long to allow for r's body: WithBodyTimeout, or 0
// when the server's own ReadTimeout already bounds the read as tightly.
func (m *Middleware) bodyTimeout(r *http.Request) time.Duration {
	if srv, ok := r.Context().Value(http.ServerContextKey).(*http.Server); ok {
		if rt := srv.ReadTimeout; rt > 0 && rt <= m.cfg.bodyTimeout {
			return 0
		}
	}
	return m.cfg.bodyTimeout
}

// canSetReadDeadline reports whether http.ResponseController can set w's
// read deadline: w, or a writer its Unwrap chain reaches, has
// SetReadDeadline. (Asking first spares the error the controller makes for
// a writer that cannot.)
func canSetReadDeadline(w http.ResponseWriter) bool {
	return reaches(w, func(w http.ResponseWriter) bool {
		_, ok := w.(interface{ SetReadDeadline(time.Time) error })
		return ok
	})
}

// readInto reads all of body into buf, up to limit bytes, growing buf only
// as bytes arrive.
func readInto(body io.Reader, buf []byte, limit int64) ([]byte, error) {
	if cap(buf) == 0 {
		buf = make([]byte, 0, minPooledBody)
	}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return nil, errTooLarge
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				return nil, errTooLarge
			}
			return nil, err
		}
	}
}

// Request bodies are read into buffers from a pool: a first run, a replay
// and a refusal alike read the whole body, and the buffer is free again
// once the response is written. A buffer starts at minPooledBody bytes and
// grows as the body arrives; buffers of up to maxPooledBody bytes go back
// to the pool, a larger one is left to the garbage collector.
const (
	minPooledBody = 4 << 10
	maxPooledBody = 64 << 10
)

// bodyBuffer is one pooled request body buffer. own marks a buffer too
// large to go back to the pool.
type bodyBuffer struct {
	b   []byte
	own bool
}

var bodyPool = sync.Pool{New: func() any { return new(bodyBuffer) }}

func getBodyBuffer() *bodyBuffer { return bodyPool.Get().(*bodyBuffer) }

func putBodyBuffer(buf *bodyBuffer) {
	if buf.own {
		buf.b, buf.own = nil, false
	}
	bodyPool.Put(buf)
}

// bodyReader gives the handler the body that was read, as the request's
// Body.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }
