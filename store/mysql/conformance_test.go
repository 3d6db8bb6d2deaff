package mysql_test

import (
	"testing"

	"github.com/idemkey/idemkey/store/storetest"
)

// TestConformance runs the store suite in plain mode on the shared
// server, on a table of its own, in real time.
func TestConformance(t *testing.T) {
	st, _ := newStore(t, sharedDB(t))
	storetest.Run(t, func(*testing.T) storetest.Harness {
		return storetest.Harness{Store: st}
	})
}
