package middleware

import (
	"slices"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// TestDeadOwnerHintsGrow: an instance died holding a claim (kill -9) on a
// store that reports no ClaimedAt (Redis): its claim answers 409 until its
// life (30 s plus ClaimMargin) ends. A repeat that follows the hints from
// 0.5 s in used to be told, on an instance without a finished first run,
// 1 s thirty times over (a retry budget of a few attempts spent in
// seconds), and on one whose first runs took 10 ms, 35 s at once (past
// most clients' budgets). The hints now grow with the claim's age: 8 of
// them in the claim's 35 s, none longer than maxOverdueHint.
func TestDeadOwnerHintsGrow(t *testing.T) {
	h := &handler{route: Route{Deadline: defaultDeadline}}
	life := defaultDeadline + ClaimMargin
	for _, est := range []time.Duration{0, 10 * time.Millisecond} {
		h.runs = runTimes{}
		if est > 0 {
			h.runs.add(est) // this instance's own first runs
		}
		var hints []int
		for at := 500 * time.Millisecond; at < life; {
			ra := h.retryAfter(store.Result{State: store.InFlight, TTL: life - at}, time.Time{})
			hints = append(hints, ra)
			at += time.Duration(ra) * time.Second
		}
		if want := []int{1, 1, 2, 3, 4, 6, 9, 9}; !slices.Equal(hints, want) {
			t.Errorf("estimate %v: hints %v, want %v", est, hints, want)
		}
	}
}
