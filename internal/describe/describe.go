// Package describe hands package openapi what it documents of a
// middleware.Middleware (its key header, the methods it covers, the
// configuration of the routes it made and the problems it answers with)
// without widening the middleware's API for it.
//
// Package middleware sets Of and Problems when it is initialised. Package
// openapi imports package middleware, so both are set before it reads
// them.
package describe

import (
	"net/http"
	"time"

	"github.com/idemkey/idemkey"
)

// Route is the configuration of one route, as the middleware holds it.
type Route struct {
	Required bool
	Deadline time.Duration
	// Err is the error of an invalid option the route was built with; the
	// route answers every covered request with a 500.
	Err error
}

// Middleware is what one middleware.Middleware tells of itself.
type Middleware struct {
	// Header is the canonical name of the key header.
	Header string
	// Covers reports whether requests with a method are covered.
	Covers func(method string) bool
	// RouteOf returns the configuration of a handler the Middleware made,
	// and whether h is one (a handler of another Middleware is not).
	RouteOf func(h http.Handler) (Route, bool)
}

var (
	// Of describes m, a *middleware.Middleware; false for anything else
	// (a nil one included).
	Of func(m any) (Middleware, bool)
	// Problems returns every problem the middleware can answer with,
	// sorted by code.
	Problems func() []idemkey.Problem
)
