package keylife

import (
	"testing"
	"time"
)

// TestLives: a deadline or retention that is not positive, or a negative
// store timeout, is refused and leaves the value unset; Fill gives the
// defaults of what is unset and keeps what was set.
func TestLives(t *testing.T) {
	var l Lives
	if l.SetDeadline(0) == nil || l.SetRetention(-time.Second) == nil || l.SetStoreTimeout(-1) == nil {
		t.Fatal("an invalid value was accepted")
	}
	if l != (Lives{}) {
		t.Fatalf("refused values were set: %+v", l)
	}
	if err := l.SetStoreTimeout(0); err != nil {
		t.Fatal(err)
	}
	if err := l.SetRetention(time.Hour); err != nil {
		t.Fatal(err)
	}
	l.Fill()
	if want := (Lives{Deadline: DefaultDeadline, Retention: time.Hour}); l != want {
		t.Fatalf("filled %+v, want %+v", l, want)
	}
}
