package middleware

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// runContext must behave as context.WithDeadline's context does. Each case
// drives both the same way and compares what they say.

type ctxKey struct{}

// state is what a context tells about itself.
type state struct {
	err, cause error
	done       bool
	deadline   time.Time
	value      any
}

func stateOf(ctx context.Context) state {
	s := state{err: ctx.Err(), cause: context.Cause(ctx), value: ctx.Value(ctxKey{})}
	s.deadline, _ = ctx.Deadline()
	select {
	case <-ctx.Done():
		s.done = true
	default:
	}
	return s
}

// pair makes a runContext and the WithDeadline context it stands for, on
// the same parent and deadline.
func pair(parent context.Context, d time.Duration) (rc *runContext, std context.Context, stdCancel context.CancelFunc) {
	deadline := time.Now().Add(d)
	rc = new(runContext)
	rc.init(parent, deadline)
	std, stdCancel = context.WithDeadline(parent, deadline)
	return rc, std, stdCancel
}

func same(t *testing.T, what string, rc *runContext, std context.Context) {
	t.Helper()
	got, want := stateOf(rc), stateOf(std)
	if got != want {
		t.Errorf("%s: runContext %+v, WithDeadline %+v", what, got, want)
	}
}

func TestRunContextBehavesAsWithDeadline(t *testing.T) {
	errGone := errors.New("client gone")
	cases := map[string]func(t *testing.T, parent context.Context, cancelParent context.CancelCauseFunc){
		"alive, untouched": func(t *testing.T, parent context.Context, _ context.CancelCauseFunc) {
			rc, std, cancel := pair(parent, time.Minute)
			defer cancel()
			if got := rc.Value(ctxKey{}); got != "v" {
				t.Errorf("Value = %v", got)
			}
			if rc.Err() != nil || rc.made.Load() != nil {
				t.Errorf("Err %v, made %v: nothing should make the context yet", rc.Err(), rc.made.Load())
			}
			same(t, "alive", rc, std)
			rc.stop()
			cancel()
			same(t, "stopped", rc, std)
		},
		"stopped before anything asked": func(t *testing.T, parent context.Context, cancelParent context.CancelCauseFunc) {
			rc, std, cancel := pair(parent, time.Minute)
			rc.stop()
			cancel()
			// The parent ending afterwards changes neither.
			cancelParent(errGone)
			same(t, "stopped, then parent ended", rc, std)
		},
		"deadline passed untouched": func(t *testing.T, parent context.Context, _ context.CancelCauseFunc) {
			rc, std, cancel := pair(parent, time.Second)
			defer cancel()
			time.Sleep(2 * time.Second)
			synctest.Wait()
			if !errors.Is(rc.Err(), context.DeadlineExceeded) {
				t.Errorf("Err = %v after the deadline", rc.Err())
			}
			same(t, "expired", rc, std)
			rc.stop()
			cancel()
			same(t, "expired, then stopped", rc, std)
		},
		"deadline passed while waiting on Done": func(t *testing.T, parent context.Context, _ context.CancelCauseFunc) {
			rc, std, cancel := pair(parent, time.Second)
			defer cancel()
			select {
			case <-rc.Done():
			case <-time.After(time.Hour):
				t.Fatal("Done never closed")
			}
			synctest.Wait()
			same(t, "expired while waited on", rc, std)
			rc.stop()
		},
		"parent ended with a cause": func(t *testing.T, parent context.Context, cancelParent context.CancelCauseFunc) {
			rc, std, cancel := pair(parent, time.Minute)
			defer cancel()
			cancelParent(errGone)
			synctest.Wait()
			same(t, "parent ended", rc, std)
			if got := context.Cause(rc); got != errGone {
				t.Errorf("Cause = %v, want the parent's", got)
			}
			rc.stop()
			cancel()
			same(t, "parent ended, then stopped", rc, std)
		},
		"parent ended, untouched until stopped": func(t *testing.T, parent context.Context, cancelParent context.CancelCauseFunc) {
			rc, std, cancel := pair(parent, time.Minute)
			cancelParent(errGone)
			synctest.Wait()
			rc.stop()
			cancel()
			same(t, "parent ended, then stopped", rc, std)
		},
		"derived contexts follow it": func(t *testing.T, parent context.Context, _ context.CancelCauseFunc) {
			rc, _, cancel := pair(parent, time.Minute)
			defer cancel()
			child, childCancel := context.WithCancel(rc)
			defer childCancel()
			called := make(chan struct{})
			context.AfterFunc(rc, func() { close(called) })
			if child.Err() != nil {
				t.Fatal("child ended early")
			}
			if d, _ := child.Deadline(); !d.Equal(rc.deadline) {
				t.Errorf("child deadline %v, want %v", d, rc.deadline)
			}
			rc.stop()
			synctest.Wait()
			if !errors.Is(child.Err(), context.Canceled) {
				t.Errorf("child Err = %v after stop", child.Err())
			}
			select {
			case <-called:
			default:
				t.Error("AfterFunc did not run on stop")
			}
		},
		"sooner parent deadline": func(t *testing.T, parent context.Context, _ context.CancelCauseFunc) {
			soon, soonCancel := context.WithTimeout(parent, time.Second)
			defer soonCancel()
			rc, std, cancel := pair(soon, time.Minute)
			defer cancel()
			same(t, "sooner parent", rc, std)
			time.Sleep(2 * time.Second)
			synctest.Wait()
			same(t, "sooner parent expired", rc, std)
			rc.stop()
		},
	}
	for name, run := range cases {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				parent, cancelParent := context.WithCancelCause(context.WithValue(context.Background(), ctxKey{}, "v"))
				defer cancelParent(nil)
				run(t, parent, cancelParent)
			})
		})
	}
}
