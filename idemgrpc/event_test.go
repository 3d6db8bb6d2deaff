package idemgrpc_test

import (
	"testing"

	"github.com/idemkey/idemkey/idemgrpc"
	"github.com/idemkey/idemkey/internal/eventname"
)

// TestEventNamesMatchHTTP: every decision the interceptor reports has the
// name internal/eventname gives it, the one package middleware gives the
// same decision on HTTP (its TestEventNames), so that one dashboard reads
// both front doors.
func TestEventNamesMatchHTTP(t *testing.T) {
	for k, want := range map[idemgrpc.EventKind]string{
		idemgrpc.EventFirstAttempt:  eventname.FirstAttempt,
		idemgrpc.EventReplay:        eventname.Replay,
		idemgrpc.EventInFlight:      eventname.InFlight,
		idemgrpc.EventKeyReused:     eventname.KeyReused,
		idemgrpc.EventKeyMissing:    eventname.KeyMissing,
		idemgrpc.EventKeyInvalid:    eventname.KeyInvalid,
		idemgrpc.EventKept:          eventname.Kept,
		idemgrpc.EventReleased:      eventname.Released,
		idemgrpc.EventOwnershipLost: eventname.OwnershipLost,
		idemgrpc.EventStoreError:    eventname.StoreError,
		idemgrpc.EventScopeMissing:  eventname.ScopeMissing,
		idemgrpc.EventKind(0):       eventname.Invalid,
		idemgrpc.EventKind(200):     eventname.Invalid,
	} {
		if k.String() != want {
			t.Errorf("kind %d: %q, want %q", k, k.String(), want)
		}
	}
}
