package gateway

import (
	"maps"
	"net/http"
	"sync"
)

// earlyKey is the context key under which Proxy.ServeHTTP hands its
// informational-response holder to RoundTrip.
type earlyKey struct{}

// maxHeld bounds the informational responses held for one attempt; more
// are dropped.
const maxHeld = 16

// early holds the 1xx informational responses (103 Early Hints, say) that
// the reverse proxy writes while an attempt that may still fail over is
// out: they go to the client only once that attempt is the one that
// answers, and never when it fails and another upstream answers instead.
// 101 Switching Protocols is a final answer and is never held.
type early struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	attempt int  // the attempt out now
	from    int  // the attempt whose 1xx is being written, from its trace
	hold    bool // hold what it writes
	held    []informational
}

type informational struct {
	code   int
	header http.Header
}

// begin starts attempt i; hold says whether its 1xx are held.
func (e *early) begin(i int, hold bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.attempt, e.from, e.hold, e.held = i, i, hold, nil
}

// got notes, from attempt i's trace, that a 1xx of attempt i is about to
// be written.
func (e *early) got(i int) {
	e.mu.Lock()
	e.from = i
	e.mu.Unlock()
}

// take holds a 1xx with the header h the proxy set for it, and reports
// whether it did (or dropped it: a late one of an attempt that is over).
func (e *early) take(code int, h http.Header) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.from != e.attempt:
		return true
	case !e.hold:
		return false
	case len(e.held) < maxHeld:
		e.held = append(e.held, informational{code, maps.Clone(h)})
	}
	return true
}

// answered sends what the attempt that answered had held, as the proxy
// would have sent it, and passes later 1xx through.
func (e *early) answered() {
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.w.Header()
	for _, in := range e.held {
		saved := maps.Clone(h)
		clear(h)
		maps.Copy(h, in.header)
		e.w.WriteHeader(in.code)
		clear(h)
		maps.Copy(h, saved)
	}
	e.held, e.hold = nil, false
}

// failed drops what the attempt that failed had held.
func (e *early) failed() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.held = nil
}

// holdWriter is the writer Proxy gives the reverse proxy: 1xx go through
// its early.
type holdWriter struct {
	http.ResponseWriter
	e *early
}

func (w *holdWriter) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols && w.e.take(code, w.ResponseWriter.Header()) {
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController (which the reverse proxy flushes
// and hijacks through) reach the server's writer.
func (w *holdWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
