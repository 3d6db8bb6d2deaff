package sweep

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestEvery: sweeps run every interval, a failure does not stop them,
// and closing stop ends a sweep in progress and the loop.
func TestEvery(t *testing.T) {
	stop, done := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	blocked := make(chan struct{})
	go Every(5*time.Millisecond, stop, done, func(ctx context.Context) (int64, error) {
		switch calls.Add(1) {
		case 1:
			return 0, errors.New("the first sweep fails")
		case 3:
			close(blocked)
			<-ctx.Done() // held until stop ends it
			return 0, ctx.Err()
		}
		return 1, nil
	}, "sweep failed")
	select {
	case <-blocked:
	case <-time.After(5 * time.Second):
		t.Fatalf("after %d sweeps, the third never started", calls.Load())
	}
	close(stop)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("closing stop did not end the sweep in progress and the loop")
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("%d sweeps, want 3", n)
	}
}
