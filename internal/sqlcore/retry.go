package sqlcore

import (
	"context"
	"errors"
	"time"
)

// Attempts bounds how often one call runs its statement when the answer
// says the row changed under it (a claim racing another, a takeover lost)
// or its connection was lost: each attempt sees a state that settled
// after the last, so a few are plenty.
const Attempts = 5

// GaveUp is the error of a call that ran out of attempts: the last
// connection failure, or the key changing under every attempt.
func GaveUp(lastErr error) error {
	if lastErr != nil {
		return lastErr
	}
	return errors.New("the key kept changing while it was claimed")
}

// Outcome is what one attempt of Retry made of its statement.
type Outcome int8

// The outcomes of an attempt.
const (
	// Done: the attempt's error (nil or not) is the call's.
	Done Outcome = iota
	// Again: the row changed under the statement: run it again.
	Again
	// Lost: the connection was lost before an answer (the error says
	// how): run it again on another.
	Lost
)

// Retry runs attempt up to Attempts times, until it answers Done, and
// returns true and its error; when every attempt asked for another it
// returns false and GaveUp of the last Lost attempt's error. pause, when
// positive, is how long it waits (within ctx) before running again after
// Again.
func Retry(ctx context.Context, pause time.Duration, attempt func() (Outcome, error)) (done bool, err error) {
	var lastErr error
	for range Attempts {
		out, err := attempt()
		switch out {
		case Done:
			return true, err
		case Lost:
			lastErr = err
		case Again:
			if pause > 0 {
				Pause(ctx, pause)
			}
		}
	}
	return false, GaveUp(lastErr)
}

// Pause waits d, or until ctx ends.
func Pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
