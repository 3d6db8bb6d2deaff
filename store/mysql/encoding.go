package mysql

import "errors"

// ErrUnreadable reports a row this version cannot read: a header block in
// a format it does not know (written by a later version), a fingerprint or
// raw digest of the wrong size, or damage. It does not wrap
// store.ErrUnavailable: the database answered, and a retry finds the same
// row until it expires. The handler must not run for such a key, since
// the row may hold a kept response.
var ErrUnreadable = errors.New("idemkey: mysql: stored record in an unknown format")
