// Package keylife holds how long a key lives by default, the same on every
// front door (package middleware on HTTP, idemgrpc on gRPC), so that a
// service with both gives its keys the same lives on each.
package keylife

import "time"

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
