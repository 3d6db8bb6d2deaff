package postgres

import (
	"errors"
	"testing"
)

// TestHeaderUnreadable: a header block this version cannot read is
// ErrUnreadable, not a header.
func TestHeaderUnreadable(t *testing.T) {
	for _, b := range [][]byte{{0x7f}, {0x01, 0x05, 'a'}} {
		if _, err := decodeHeader(b); !errors.Is(err, ErrUnreadable) {
			t.Errorf("decodeHeader(%x) = %v, want ErrUnreadable", b, err)
		}
	}
}
