// Package chiwalk lists the routes of a chi router as openapi.Endpoints, so
// that package openapi can describe the ones the idempotency middleware
// covers. It is apart from package openapi so that services on other
// routers do not compile chi.
//
// Walk the router once every route is registered, then serve the document
// from the same router:
//
//	eps, err := chiwalk.Endpoints(r)
//	if err != nil {
//		log.Fatal(err)
//	}
//	doc, err := openapi.New(idem, eps, openapi.WithInfo("payments", "1.0.0"))
//	if err != nil {
//		log.Fatal(err)
//	}
//	r.Method(http.MethodGet, "/openapi.json", doc)
//
// The middleware is found on the route (r.With(idem.Required())), in a
// Use of any router above it, or as the route's handler itself
// (r.Method("POST", "/x", idem.Required()(h))).
package chiwalk

import (
	"cmp"
	"net/http"
	"slices"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/idemkey/idemkey/openapi"
)

// Endpoints returns every route of r with its method, full pattern (mounted
// sub-routers included), handler and the middlewares around it, outermost
// first; sorted by pattern, then method.
func Endpoints(r chi.Routes) ([]openapi.Endpoint, error) {
	var eps []openapi.Endpoint
	err := chi.Walk(r, func(method, route string, h http.Handler, mws ...func(http.Handler) http.Handler) error {
		eps = append(eps, openapi.Endpoint{Method: method, Pattern: route, Handler: h, Middlewares: mws})
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(eps, func(a, b openapi.Endpoint) int {
		return cmp.Or(strings.Compare(a.Pattern, b.Pattern), strings.Compare(a.Method, b.Method))
	})
	return eps, nil
}
