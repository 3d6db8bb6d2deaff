package paymentstest

import (
	"errors"
	"io"
	"net/http"
	"sync"
)

// errLostReply is what a caller sees when loseReplies drops an answer.
var errLostReply = errors.New("paymentstest: the reply was lost on its way back")

// loseReplies is a RoundTripper that sends each request on, then drops the
// first n answers and returns errLostReply in their place: the request
// reached the server and ran, but the caller never saw the result.
type loseReplies struct {
	base http.RoundTripper

	mu   sync.Mutex
	n    int
	sent []sentRequest
	lost []reply
}

type sentRequest struct {
	key string // the Idempotency-Key header
}

func (l *loseReplies) RoundTrip(r *http.Request) (*http.Response, error) {
	key := r.Header.Get("Idempotency-Key")
	resp, err := l.base.RoundTrip(r)
	l.mu.Lock()
	l.sent = append(l.sent, sentRequest{key: key})
	drop := err == nil && len(l.lost) < l.n
	var body []byte
	if drop {
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		l.lost = append(l.lost, reply{Status: resp.StatusCode, Header: resp.Header, Body: body})
	}
	l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if drop {
		return nil, errLostReply
	}
	return resp, nil
}

// requests returns what was sent so far.
func (l *loseReplies) requests() []sentRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]sentRequest(nil), l.sent...)
}

// dropped returns the answers dropped so far.
func (l *loseReplies) dropped() []reply {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]reply(nil), l.lost...)
}

// holdFirst is a RoundTripper that holds the first request it is given
// until release is closed, after closing entered; every later request goes
// straight through. It keeps a transfer in flight for as long as a test
// needs, so that the test does not depend on timing.
type holdFirst struct {
	base    http.RoundTripper
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func newHoldFirst(base http.RoundTripper) *holdFirst {
	return &holdFirst{base: base, entered: make(chan struct{}), release: make(chan struct{})}
}

func (h *holdFirst) RoundTrip(r *http.Request) (*http.Response, error) {
	first := false
	h.once.Do(func() { first = true })
	if first {
		close(h.entered)
		select {
		case <-h.release:
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	return h.base.RoundTrip(r)
}
