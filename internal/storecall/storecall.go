// Package storecall is how a front door (package middleware on HTTP,
// idemgrpc on gRPC) bounds its calls to the store: each call's own time
// budget, the calls that settle a key detached from the caller's
// cancellation (a client that hangs up does not stop its record from being
// kept), and the release, in the background and bounded, of a claim whose
// reply was lost to a store failure.
package storecall

import (
	"context"
	"errors"
	"time"

	"github.com/idemkey/idemkey/store"
)

// Budget adds the bound timeout to ctx, when it is positive; 0 leaves ctx
// as it is (the store's own budget alone), with a cancel that does
// nothing.
func Budget(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout > 0 {
		return context.WithTimeout(ctx, timeout)
	}
	return ctx, func() {}
}

// Detached returns a context for keeping or releasing: ctx's values
// without its cancellation or deadline, bounded by timeout as Budget
// bounds it.
func Detached(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	return Budget(context.WithoutCancel(ctx), timeout)
}

// Unbound is what context.WithoutCancel returns, as a value a caller can
// hold in a struct it has allocated anyway: Parent's values, with no
// deadline and no cancellation (a nil Done, which no child waits on).
type Unbound struct{ Parent context.Context }

var _ context.Context = (*Unbound)(nil)

func (*Unbound) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*Unbound) Done() <-chan struct{}       { return nil }
func (*Unbound) Err() error                  { return nil }
func (u *Unbound) Value(key any) any         { return u.Parent.Value(key) }
func (u *Unbound) String() string            { return "idemkey: detached from the request" }

// Abandoned releases, in the background, claims whose reply was lost to a
// store failure, in case they landed: the handler never ran, so freeing
// them is always safe. At most as many run at once as NewAbandoned says:
// during an outage the rest are left to lapse at the end of their life.
type Abandoned struct {
	slots chan struct{}
}

// NewAbandoned returns an Abandoned that runs at most n releases at once.
func NewAbandoned(n int) *Abandoned {
	return &Abandoned{slots: make(chan struct{}, n)}
}

// Release frees skey's claim under token on s, in the background, under
// Detached(ctx, timeout), unless n releases are under way already. A
// failure other than the store still being down (store.ErrUnavailable) or
// the claim no longer being this one (store.ErrNotOwner) is given to
// report, with how long the call took, from the releasing goroutine;
// report may be nil.
func (a *Abandoned) Release(ctx context.Context, s store.Store, timeout time.Duration, skey, token string, report func(err error, latency time.Duration)) {
	select {
	case a.slots <- struct{}{}:
	default:
		return
	}
	ctx = context.WithoutCancel(ctx)
	go func() {
		defer func() { <-a.slots }()
		ctx, cancel := Budget(ctx, timeout)
		defer cancel()
		t := time.Now()
		err := s.Release(ctx, skey, token)
		if err != nil && report != nil && !errors.Is(err, store.ErrUnavailable) && !errors.Is(err, store.ErrNotOwner) {
			report(err, time.Since(t))
		}
	}()
}
