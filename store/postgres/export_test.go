package postgres

// WithLockIDs replaces how a transactional claim draws its advisory lock
// id, for tests that force a collision.
func WithLockIDs(f func() int64) Option {
	return func(c *config) error {
		c.lockID = f
		return nil
	}
}
