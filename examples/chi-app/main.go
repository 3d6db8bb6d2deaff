// Command chi-app is a small payment service on the chi router, protected
// by idemkey: a retried POST makes one payment, however often its reply is
// lost.
//
//	go run ./examples/chi-app
//	curl -i localhost:8080/payments -H 'Content-Type: application/json' -H 'Idempotency-Key: k1' -d '{"amount":10,"currency":"EUR"}'
//
// Without REDIS_URL or DATABASE_URL it keeps its keys in memory; with
// DATABASE_URL its payments and their kept answers commit together in
// PostgreSQL. The service itself (its
// handlers, the demo authentication, the simulated bank and the store
// chosen from the environment) lives in examples/internal/payments and is
// the same for examples/nethttp-app; this file is only its routing. See
// examples/README.md for the environment and a curl session.
package main

import (
	"net/http"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"

	"github.com/idemkey/idemkey/examples/internal/payments"
	idem "github.com/idemkey/idemkey/middleware" // named: chi has a middleware package too
	"github.com/idemkey/idemkey/openapi"
	"github.com/idemkey/idemkey/openapi/chiwalk"
)

func main() {
	payments.Main(routes)
}

// routes is the service's API on chi. The order of the middleware matters:
// chi's Recoverer and the request id first, then authentication (the
// idempotency scope is the signed-in user), then idempotency per route.
func routes(s *payments.Service) http.Handler {
	mw := s.Idempotency()
	r := chi.NewRouter()
	r.Use(chimw.Recoverer, payments.RequestID, payments.Auth)

	r.With(mw.Required(idem.Deadline(payments.PaymentDeadline))).Post("/payments", s.CreatePayment)
	r.Get("/payments", s.ListPayments)
	r.Get("/payments/{id}", s.GetPayment)
	r.With(mw.Required(idem.Deadline(s.TransferDeadline()))).Post("/transfers", s.CreateTransfer)
	r.Get("/transfers", s.ListTransfers)
	r.With(mw.Optional()).Put("/profile", s.PutProfile)
	r.Get("/healthz", s.Healthz)

	r.Method(http.MethodGet, "/metrics", s.Metrics())
	// The OpenAPI fragments of the covered operations, found by walking
	// the routes above.
	eps, err := chiwalk.Endpoints(r)
	if err != nil {
		panic(err)
	}
	doc, err := openapi.New(mw, eps, openapi.WithInfo("payments", "1.0.0"))
	if err != nil {
		panic(err)
	}
	r.Method(http.MethodGet, "/openapi.json", doc)

	unrouted := payments.Unrouted(func(req *http.Request) bool {
		return r.Match(chi.NewRouteContext(), req.Method, req.URL.Path)
	})
	r.NotFound(unrouted)
	r.MethodNotAllowed(unrouted)
	return r
}
