package middleware_test

import (
	"errors"
	"net/http"
	"strconv"
	"testing"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/scope"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// One caller's flood of fresh keys must never cost another caller a kept
// answer: a full store refuses new keys with 503 (reported as a store
// error matching store.ErrFull), and alice's retry still gets her replay.
func TestFloodOfFreshKeysNeverEvictsAKeptAnswer(t *testing.T) {
	st, err := memory.New(memory.WithMaxRecords(100))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var full int
	mw, _ := middleware.New(st, middleware.WithObserver(func(_ *http.Request, e middleware.Event) {
		if e.Kind == middleware.EventStoreFull && errors.Is(e.Err, store.ErrFull) {
			full++
		}
	}))
	h := &counter{}
	as := func(user string, r *http.Request) *http.Request {
		return r.WithContext(scope.NewContext(r.Context(), user))
	}
	serve(mw.Required()(h), as("alice", post("pay-1", `{"amount":10}`)))
	refused := 0
	for i := range 1000 {
		w := serve(mw.Required()(h), as("mallory", post("flood-"+strconv.Itoa(i), `{}`)))
		if w.Code == http.StatusServiceUnavailable {
			refused++
		}
	}
	if refused == 0 || full != refused {
		t.Fatalf("flood of 1000 keys on a store of 100: %d refused, %d reported full", refused, full)
	}
	runs := h.runs.Load()
	w := serve(mw.Required()(h), as("alice", post("pay-1", `{"amount":10}`)))
	if w.Header().Get(idemkey.HeaderReplayed) != "true" || h.runs.Load() != runs {
		t.Fatalf("alice's retry after the flood: %d replayed %q; her payment ran again", w.Code, w.Header().Get(idemkey.HeaderReplayed))
	}
}
