package middleware

import (
	"net/http"

	"github.com/idemkey/idemkey"
)

// What package openapi reads through internal/describe, for the tests of
// package middleware_test.

func (m *Middleware) HeaderName() string        { return m.cfg.header }
func (m *Middleware) Covers(method string) bool { return m.cfg.covers(method) }

// Route is the configuration of one route.
type Route = routeConfig

func (m *Middleware) RouteOf(h http.Handler) (Route, bool) {
	rt, _, ok := m.routeOf(h)
	return rt, ok
}

func ProblemFor(code string) (idemkey.Problem, bool) { return problemFor(code) }
func ProblemCodes() []string                         { return problemCodes() }
