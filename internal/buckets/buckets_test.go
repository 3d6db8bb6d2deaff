package buckets

import (
	"math"
	"testing"
)

func TestCheck(t *testing.T) {
	for name, b := range map[string][]float64{
		"none":       nil,
		"NaN":        {1, math.NaN()},
		"+Inf":       {1, math.Inf(1)},
		"-Inf":       {math.Inf(-1), 1},
		"decreasing": {2, 1},
		"repeated":   {1, 1},
	} {
		if Check(b) == nil {
			t.Errorf("%s: %v accepted", name, b)
		}
	}
	for _, b := range [][]float64{Latency(), Size(), {0}, {-1, 0, 1}} {
		if err := Check(b); err != nil {
			t.Errorf("%v refused: %v", b, err)
		}
	}
	if s := Size(); s[0] != 64 || s[len(s)-1] != 4<<20 {
		t.Errorf("size buckets %v, want 64 B to 4 MiB", s)
	}
}
