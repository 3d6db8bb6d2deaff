package redis

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

type ctxKey struct{}

func TestBudgetDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c slotClock
		parent := context.WithValue(context.Background(), ctxKey{}, "v")
		start := time.Now()
		ctx := c.budget(parent, 300*time.Millisecond)
		dl, ok := ctx.Deadline()
		if !ok || !dl.Equal(start.Add(300*time.Millisecond)) {
			t.Fatalf("deadline %v %v, want the budget's end %v", dl, ok, start.Add(300*time.Millisecond))
		}
		if ctx.Value(ctxKey{}) != "v" {
			t.Error("the caller's values are lost")
		}
		if ctx.Err() != nil {
			t.Fatalf("Err before the deadline: %v", ctx.Err())
		}
		<-ctx.Done()
		late := time.Since(dl)
		if late < 0 || late >= slotWidth {
			t.Errorf("Done closed %v after the deadline, want within [0, %v)", late, slotWidth)
		}
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Errorf("Err after Done: %v", ctx.Err())
		}
	})
}

// Calls whose budgets end in the same slot share one channel (one timer);
// a slot is forgotten once it has ended.
func TestBudgetSharesSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c slotClock
		// A quarter into a slot, then half a slot later.
		time.Sleep(time.Until(time.Now().Truncate(slotWidth).Add(slotWidth + slotWidth/4)))
		a := c.budget(context.Background(), time.Second)
		time.Sleep(slotWidth / 2)
		b := c.budget(context.Background(), time.Second)
		time.Sleep(slotWidth)
		d := c.budget(context.Background(), time.Second)
		if a.Done() != b.Done() {
			t.Error("two budgets ending in one slot do not share Done")
		}
		if a.Done() == d.Done() {
			t.Error("budgets ending in different slots share Done")
		}
		c.mu.Lock()
		n := len(c.slots)
		c.mu.Unlock()
		if n != 2 {
			t.Errorf("%d slots pending, want 2", n)
		}
		<-d.Done()
		synctest.Wait()
		c.mu.Lock()
		n = len(c.slots)
		c.mu.Unlock()
		if n != 0 {
			t.Errorf("%d slots left after they ended", n)
		}
	})
}

// A caller's deadline that comes first is used as it is; a later one is
// replaced by the budget's.
func TestBudgetKeepsSoonerDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c slotClock
		sooner, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if got := c.budget(sooner, 300*time.Millisecond); got != sooner {
			t.Errorf("caller's sooner deadline replaced by %T", got)
		}
		later, cancel2 := context.WithTimeout(context.Background(), time.Hour)
		defer cancel2()
		got := c.budget(later, 300*time.Millisecond)
		if dl, _ := got.Deadline(); !dl.Equal(time.Now().Add(300 * time.Millisecond)) {
			t.Errorf("deadline %v, want the budget's", dl)
		}
	})
}

// BenchmarkBudget compares the context of one store call: a timer of its
// own (context.WithTimeout and its cancel) and a shared slot.
func BenchmarkBudget(b *testing.B) {
	parent := context.WithoutCancel(context.Background())
	b.Run("WithTimeout", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				ctx, cancel := context.WithTimeout(parent, 300*time.Millisecond)
				_ = ctx.Done()
				cancel()
			}
		})
	})
	b.Run("SharedSlot", func(b *testing.B) {
		clock := newSlotClock()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				ctx := clock.budget(parent, 300*time.Millisecond)
				_ = ctx.Done()
			}
		})
	})
}

// TestBudgetNeverHandsOutAnEndedSlot: when the wall clock steps back, a
// deadline can fall in a slot that has already ended (its timer runs on
// the monotonic clock) and that is still the last one handed out. The call
// must get a slot that is still open, not a Done that is already closed
// (an instant, spurious deadline).
func TestBudgetNeverHandsOutAnEndedSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c slotClock
		end := time.Now().Add(time.Second)
		// The state a step back of the wall clock leaves: the last slot
		// handed out has the number end falls in, and has ended.
		ended := &slot{n: (end.UnixNano() + int64(slotWidth) - 1) / int64(slotWidth), done: make(chan struct{})}
		close(ended.done)
		c.last.Store(ended)
		got := c.after(end)
		select {
		case <-got.done:
			t.Error("a call got a slot that had already ended")
		default:
		}
		time.Sleep(2 * time.Second)
	})
}

// TestBudgetOnAnotherClock: a Store made outside a synctest bubble and
// called inside one (whose clock reads earlier than the Store's making)
// gives the call a Done of its own, on the bubble's clock: it closes at the
// budget's end in fake time, and no other bubble ever sees it.
func TestBudgetOnAnotherClock(t *testing.T) {
	c := newSlotClock()
	var dones []<-chan struct{}
	for range 2 {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			ctx := c.budget(context.Background(), 300*time.Millisecond)
			if dl, ok := ctx.Deadline(); !ok || !dl.Equal(start.Add(300*time.Millisecond)) {
				t.Errorf("deadline %v %v, want %v", dl, ok, start.Add(300*time.Millisecond))
			}
			dones = append(dones, ctx.Done())
			<-ctx.Done()
			if d := time.Since(start); d != 300*time.Millisecond {
				t.Errorf("Done closed after %v, want exactly the budget", d)
			}
			if ctx.Err() != context.DeadlineExceeded {
				t.Errorf("Err = %v", ctx.Err())
			}
		})
	}
	if dones[0] == dones[1] {
		t.Error("two bubbles share one Done")
	}
	c.mu.Lock()
	n := len(c.slots)
	c.mu.Unlock()
	if n != 0 {
		t.Errorf("%d shared slots made for calls on another clock", n)
	}
	// On the Store's own clock, calls share slots again.
	c.budget(context.Background(), time.Second)
	c.mu.Lock()
	n = len(c.slots)
	c.mu.Unlock()
	if n != 1 {
		t.Errorf("%d shared slots after a call on the Store's clock, want 1", n)
	}
}
