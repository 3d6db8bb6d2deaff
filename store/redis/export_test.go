package redis

import "time"

// SetClock makes s stamp claims with now instead of time.Now: tests that
// move miniredis's clock with FastForward move the store's with it.
func SetClock(s *Store, now func() time.Time) { s.now = now }

// DecodeValue and StateOf read a stored value as Inspect and Stats do.
var (
	DecodeValue = decodeValue
	StateOf     = stateOf
)
