package sqlcore

import (
	"fmt"
	"time"
)

// Defaults of the options every SQL store takes. Each store exports them
// under its own names (postgres.DefaultCallTimeout, ...).
const (
	DefaultCallTimeout   = 300 * time.Millisecond
	DefaultCommitTimeout = time.Second
	DefaultSweepInterval = time.Minute
	DefaultSweepBatch    = 1000
	// DefaultStartTimeout bounds a store's start-up (New, Migrate,
	// Check) when the caller's context has no deadline.
	DefaultStartTimeout = 10 * time.Second
)

// Config holds the options every SQL store takes; a store's own config
// embeds it beside what only that store has (its table's name, its
// transaction options). The setters check a value and report what is
// wrong with it, without a prefix: the store's option.Apply adds it.
type Config struct {
	// CallTimeout is the time budget of every Claim, ClaimTx, Complete,
	// Release and Extend.
	CallTimeout time.Duration
	// CommitTimeout is the time budget of a request transaction's Commit
	// and Rollback.
	CommitTimeout time.Duration
	// SweepInterval is how often expired rows are deleted; 0 is never.
	SweepInterval time.Duration
	// SweepBatch is how many rows one sweeping statement deletes at most.
	SweepBatch int
	// ClientErrorWrites: a kept 4xx commits the handler's writes.
	ClientErrorWrites bool
}

// Defaults returns the Config of a store given no option.
func Defaults() Config {
	return Config{
		CallTimeout:   DefaultCallTimeout,
		CommitTimeout: DefaultCommitTimeout,
		SweepInterval: DefaultSweepInterval,
		SweepBatch:    DefaultSweepBatch,
	}
}

// SetCallTimeout sets CallTimeout; d must be positive.
func (c *Config) SetCallTimeout(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("call timeout %v, want > 0", d)
	}
	c.CallTimeout = d
	return nil
}

// SetCommitTimeout sets CommitTimeout; d must be positive.
func (c *Config) SetCommitTimeout(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("commit timeout %v, want > 0", d)
	}
	c.CommitTimeout = d
	return nil
}

// SetSweepInterval sets SweepInterval; d must not be negative.
func (c *Config) SetSweepInterval(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("sweep interval %v, want >= 0", d)
	}
	c.SweepInterval = d
	return nil
}

// SetSweepBatch sets SweepBatch; n must be positive.
func (c *Config) SetSweepBatch(n int) error {
	if n < 1 {
		return fmt.Errorf("sweep batch %d, want >= 1", n)
	}
	c.SweepBatch = n
	return nil
}

// PlainIdentifier reports whether s is a name a database takes unquoted
// and unfolded: 1 to max lower-case letters, digits or underscores, not
// starting with a digit (max is 63 on PostgreSQL, 64 on MySQL).
func PlainIdentifier(s string, max int) bool {
	if s == "" || len(s) > max || ('0' <= s[0] && s[0] <= '9') {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Micros returns d in whole microseconds, rounded up, or an error naming
// what when d is not positive.
func Micros(what string, d time.Duration) (int64, error) {
	if d <= 0 {
		return 0, fmt.Errorf("%s %v, want > 0", what, d)
	}
	return int64((d + time.Microsecond - 1) / time.Microsecond), nil
}
