package postgres

import "time"

// Locks returns the advisory lock ids a claim of key with fingerprint fp
// holds in its transaction, for tests that look for them in pg_locks.
func (s *Store) Locks(key string, fp [32]byte) (int64, int64) { return s.locks(key, fp) }

// ShiftLife moves the life a request's transaction fences its keep with by
// d, for tests of the fence on the server's clock.
func (s *Store) ShiftLife(tx any, d time.Duration) { tx.(*requestTx).life += d }

// StopWatchdog stops the watchdog of a request's transaction, for tests of
// what the server alone does at the claim's life.
func (s *Store) StopWatchdog(tx any) { tx.(*requestTx).timer.Stop() }
