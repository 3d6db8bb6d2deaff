package idemgrpc_test

import (
	"testing"

	"github.com/idemkey/idemkey/idemgrpc"
	"github.com/idemkey/idemkey/middleware"
)

// TestEventNamesMatchHTTP: every decision the interceptor reports has the
// name package middleware gives the same decision on HTTP, so that one
// dashboard reads both front doors.
func TestEventNamesMatchHTTP(t *testing.T) {
	for _, k := range []struct {
		grpc idemgrpc.EventKind
		http middleware.EventKind
	}{
		{idemgrpc.EventFirstAttempt, middleware.EventFirstAttempt},
		{idemgrpc.EventReplay, middleware.EventReplay},
		{idemgrpc.EventInFlight, middleware.EventInFlight},
		{idemgrpc.EventKeyReused, middleware.EventKeyReused},
		{idemgrpc.EventKeyMissing, middleware.EventKeyMissing},
		{idemgrpc.EventKeyInvalid, middleware.EventKeyInvalid},
		{idemgrpc.EventKept, middleware.EventKept},
		{idemgrpc.EventReleased, middleware.EventReleased},
		{idemgrpc.EventOwnershipLost, middleware.EventOwnershipLost},
		{idemgrpc.EventStoreError, middleware.EventStoreError},
		{idemgrpc.EventScopeMissing, middleware.EventScopeMissing},
		{idemgrpc.EventKind(0), middleware.EventKind(0)},
		{idemgrpc.EventKind(200), middleware.EventKind(200)},
	} {
		if k.grpc.String() != k.http.String() {
			t.Errorf("gRPC %q, HTTP %q", k.grpc, k.http)
		}
	}
}
