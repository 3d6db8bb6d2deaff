package paymentstest

import (
	"bytes"
	"fmt"
	"testing"
)

// TestOutputDropsWritesAfterTheEnd: the service's log reaches the test's
// output while the test runs, and what is logged after (by a goroutine
// the service started, or through go-redis's process-wide logger) is
// dropped: testing panics on a write to a test whose parents have all
// ended too ("Write called after ... has completed"), as a background
// release logged through go-redis did in CI once the last test was over.
func TestOutputDropsWritesAfterTheEnd(t *testing.T) {
	var buf bytes.Buffer
	out := &testOutput{w: &buf}
	fmt.Fprintln(out, "while the test runs")
	out.end()
	if n, err := fmt.Fprintln(out, "after the test ended"); err != nil || n == 0 {
		t.Fatalf("a late write: %d, %v; want it taken and dropped", n, err)
	}
	if got := buf.String(); got != "while the test runs\n" {
		t.Errorf("the test's output holds %q, want only the line written while it ran", got)
	}
}
