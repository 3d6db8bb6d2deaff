// Package sweep runs a store's deletion of expired entries in the
// background, for the SQL stores (store/postgres, store/mysql).
package sweep

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// Every calls sweep every interval until stop is closed, then closes
// done. Each call is bounded by the interval and ended at once by stop. A
// sweep that fails is logged with log/slog's default logger at Warn level
// (msg, then attrs and the error) and tried again at the next tick.
func Every(interval time.Duration, stop <-chan struct{}, done chan<- struct{}, sweep func(context.Context) (int64, error), msg string, attrs ...any) {
	defer close(done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), interval)
		go func() {
			select {
			case <-stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		if _, err := sweep(ctx); err != nil && !errors.Is(err, context.Canceled) {
			slog.Warn(msg, append(attrs, "error", err)...)
		}
		cancel()
	}
}
