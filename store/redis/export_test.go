package redis

import "time"

// SetClock makes s stamp claims with now instead of time.Now: tests that
// move miniredis's clock with FastForward move the store's with it.
func SetClock(s *Store, now func() time.Time) { s.now = now }
