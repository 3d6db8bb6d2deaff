package sqlcore

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"net"
)

// Transport reports whether err is a failure of the connection itself
// (reset, closed, cut short, a driver's "bad connection"), not an answer
// of the server: each store adds what its driver says besides.
func Transport(err error) bool {
	if _, ok := errors.AsType[*net.OpError](err); ok {
		return true
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, driver.ErrBadConn)
}

// StartContext bounds a store's start-up (New, Migrate, Check): ctx as it
// is when it has a deadline, otherwise ctx ended after
// DefaultStartTimeout, so that a server that accepts connections and
// never answers cannot hang a service's start.
func StartContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, DefaultStartTimeout)
}

// Budget is what a start-up error says of its time budget, given the
// caller's context (before StartContext): the caller's deadline, or
// DefaultStartTimeout.
func Budget(caller context.Context) string {
	if _, ok := caller.Deadline(); ok {
		return "the context's deadline"
	}
	return DefaultStartTimeout.String() + " (the default start-up budget, for a context without a deadline)"
}
