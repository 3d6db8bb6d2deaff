// Package option applies functional options the one way every idemkey
// package does: in order, each checking its own value, with every invalid
// value and every nil option reported in one error that New returns. No
// option panics, and a later option of the same kind overrides an earlier
// one.
package option

import (
	"errors"
	"fmt"
)

// Apply applies opts to c in order and returns the errors they report,
// joined, each prefixed with prefix (for example "idemkey: middleware");
// a nil option is an error too. It returns nil when every option applied.
func Apply[C any, O ~func(*C) error](prefix string, c *C, opts []O) error {
	var errs []error
	for i, o := range opts {
		if o == nil {
			errs = append(errs, fmt.Errorf("%s: option %d is nil", prefix, i+1))
			continue
		}
		if err := o(c); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", prefix, err))
		}
	}
	return errors.Join(errs...)
}
