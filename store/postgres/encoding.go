package postgres

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/idemkey/idemkey/internal/sqlcore"
)

// ErrUnreadable reports a row this version cannot read: a header block in
// a format it does not know (written by a later version), or damaged. It
// does not wrap store.ErrUnavailable: the database answered, and a retry
// finds the same row until it expires. The handler must not run for such a
// key, since the row may hold a kept response.
var ErrUnreadable = errors.New("idemkey: postgres: stored record in an unknown format")

// decodeHeader reads the header column (sqlcore.EncodeHeader's block);
// an error wraps ErrUnreadable.
func decodeHeader(b []byte) (http.Header, error) {
	h, err := sqlcore.DecodeHeader(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnreadable, err)
	}
	return h, nil
}
