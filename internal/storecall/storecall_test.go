package storecall

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// releasing is a store whose Release answers err, after gate opens.
type releasing struct {
	store.Store
	gate  chan struct{}
	err   error
	mu    sync.Mutex
	calls int
	ctxOK bool
}

func (s *releasing) Release(ctx context.Context, key, token string) error {
	<-s.gate
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	_, hasDeadline := ctx.Deadline()
	s.ctxOK = ctx.Err() == nil && hasDeadline
	return s.err
}

// TestAbandoned: a release runs detached from the caller's cancellation,
// under the budget; a failure is reported unless the store is down or the
// claim is another's; no more than n run at once.
func TestAbandoned(t *testing.T) {
	for _, tc := range []struct {
		err    error
		report bool
	}{
		{nil, false},
		{store.ErrUnavailable, false},
		{store.ErrNotOwner, false},
		{errors.New("boom"), true},
	} {
		s := &releasing{gate: make(chan struct{}), err: tc.err}
		a := NewAbandoned(1)
		ctx, cancel := context.WithCancel(context.Background())
		reported := make(chan error, 2)
		report := func(err error, _ time.Duration) { reported <- err }
		a.Release(ctx, s, time.Minute, "k", "t", report)
		a.Release(ctx, s, time.Minute, "k2", "t", report) // over the bound: dropped
		cancel()
		close(s.gate)
		deadline := time.Now().Add(5 * time.Second)
		for len(a.slots) != 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		s.mu.Lock()
		calls, ctxOK := s.calls, s.ctxOK
		s.mu.Unlock()
		if calls != 1 || !ctxOK {
			t.Errorf("%v: %d releases, context live with a deadline %v; want 1, true", tc.err, calls, ctxOK)
		}
		select {
		case err := <-reported:
			if !tc.report || err != tc.err {
				t.Errorf("%v: reported %v", tc.err, err)
			}
		default:
			if tc.report {
				t.Errorf("%v: not reported", tc.err)
			}
		}
	}
}
