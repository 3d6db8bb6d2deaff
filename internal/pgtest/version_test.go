package pgtest

import (
	"errors"
	"testing"
)

func TestVersionAtLeast(t *testing.T) {
	for _, tc := range []struct {
		v            string
		major, minor int
		want         bool
	}{
		{"1.18.0", 1, 21, false},
		{"1.21.0", 1, 21, true},
		{"1.24", 1, 21, true},
		{"2.0.1", 1, 21, true},
		{"1.9.0", 1, 21, false},
		{"x", 1, 0, false},
	} {
		if got := versionAtLeast(tc.v, tc.major, tc.minor); got != tc.want {
			t.Errorf("versionAtLeast(%q, %d, %d) = %v", tc.v, tc.major, tc.minor, got)
		}
	}
	if !errors.Is(ErrPgBouncerNotInstalled, ErrNotInstalled) {
		t.Error("ErrPgBouncerNotInstalled does not match ErrNotInstalled: Unavailable would fail instead of skipping")
	}
}
