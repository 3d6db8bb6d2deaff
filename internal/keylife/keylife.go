// Package keylife holds how long a key lives by default, the same on every
// front door (package middleware on HTTP, idemgrpc on gRPC), so that a
// service with both gives its keys the same lives on each.
package keylife

import (
	"fmt"
	"time"
)

const (
	// DefaultDeadline bounds a handler's run where its route or method
	// sets no deadline of its own: 30 seconds.
	DefaultDeadline = 30 * time.Second

	// DefaultRetention is how long a kept answer is replayed: 24 hours.
	DefaultRetention = 24 * time.Hour

	// ClaimMargin is added to a handler's deadline to give a claim's life:
	// a handler that never finishes lets go of its key this long after its
	// deadline. 5 seconds.
	ClaimMargin = 5 * time.Second
)

// Lives is the part of a front door's configuration that says how long its
// keys live and how long a store call may take, checked the same way by
// package middleware's and idemgrpc's options (WithDeadline,
// WithRetention, WithStoreTimeout), whose configurations embed it. Its
// zero value is unset: Fill gives what no option set its default.
type Lives struct {
	// Deadline bounds a handler's run where its route or method sets none;
	// the claim lives it plus ClaimMargin. Default: DefaultDeadline.
	Deadline time.Duration
	// Retention is how long a kept answer is replayed. Default:
	// DefaultRetention.
	Retention time.Duration
	// StoreTimeout bounds each store call, on top of the store's own
	// budget. Default: 0, the store's budget alone.
	StoreTimeout time.Duration
}

// SetDeadline sets Deadline, which must be positive.
func (l *Lives) SetDeadline(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("WithDeadline(%v): the deadline must be positive", d)
	}
	l.Deadline = d
	return nil
}

// SetRetention sets Retention, which must be positive.
func (l *Lives) SetRetention(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("WithRetention(%v): the retention must be positive", d)
	}
	l.Retention = d
	return nil
}

// SetStoreTimeout sets StoreTimeout, which must not be negative.
func (l *Lives) SetStoreTimeout(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("WithStoreTimeout(%v): the timeout must not be negative", d)
	}
	l.StoreTimeout = d
	return nil
}

// Fill sets the defaults of what no option set.
func (l *Lives) Fill() {
	if l.Deadline == 0 {
		l.Deadline = DefaultDeadline
	}
	if l.Retention == 0 {
		l.Retention = DefaultRetention
	}
}
