package middleware_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// records is a slog.Handler that keeps what it is given.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *records) WithGroup(string) slog.Handler            { return h }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r.Clone())
	h.mu.Unlock()
	return nil
}

// events returns the "event" attribute of every record, and each record
// as text, for checks on what it holds.
func (h *records) events(t *testing.T) (events []string, text []string) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.recs {
		if r.Level != slog.LevelWarn {
			t.Errorf("record %q at %v, want Warn", r.Message, r.Level)
		}
		var b strings.Builder
		b.WriteString(r.Message)
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "event" {
				events = append(events, a.Value.String())
			}
			fmt.Fprintf(&b, " %s=%s", a.Key, a.Value)
			return true
		})
		text = append(text, b.String())
	}
	return events, text
}

// captureDefault makes slog.Default() log into a records handler until the
// test ends. Tests that use it must not run in parallel.
func captureDefault(t *testing.T) *records {
	h := &records{}
	prev := slog.Default()
	slog.SetDefault(slog.New(h))
	t.Cleanup(func() { slog.SetDefault(prev) })
	return h
}

// failing is a memory store whose calls can be made to fail.
type failing struct {
	store.Store
	mu                       sync.Mutex
	claim, complete, release error
}

// fail sets the errors the calls answer (nil: the memory store's answer).
func (s *failing) fail(claim, complete, release error) {
	s.mu.Lock()
	s.claim, s.complete, s.release = claim, complete, release
	s.mu.Unlock()
}

func (s *failing) errs() (claim, complete, release error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claim, s.complete, s.release
}

func (s *failing) Claim(ctx context.Context, key string, c store.Claim) (store.Result, error) {
	if err, _, _ := s.errs(); err != nil {
		return store.Result{}, err
	}
	return s.Store.Claim(ctx, key, c)
}

func (s *failing) Complete(ctx context.Context, key, token string, rec *store.Record, retention time.Duration) error {
	if _, err, _ := s.errs(); err != nil {
		return err
	}
	return s.Store.Complete(ctx, key, token, rec, retention)
}

func (s *failing) Release(ctx context.Context, key, token string) error {
	if _, _, err := s.errs(); err != nil {
		return err
	}
	return s.Store.Release(ctx, key, token)
}

// TestNoObserverLogsWhatAnOperatorMustSee: with no observer, a store
// error, a lost ownership, a failed keep, a failed release and an invalid
// route each reach slog.Default() at Warn, with the key's digest and never
// the key; decisions that are not failures log nothing; and an observer
// the service sets replaces the log.
func TestNoObserverLogsWhatAnOperatorMustSee(t *testing.T) {
	logs := captureDefault(t)
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	st := &failing{Store: mem}
	mw, err := middleware.New(st)
	if err != nil {
		t.Fatal(err)
	}
	ok := mw.Required()(&counter{})
	failed := mw.Required()(&counter{status: http.StatusInternalServerError})
	const key = "secret-key-value"

	serve(ok, post(key+"-0", `{}`)) // a first run, kept: nothing to log
	serve(ok, post(key+"-0", `{}`)) // a replay: nothing to log
	down := fmt.Errorf("%w: connection reset", store.ErrUnavailable)
	st.fail(down, nil, nil)
	serve(ok, post(key+"-1", `{}`))
	st.fail(nil, store.ErrNotOwner, nil)
	serve(ok, post(key+"-2", `{}`))
	st.fail(nil, down, nil)
	serve(ok, post(key+"-3", `{}`))
	st.fail(nil, nil, down)
	serve(failed, post(key+"-4", `{}`))
	st.fail(nil, nil, nil)
	serve(mw.Required(middleware.Deadline(-1))(&counter{}), post(key+"-5", `{}`))

	events, text := logs.events(t)
	want := []string{"store_error", "ownership_lost", "store_error", "store_error", "route_invalid"}
	if strings.Join(events, " ") != strings.Join(want, " ") {
		t.Fatalf("logged %q, want %q", events, want)
	}
	for i, line := range text[:4] {
		if strings.Contains(line, key) {
			t.Errorf("record %d holds the key: %s", i, line)
		}
		if !strings.Contains(line, "key_digest=") {
			t.Errorf("record %d has no key digest: %s", i, line)
		}
	}

	// An observer replaces the log.
	logs.mu.Lock()
	logs.recs = nil
	logs.mu.Unlock()
	var seen atomic.Int64
	observed, err := middleware.New(st, middleware.WithObserver(func(*http.Request, middleware.Event) { seen.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	st.fail(down, nil, nil)
	serve(observed.Required()(&counter{}), post(key+"-6", `{}`))
	st.fail(nil, nil, nil)
	if events, _ := logs.events(t); len(events) != 0 || seen.Load() == 0 {
		t.Fatalf("with an observer: logged %q, observed %d events", events, seen.Load())
	}
}
