package middleware

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
)

type valueKey struct{}

// TestHandlerCtxAgreesWithABoundedContext: whether or not its Done was
// asked for first, the handler's context answers Err, Done, Value and
// context.Cause as context.WithDeadline of the request's context would:
// past its deadline, after the request's context ends, and after the
// handler returns.
func TestHandlerCtxAgreesWithABoundedContext(t *testing.T) {
	cause := errors.New("client gone")
	for _, early := range []bool{false, true} { // Done asked before the end
		for _, how := range []string{"deadline", "parent", "returned"} {
			parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), valueKey{}, "v"))
			d := 30 * time.Millisecond
			if how != "deadline" {
				d = time.Hour
			}
			c := &handlerCtx{parent: parent, key: idemkey.Key{Scope: "s", Value: "k"}, hasKey: true, deadline: time.Now().Add(d)}
			var done <-chan struct{}
			if early {
				done = c.Done()
			}
			if c.Err() != nil || c.Value(valueKey{}) != "v" {
				t.Fatalf("%s early %v: live context: Err %v, value %v", how, early, c.Err(), c.Value(valueKey{}))
			}
			if k, ok := idemkey.FromContext(c); !ok || k.Value != "k" {
				t.Fatalf("key %+v %v", k, ok)
			}
			want, wantCause := context.DeadlineExceeded, error(context.DeadlineExceeded)
			switch how {
			case "deadline":
				time.Sleep(2 * d)
			case "parent":
				cancel(cause)
				want, wantCause = context.Canceled, cause
			case "returned":
				c.end()
				want, wantCause = context.Canceled, context.Canceled
			}
			if done != nil {
				select {
				case <-done:
				case <-time.After(5 * time.Second):
					t.Fatalf("%s early %v: Done asked early never closed", how, early)
				}
			}
			if err := c.Err(); err != want {
				t.Errorf("%s early %v: Err %v, want %v", how, early, err, want)
			}
			if got := context.Cause(c); got != wantCause {
				t.Errorf("%s early %v: Cause %v, want %v", how, early, got, wantCause)
			}
			select {
			case <-c.Done():
			default:
				t.Errorf("%s early %v: Done not closed", how, early)
			}
			if c.Value(valueKey{}) != "v" {
				t.Errorf("%s early %v: the parent's value is lost", how, early)
			}
			c.end()
			cancel(nil)
		}
	}
}

// TestHandlerCtxConcurrentUse: Done, Err and Value from many goroutines
// while the handler returns make one bounded context, and every waiter on
// Done is released.
func TestHandlerCtxConcurrentUse(t *testing.T) {
	for range 50 {
		c := &handlerCtx{parent: context.Background(), deadline: time.Now().Add(time.Hour)}
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i%2 == 0 {
					<-c.Done()
				} else {
					for c.Err() == nil {
						c.Value(valueKey{})
					}
				}
			}()
		}
		c.end()
		wg.Wait()
		if c.Err() != context.Canceled {
			t.Fatalf("Err %v", c.Err())
		}
	}
}

// TestHandlerCtxAfterTheHandlerReturned: a context the handler hands on,
// asked only after the handler returned, reports what the bounded context
// would: Canceled when nothing else was over at the return, whatever the
// request's context or the clock did since; the request's cause or the
// deadline when that was over first.
func TestHandlerCtxAfterTheHandlerReturned(t *testing.T) {
	cause := errors.New("client gone")
	for _, c := range []struct {
		name      string
		before    func(cancel context.CancelCauseFunc) // before the handler returns
		after     func(cancel context.CancelCauseFunc) // after it returned
		d         time.Duration
		err, want error
	}{
		{"live", func(context.CancelCauseFunc) {}, func(cancel context.CancelCauseFunc) { cancel(cause) }, time.Hour, context.Canceled, context.Canceled},
		{"live then late", func(context.CancelCauseFunc) {}, func(context.CancelCauseFunc) { time.Sleep(40 * time.Millisecond) }, 20 * time.Millisecond, context.Canceled, context.Canceled},
		{"client gone", func(cancel context.CancelCauseFunc) { cancel(cause) }, func(context.CancelCauseFunc) {}, time.Hour, context.Canceled, cause},
		{"deadline", func(context.CancelCauseFunc) { time.Sleep(40 * time.Millisecond) }, func(context.CancelCauseFunc) {}, 20 * time.Millisecond, context.DeadlineExceeded, context.DeadlineExceeded},
	} {
		parent, cancel := context.WithCancelCause(context.Background())
		hc := &handlerCtx{parent: parent, deadline: time.Now().Add(c.d)}
		c.before(cancel)
		hc.end()
		c.after(cancel)
		if err, got := hc.Err(), context.Cause(hc); err != c.err || got != c.want {
			t.Errorf("%s: Err %v, Cause %v; want %v, %v", c.name, err, got, c.err, c.want)
		}
		cancel(nil)
	}
}
