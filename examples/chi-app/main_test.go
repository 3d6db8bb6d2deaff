package main

import (
	"testing"

	"github.com/idemkey/idemkey/examples/internal/paymentstest"
)

// TestEndToEnd runs the service on chi, in-process on a free port, with the
// in-memory store and against real Redis; see package paymentstest.
func TestEndToEnd(t *testing.T) {
	paymentstest.Run(t, routes)
}
