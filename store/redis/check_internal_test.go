package redis

import "testing"

func TestTooOld(t *testing.T) {
	for v, want := range map[string]bool{
		"7.0.15": false, "7.2.4": false, "8.0.1": false, "10.0.0": false,
		"6.2.14": true, "6.0.0": true, "5.0.7": true,
		"": false, "unknown": false,
	} {
		if got := tooOld(v); got != want {
			t.Errorf("tooOld(%q) = %v, want %v", v, got, want)
		}
	}
}
