package sqlcore

import (
	"context"
	"sync"
	"time"

	"github.com/idemkey/idemkey/internal/sweep"
)

// Sweeper runs a store's Sweep in the background every interval, from
// Start to Stop. The zero Sweeper is ready to Start.
type Sweeper struct {
	once sync.Once
	stop chan struct{}
	done chan struct{}
}

// Start calls sweep every interval (none when interval is 0) until Stop,
// logging a failed sweep with msg and attrs (see sweep.Every). Call it
// once.
func (s *Sweeper) Start(interval time.Duration, sweepFn func(context.Context) (int64, error), msg string, attrs ...any) {
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	if interval <= 0 {
		close(s.done)
		return
	}
	go sweep.Every(interval, s.stop, s.done, sweepFn, msg, attrs...)
}

// Stop ends the background sweeps and waits for one in progress to end.
// It is safe to call more than once, and without Start.
func (s *Sweeper) Stop() {
	s.once.Do(func() {
		if s.stop != nil {
			close(s.stop)
		}
	})
	if s.done != nil {
		<-s.done
	}
}

// SweepBatches runs batch, a statement that deletes up to size lapsed
// rows and says how many it deleted and how many it found, until a batch
// finds fewer than size, ctx ends or a batch fails; it returns how many
// rows were deleted in all.
func SweepBatches(ctx context.Context, size int, batch func(context.Context) (deleted, found int64, err error)) (int64, error) {
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, found, err := batch(ctx)
		total += n
		if err != nil {
			return total, err
		}
		if found < int64(size) {
			return total, nil
		}
	}
}
