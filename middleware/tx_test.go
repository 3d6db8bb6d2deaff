package middleware_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// txStore is a store.TxStore over the memory store: a transaction holds
// the handler's business writes until Commit, which keeps the record
// (fenced by the owner token) and applies them together.
type txStore struct {
	store.Store
	mu        sync.Mutex
	committed []string // business writes that committed
	commitErr error    // what Commit answers (after rolling back) when set
	commits   int
	rollbacks int
	open      *fakeTx // the transaction of the last claim
}

type fakeTx struct {
	s       *txStore
	key     string
	token   string
	pending []string
	done    bool
}

type txKey struct{}

func newTxStore(t *testing.T) *txStore {
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	return &txStore{Store: mem}
}

func (s *txStore) ClaimTx(ctx context.Context, key string, c store.Claim) (store.Result, store.Tx, error) {
	res, err := s.Claim(ctx, key, c)
	if err != nil || (res.State != store.Claimed && res.State != store.Mine) {
		return res, nil, err
	}
	tx := &fakeTx{s: s, key: key, token: c.Token}
	s.mu.Lock()
	s.open = tx
	s.mu.Unlock()
	return res, tx, nil
}

// Begin opens a transaction with no claim (key ""): Commit applies its
// writes and keeps nothing.
func (s *txStore) Begin(ctx context.Context) (store.Tx, error) {
	return &fakeTx{s: s}, nil
}

func (tx *fakeTx) NewContext(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// write is a business write through the request's transaction.
func write(ctx context.Context, v string) error {
	tx, _ := ctx.Value(txKey{}).(*fakeTx)
	if tx == nil {
		return errors.New("no transaction in the context")
	}
	tx.s.mu.Lock()
	defer tx.s.mu.Unlock()
	if tx.done {
		return errors.New("transaction is over")
	}
	tx.pending = append(tx.pending, v)
	return nil
}

func (tx *fakeTx) Commit(ctx context.Context, rec *store.Record, retention time.Duration) error {
	s := tx.s
	s.mu.Lock()
	defer s.mu.Unlock()
	tx.done = true
	s.commits++
	if s.commitErr != nil {
		if tx.key != "" {
			s.Store.Release(ctx, tx.key, tx.token)
		}
		return s.commitErr
	}
	if tx.key == "" {
		s.committed = append(s.committed, tx.pending...)
		return nil
	}
	if err := s.Store.Complete(ctx, tx.key, tx.token, rec, retention); err != nil {
		return err
	}
	s.committed = append(s.committed, tx.pending...)
	return nil
}

func (tx *fakeTx) Rollback(ctx context.Context) error {
	s := tx.s
	s.mu.Lock()
	defer s.mu.Unlock()
	tx.done = true
	s.rollbacks++
	if tx.key == "" {
		return nil
	}
	return s.Store.Release(ctx, tx.key, tx.token)
}

func (s *txStore) state() (committed []string, commits, rollbacks int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.committed), s.commits, s.rollbacks
}

// orderWriter notes whether the store had committed when the response's
// status went out.
type orderWriter struct {
	*httptest.ResponseRecorder
	s              *txStore
	committedFirst bool
}

func (w *orderWriter) WriteHeader(code int) {
	_, commits, _ := w.s.state()
	w.committedFirst = commits > 0
	w.ResponseRecorder.WriteHeader(code)
}

func payment(w http.ResponseWriter, r *http.Request) {
	if err := write(r.Context(), "payment"); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Location", "/payments/1")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"id":1}`)
}

func TestTransactionCommitsBeforeTheResponse(t *testing.T) {
	s := newTxStore(t)
	mw, err := middleware.New(s)
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Required()(http.HandlerFunc(payment))
	w := &orderWriter{ResponseRecorder: httptest.NewRecorder(), s: s}
	h.ServeHTTP(w, post("pay-1", `{}`))
	if w.Code != http.StatusCreated || !w.committedFirst {
		t.Fatalf("first: %d, committed before the status went out: %v", w.Code, w.committedFirst)
	}
	again := serve(h, post("pay-1", `{}`))
	committed, commits, rollbacks := s.state()
	if again.Header().Get(idemkey.HeaderReplayed) != "true" || again.Body.String() != `{"id":1}` {
		t.Fatalf("repeat: %d %q", again.Code, again.Body)
	}
	if !slices.Equal(committed, []string{"payment"}) || commits != 1 || rollbacks != 0 {
		t.Fatalf("committed %v, %d commits, %d rollbacks; want one payment", committed, commits, rollbacks)
	}
}

// A commit that fails, or whose outcome is unknown, must never be answered
// with the handler's response: the client gets 503, and nothing the handler
// set on the response leaks into it.
func TestFailedCommitAnswers503(t *testing.T) {
	for _, commitErr := range []error{store.ErrNotOwner, errors.Join(store.ErrUnavailable, errors.New("connection reset during COMMIT"))} {
		t.Run(commitErr.Error(), func(t *testing.T) {
			s := newTxStore(t)
			s.commitErr = commitErr
			events := &eventLog{}
			mw, _ := middleware.New(s, middleware.WithObserver(events.observe))
			h := mw.Required()(http.HandlerFunc(payment))
			w := serve(h, post("pay-1", `{}`))
			wantProblem(t, w, http.StatusServiceUnavailable, idemkey.CodeUnavailable)
			if w.Header().Get("Location") != "" {
				t.Errorf("503 carries the handler's Location %q", w.Header().Get("Location"))
			}
			committed, _, _ := s.state()
			if len(committed) != 0 {
				t.Fatalf("committed %v", committed)
			}
			// The key is free again: the retry runs, and this time commits.
			s.mu.Lock()
			s.commitErr = nil
			s.mu.Unlock()
			if w := serve(h, post("pay-1", `{}`)); w.Code != http.StatusCreated || w.Header().Get(idemkey.HeaderReplayed) != "" {
				t.Fatalf("retry: %d replayed %q", w.Code, w.Header().Get(idemkey.HeaderReplayed))
			}
			if committed, _, _ := s.state(); !slices.Equal(committed, []string{"payment"}) {
				t.Fatalf("after the retry: committed %v", committed)
			}
		})
	}
}

func TestServerErrorAndPanicRollBack(t *testing.T) {
	s := newTxStore(t)
	mw, _ := middleware.New(s)
	fail := true
	h := mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		write(r.Context(), "payment")
		if fail {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		panic("boom")
	}))
	if w := serve(h, post("k", `{}`)); w.Code != http.StatusBadGateway {
		t.Fatalf("5xx: %d", w.Code)
	}
	fail = false
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("panic %v, want the handler's", r)
			}
		}()
		serve(h, post("k", `{}`))
	}()
	committed, commits, rollbacks := s.state()
	if len(committed) != 0 || commits != 0 || rollbacks != 2 {
		t.Fatalf("committed %v, %d commits, %d rollbacks; want 2 rollbacks and nothing committed", committed, commits, rollbacks)
	}
}

// On a transactional route a flush is the commit: the record (status and
// headers, body omitted) commits with the handler's writes before the first
// byte goes out, and the transaction is over for the rest of the stream.
func TestFlushCommitsTheTransaction(t *testing.T) {
	s := newTxStore(t)
	mw, _ := middleware.New(s)
	var afterFlush error
	h := mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		write(r.Context(), "export")
		w.Header().Set("Content-Type", "text/csv")
		io.WriteString(w, "a,b\n")
		http.NewResponseController(w).Flush()
		afterFlush = write(r.Context(), "late")
		io.WriteString(w, "1,2\n")
	}))
	w := &orderWriter{ResponseRecorder: httptest.NewRecorder(), s: s}
	h.ServeHTTP(w, post("k", `{}`))
	if w.Code != http.StatusOK || w.Body.String() != "a,b\n1,2\n" || !w.committedFirst {
		t.Fatalf("stream: %d %q, committed first %v", w.Code, w.Body, w.committedFirst)
	}
	if afterFlush == nil {
		t.Error("a write through the transaction after the flush succeeded")
	}
	if committed, commits, _ := s.state(); !slices.Equal(committed, []string{"export"}) || commits != 1 {
		t.Fatalf("committed %v in %d commits", committed, commits)
	}
	again := serve(h, post("k", `{}`))
	if again.Header().Get(idemkey.HeaderBodyOmitted) != "true" || again.Header().Get("Content-Type") != "text/csv" || again.Body.Len() != 0 {
		t.Fatalf("replay of the stream: %d %v %q", again.Code, again.Header(), again.Body)
	}
}

// A flush whose commit fails answers 503 instead of the stream: nothing of
// the handler's response goes out, and its later writes fail.
func TestFlushWhoseCommitFailsAnswers503(t *testing.T) {
	s := newTxStore(t)
	s.commitErr = errors.Join(store.ErrUnavailable, errors.New("lost"))
	mw, _ := middleware.New(s)
	var writeErr error
	h := mw.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		write(r.Context(), "export")
		w.Header().Set("Content-Type", "text/csv")
		io.WriteString(w, "a,b\n")
		http.NewResponseController(w).Flush()
		_, writeErr = io.WriteString(w, "1,2\n")
	}))
	w := serve(h, post("k", `{}`))
	wantProblem(t, w, http.StatusServiceUnavailable, idemkey.CodeUnavailable)
	if strings.Contains(w.Body.String(), "a,b") || writeErr == nil {
		t.Fatalf("body %q, later write error %v: the stream must not go out", w.Body, writeErr)
	}
}

// A covered request without a key, on a route where the key is optional,
// runs in a transaction of its own on a transactional store: the handler's
// code is the same with a key and without one. Its writes commit before the
// response goes out and roll back after a 5xx; nothing is kept.
func TestKeylessRequestRunsInATransaction(t *testing.T) {
	s := newTxStore(t)
	mw, err := middleware.New(s)
	if err != nil {
		t.Fatal(err)
	}
	fail := false
	h := mw.Optional()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := write(r.Context(), "payment"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if fail {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	ow := &orderWriter{ResponseRecorder: httptest.NewRecorder(), s: s}
	h.ServeHTTP(ow, httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`)))
	if ow.Code != http.StatusCreated {
		t.Fatalf("status %d, want 201 (a keyless request whose handler found no transaction answers 500)", ow.Code)
	}
	if !ow.committedFirst {
		t.Error("the response went out before the transaction committed")
	}
	if committed, commits, _ := s.state(); !slices.Equal(committed, []string{"payment"}) || commits != 1 {
		t.Fatalf("committed %q in %d commits, want the payment in 1", committed, commits)
	}

	fail = true
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`)))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want the handler's 503", rec.Code)
	}
	if committed, _, rollbacks := s.state(); len(committed) != 1 || rollbacks != 1 {
		t.Fatalf("after a 5xx: committed %q, %d rollbacks; want the first payment only and 1 rollback", committed, rollbacks)
	}
	if n := rec.Header().Get(idemkey.HeaderReplayed); n != "" {
		t.Errorf("a keyless request was answered as a replay")
	}
}

// TestFailOpenRefusedWithATransactionalStore: a transactional store's
// handler never runs without its transaction, so New refuses WithFailOpen
// with one (a full pool of such a store once ran a key twice this way).
func TestFailOpenRefusedWithATransactionalStore(t *testing.T) {
	_, err := middleware.New(newTxStore(t), middleware.WithFailOpen())
	if err == nil || !strings.Contains(err.Error(), "WithFailOpen") || !strings.Contains(err.Error(), "transaction") {
		t.Fatalf("New: %v, want an error naming WithFailOpen and the transaction", err)
	}
	if _, err := middleware.New(newTxStore(t)); err != nil {
		t.Fatalf("New without WithFailOpen: %v", err)
	}
}
