package main

import (
	"testing"

	"github.com/idemkey/idemkey/examples/internal/paymentstest"
)

// TestEndToEnd runs the service on echo, in-process on a free port, with
// the in-memory store, against real Redis and against PostgreSQL: the
// suite chi-app and nethttp-app pass; see package paymentstest.
func TestEndToEnd(t *testing.T) {
	paymentstest.Run(t, routes)
}
