package memory

import (
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store/storetest"
)

// fakeClock is a clock that moves only when told to.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		clock := newFakeClock()
		s := mustNew(t, WithClock(clock.Now))
		return storetest.Harness{Store: s, Advance: clock.Advance}
	})
}

// TestConformanceShared runs the suite against one store for every subtest,
// as a suite against a shared server would.
func TestConformanceShared(t *testing.T) {
	clock := newFakeClock()
	s := mustNew(t, WithClock(clock.Now))
	storetest.Run(t, func(*testing.T) storetest.Harness {
		return storetest.Harness{Store: s, Advance: clock.Advance}
	})
}

// TestConformanceRealTime runs the suite in real time, the way it runs
// against a backend whose clock it cannot move.
func TestConformanceRealTime(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		s := mustNew(t)
		return storetest.Harness{Store: s}
	})
}
