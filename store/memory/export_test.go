package memory

// waiting reports whether a repeat waits on key's claim (Wait), for tests
// that must not end a claim before its waiter is parked.
func (s *Store) waiting(key string) int {
	d := digestOf(key)
	sh := s.c.shard(d)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.waiters[d]; ok {
		return 1
	}
	return 0
}
