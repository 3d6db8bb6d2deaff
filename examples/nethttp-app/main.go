// Command nethttp-app is a small payment service on the standard library's
// http.ServeMux (Go 1.22 method and wildcard patterns), protected by
// idemkey: a retried POST makes one payment, however often its reply is
// lost.
//
//	ADDR=127.0.0.1:8081 go run ./examples/nethttp-app
//	curl -i localhost:8081/payments -H 'Content-Type: application/json' -H 'Idempotency-Key: k1' -d '{"amount":10,"currency":"EUR"}'
//
// Without REDIS_URL or DATABASE_URL it keeps its keys in memory; with
// DATABASE_URL its payments and their kept answers commit together in
// PostgreSQL. The service itself (its
// handlers, the demo authentication, the simulated bank and the store
// chosen from the environment) lives in examples/internal/payments and is
// the same for examples/chi-app; this file is only its routing. See
// examples/README.md for the environment and a curl session.
package main

import (
	"net/http"

	"github.com/idemkey/idemkey/examples/internal/payments"
	idem "github.com/idemkey/idemkey/middleware" // the name the README and chi-app use
	"github.com/idemkey/idemkey/openapi"
)

func main() {
	payments.Main(routes)
}

// routes is the service's API on http.ServeMux. Idempotency wraps each
// route's handler by plain nesting; the request id and authentication wrap
// the whole mux, so they run first (the idempotency scope is the signed-in
// user).
func routes(s *payments.Service) http.Handler {
	mw := s.Idempotency()
	routes := []struct {
		pattern string
		handler http.Handler
	}{
		{"POST /payments", mw.Required(idem.Deadline(payments.PaymentDeadline))(http.HandlerFunc(s.CreatePayment))},
		{"GET /payments", http.HandlerFunc(s.ListPayments)},
		{"GET /payments/{id}", http.HandlerFunc(s.GetPayment)},
		{"POST /transfers", mw.Required(idem.Deadline(s.TransferDeadline()))(http.HandlerFunc(s.CreateTransfer))},
		{"GET /transfers", http.HandlerFunc(s.ListTransfers)},
		{"PUT /profile", mw.Optional()(http.HandlerFunc(s.PutProfile))},
		{"GET /healthz", http.HandlerFunc(s.Healthz)},
		{"GET /metrics", s.Metrics()},
	}
	mux := http.NewServeMux()
	var eps []openapi.Endpoint
	for _, rt := range routes {
		mux.Handle(rt.pattern, rt.handler)
		eps = append(eps, openapi.FromServeMux(rt.pattern, rt.handler))
	}
	// The OpenAPI fragments of the covered operations.
	doc, err := openapi.New(mw, eps, openapi.WithInfo("payments", "1.0.0"))
	if err != nil {
		panic(err)
	}
	mux.Handle("GET /openapi.json", doc)

	mux.Handle("/", payments.Unrouted(func(req *http.Request) bool {
		_, pattern := mux.Handler(req)
		return pattern != "" && pattern != "/"
	}))

	return payments.RequestID(payments.Auth(mux))
}
