package retryhint

import (
	"slices"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/keylife"
	"github.com/idemkey/idemkey/store"
)

// TestDeadOwnerHintsGrow: an instance died holding a claim (kill -9) on a
// store that reports no ClaimedAt (Redis): its claim answers in flight
// until its life (30 s plus ClaimMargin) ends. A repeat that follows the
// hints from 0.5 s in used to be told, on an instance without a finished
// first run, 1 s thirty times over (a retry budget of a few attempts spent
// in seconds), and on one whose first runs took 10 ms, 35 s at once (past
// most clients' budgets). The hints now grow with the claim's age: 8 of
// them in the claim's 35 s, none longer than MaxOverdue.
func TestDeadOwnerHintsGrow(t *testing.T) {
	deadline := keylife.DefaultDeadline
	life := deadline + keylife.ClaimMargin
	for _, est := range []time.Duration{0, 10 * time.Millisecond} {
		var runs RunTimes
		if est > 0 {
			runs.Add(est) // this instance's own first runs
		}
		var hints []int
		for at := 500 * time.Millisecond; at < life; {
			ra := runs.RetryAfter(store.Result{State: store.InFlight, TTL: life - at}, deadline, time.Time{})
			hints = append(hints, ra)
			at += time.Duration(ra) * time.Second
		}
		if want := []int{1, 1, 2, 3, 4, 6, 9, 9}; !slices.Equal(hints, want) {
			t.Errorf("estimate %v: hints %v, want %v", est, hints, want)
		}
	}
}

// TestEstimateWithinUsual: a claim whose age the store reports, within
// twice the estimate, is told the estimate less its age, rounded up; the
// estimate weighs the newest run 1/8.
func TestEstimateWithinUsual(t *testing.T) {
	var runs RunTimes
	runs.Add(4 * time.Second)
	runs.Add(12 * time.Second) // 4 + (12-4)/8 = 5 s
	if got := runs.Estimate(); got != 5*time.Second {
		t.Fatalf("estimate %v, want 5s", got)
	}
	now := time.Now()
	res := store.Result{State: store.InFlight, TTL: 30 * time.Second, ClaimedAt: now.Add(-1500 * time.Millisecond)}
	if got := runs.RetryAfter(res, keylife.DefaultDeadline, now); got != 4 {
		t.Errorf("hint %d, want 4 (5 s less 1.5 s, rounded up)", got)
	}
	res.TTL = 2 * time.Second // never past the claim's remaining life
	if got := runs.RetryAfter(res, keylife.DefaultDeadline, now); got != 2 {
		t.Errorf("hint %d, want 2 (the claim's remaining life)", got)
	}
}
