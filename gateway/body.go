package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// ErrRequestBody is returned, wrapped with the cause, by RoundTrip when the
// request body could not be read, or (for a request made with GetBody) made
// again for another upstream. When a body held in memory could not be
// read, nothing was sent. A body too long to hold that failed while it was
// streamed reached the upstream in part, and the upstream could not read it
// whole: the failure is the client's, the upstream is not put in cool-off,
// and the ReverseProxy answers 413 (http.MaxBytesError) or 400.
var ErrRequestBody = errors.New("idemkey: gateway: reading the request body")

// body hands out a request's body for each attempt.
type body struct {
	first io.ReadCloser // the first attempt's body
	// get returns a fresh copy for a later attempt; nil when the body
	// can be sent only once.
	get func() (io.ReadCloser, error)
	// length is the body's length when the gateway holds it all, else -1:
	// the request's own ContentLength stands.
	length int64
	// streamed is the client's body when it is sent as it arrives (too
	// long to hold), to tell its read errors from the upstream's.
	streamed *watched
}

// broken returns the error the client's streamed body failed with, if it
// did: a failed attempt is then the client's fault, not the upstream's.
func (b *body) broken() error {
	if b.streamed == nil {
		return nil
	}
	return b.streamed.failed()
}

// watched is a request body that remembers the first error, other than
// io.EOF, that reading it gave.
type watched struct {
	rc  io.ReadCloser
	r   io.Reader
	mu  sync.Mutex
	err error
}

func (w *watched) Read(p []byte) (int, error) {
	n, err := w.r.Read(p)
	if err != nil && err != io.EOF {
		w.mu.Lock()
		if w.err == nil {
			w.err = err
		}
		w.mu.Unlock()
	}
	return n, err
}

func (w *watched) Close() error { return w.rc.Close() }

func (w *watched) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// newBody prepares req's body for one or more attempts: a body without
// GetBody is read into memory up to the limit. A longer body is streamed
// once. On error req's body has been closed.
func (g *Gateway) newBody(req *http.Request) (body, error) {
	switch {
	case req.Body == nil || req.Body == http.NoBody:
		b := req.Body
		return body{first: b, get: func() (io.ReadCloser, error) { return b, nil }, length: -1}, nil
	case req.GetBody != nil:
		return body{first: req.Body, get: req.GetBody, length: -1}, nil
	case g.cfg.bodyLimit == 0 || req.ContentLength > g.cfg.bodyLimit:
		w := &watched{rc: req.Body, r: req.Body}
		return body{first: w, length: -1, streamed: w}, nil
	}
	buf, err := io.ReadAll(io.LimitReader(req.Body, g.cfg.bodyLimit+1))
	if err != nil {
		req.Body.Close()
		return body{}, fmt.Errorf("%w: %w", ErrRequestBody, err)
	}
	if int64(len(buf)) > g.cfg.bodyLimit {
		// Too long to hold: what was read and the rest, streamed once.
		w := &watched{rc: req.Body, r: io.MultiReader(bytes.NewReader(buf), req.Body)}
		return body{first: w, length: -1, streamed: w}, nil
	}
	req.Body.Close()
	if len(buf) == 0 {
		return body{first: http.NoBody, get: func() (io.ReadCloser, error) { return http.NoBody, nil }, length: 0}, nil
	}
	get := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	first, _ := get()
	return body{first: first, get: get, length: int64(len(buf))}, nil
}

// set gives out, the request of attempt i (from 0), its body. Only a
// resendable request gets GetBody: the transport resends a request that
// has it, by itself, when a kept-alive connection breaks under it and the
// request looks idempotent to net/http (see httpretry.LooksIdempotent).
func (b *body) set(out *http.Request, i int, resendable bool) error {
	if i == 0 {
		out.Body = b.first
	} else {
		rc, err := b.get()
		if err != nil {
			return fmt.Errorf("%w: GetBody: %w", ErrRequestBody, err)
		}
		out.Body = rc
	}
	out.GetBody = nil
	if resendable && b.get != nil && out.Body != nil && out.Body != http.NoBody {
		// The transport may resend on a fresh connection by itself.
		out.GetBody = b.get
	}
	if b.length >= 0 {
		out.ContentLength = b.length
		out.TransferEncoding = nil
	}
	return nil
}
