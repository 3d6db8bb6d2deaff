package eventname

import (
	"log/slog"
	"testing"
)

// TestLevel: what an operator must see is at Warn (the level logged with
// no observer), refusals at Info, the rest and unknown names at Debug.
func TestLevel(t *testing.T) {
	for name, want := range map[string]slog.Level{
		StoreError: slog.LevelWarn, OwnershipLost: slog.LevelWarn, StoreFull: slog.LevelWarn,
		RouteInvalid: slog.LevelWarn, ScopeMissing: slog.LevelWarn,
		InFlight: slog.LevelInfo, KeyReused: slog.LevelInfo, KeyMissing: slog.LevelInfo,
		KeyInvalid: slog.LevelInfo, RequestTooLarge: slog.LevelInfo, BodyUnreadable: slog.LevelInfo,
		FirstAttempt: slog.LevelDebug, Replay: slog.LevelDebug, Kept: slog.LevelDebug,
		Released: slog.LevelDebug, Invalid: slog.LevelDebug, "no_such_event": slog.LevelDebug,
	} {
		if got := Level(name); got != want {
			t.Errorf("Level(%q) = %v, want %v", name, got, want)
		}
	}
}
