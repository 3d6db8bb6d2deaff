package mysql

// Locks returns the names of a claim's two named locks, for tests that
// check what the server holds.
func (s *Store) Locks(key string, fp [32]byte) (string, string) { return s.locks(key, fp) }

// GaleraOn is galeraOn, for its unit test.
var GaleraOn = galeraOn
