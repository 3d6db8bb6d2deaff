package middleware_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// countingStore counts the calls made to the store it wraps, and can be
// told to fail them.
type countingStore struct {
	store.Store
	claims, completes, releases atomic.Int64

	mu          sync.Mutex
	claimErr    error
	completeErr error
}

func (s *countingStore) Claim(ctx context.Context, key string, c store.Claim) (store.Result, error) {
	s.claims.Add(1)
	s.mu.Lock()
	err := s.claimErr
	s.mu.Unlock()
	if err != nil {
		return store.Result{}, err
	}
	return s.Store.Claim(ctx, key, c)
}

func (s *countingStore) Complete(ctx context.Context, key, token string, rec *store.Record, retention time.Duration) error {
	s.completes.Add(1)
	s.mu.Lock()
	err := s.completeErr
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.Store.Complete(ctx, key, token, rec, retention)
}

func (s *countingStore) Release(ctx context.Context, key, token string) error {
	s.releases.Add(1)
	return s.Store.Release(ctx, key, token)
}

func (s *countingStore) calls() int64 {
	return s.claims.Load() + s.completes.Load() + s.releases.Load()
}

func (s *countingStore) failClaims(err error) {
	s.mu.Lock()
	s.claimErr = err
	s.mu.Unlock()
}

func (s *countingStore) failCompletes(err error) {
	s.mu.Lock()
	s.completeErr = err
	s.mu.Unlock()
}

var errStoreDown = errors.New("store down")

// eventLog records the observer's events.
type eventLog struct {
	mu     sync.Mutex
	events []middleware.Event
}

func (l *eventLog) observe(_ *http.Request, e middleware.Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *eventLog) kinds() []middleware.EventKind {
	l.mu.Lock()
	defer l.mu.Unlock()
	var k []middleware.EventKind
	for _, e := range l.events {
		k = append(k, e.Kind)
	}
	return k
}

func (l *eventLog) has(kind middleware.EventKind) bool {
	for _, k := range l.kinds() {
		if k == kind {
			return true
		}
	}
	return false
}

type fixture struct {
	t      *testing.T
	mw     *middleware.Middleware
	store  *countingStore
	events *eventLog
}

func newFixture(t *testing.T, opts ...middleware.Option) *fixture {
	t.Helper()
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	f := &fixture{t: t, store: &countingStore{Store: mem}, events: &eventLog{}}
	opts = append([]middleware.Option{middleware.WithObserver(f.events.observe)}, opts...)
	mw, err := middleware.New(f.store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	f.mw = mw
	return f
}

// post builds a POST with a JSON body and, when key is not "", a key.
func post(key, body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	return r
}

// serve runs one request through h and returns the recorded response.
func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func readAll(t *testing.T, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// counter is a handler that counts its runs and answers with status and a
// body that names the run.
type counter struct {
	runs   atomic.Int64
	status int
}

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := c.runs.Add(1)
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Run", itoa(n))
	status := c.status
	if status == 0 {
		status = http.StatusCreated
	}
	w.WriteHeader(status)
	io.WriteString(w, `{"run":`+itoa(n)+`,"echo":`+string(body)+`}`)
}

func itoa(n int64) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}
