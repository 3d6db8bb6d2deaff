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

// Waiting returns how many repeats wait on key (Wait) in s, registered
// with its subscription.
func Waiting(s *Store, key string) int {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	if e := s.hub.keys[s.name(key)]; e != nil {
		return e.n
	}
	return 0
}
