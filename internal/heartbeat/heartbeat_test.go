package heartbeat

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// extender counts extensions per key and answers err.
type extender struct {
	store.Extender
	mu    sync.Mutex
	calls map[string]int
	err   error
}

func (e *extender) Extend(_ context.Context, key, _ string, _ time.Duration) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls[key]++
	return e.err
}

func (e *extender) count(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[key]
}

type claim struct {
	key    string
	mu     sync.Mutex
	failed []error
}

func (c *claim) Extension() (string, string, time.Duration) {
	return c.key, "t", 300 * time.Millisecond
}
func (c *claim) Detached() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), time.Second)
}
func (c *claim) Failed(err error, _ time.Duration) {
	c.mu.Lock()
	c.failed = append(c.failed, err)
	c.mu.Unlock()
}

// TestBeats: a held claim is extended at the first scan past a third of
// its life; a dropped one is not; a lost one (ErrNotOwner) is reported
// once and not extended again.
func TestBeats(t *testing.T) {
	ext := &extender{calls: map[string]int{}}
	b := &Beats{Ext: ext}
	held, dropped := &claim{key: "held"}, &claim{key: "dropped"}
	now := time.Now()
	b.Hold(held, now)
	b.Hold(dropped, now)
	b.Drop(dropped)
	time.Sleep(Scan + Scan/2)
	if n := ext.count("held"); n != 1 {
		t.Fatalf("held: %d extensions after one scan, want 1", n)
	}
	if n := ext.count("dropped"); n != 0 {
		t.Fatalf("dropped: %d extensions, want none", n)
	}
	ext.mu.Lock()
	ext.err = store.ErrNotOwner
	ext.mu.Unlock()
	time.Sleep(2 * Scan)
	n := ext.count("held")
	held.mu.Lock()
	failed := len(held.failed)
	held.mu.Unlock()
	if n != 2 || failed != 1 {
		t.Fatalf("lost: %d extensions, %d reports; want 2 and 1", n, failed)
	}
	b.Drop(held)
}
