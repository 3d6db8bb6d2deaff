// Command nethttp-app is a small payment service on the standard library's
// http.ServeMux (Go 1.22 method and wildcard patterns), protected by
// idemkey: a retried POST makes one payment, however often its reply is
// lost.
//
//	ADDR=127.0.0.1:8081 go run ./examples/nethttp-app
//	curl -i -X POST localhost:8081/payments -H 'Idempotency-Key: k1' -d '{"amount":10,"currency":"EUR"}'
//
// Without REDIS_URL it keeps its keys in memory. The service itself (its
// handlers, the demo authentication, the simulated bank and the store
// chosen from the environment) lives in examples/internal/payments and is
// the same for examples/chi-app; this file is only its routing. See
// examples/README.md for the environment and a curl session.
package main

import (
	"net/http"

	"github.com/idemkey/idemkey/examples/internal/payments"
	"github.com/idemkey/idemkey/middleware"
)

func main() {
	payments.Main(routes)
}

// routes is the service's API on http.ServeMux. Idempotency wraps each
// route's handler by plain nesting; the request id and authentication wrap
// the whole mux, so they run first (the idempotency scope is the signed-in
// user).
func routes(s *payments.Service) http.Handler {
	idem := s.Idempotency()
	mux := http.NewServeMux()

	mux.Handle("POST /payments", idem.Required(middleware.Deadline(payments.PaymentDeadline))(http.HandlerFunc(s.CreatePayment)))
	mux.HandleFunc("GET /payments", s.ListPayments)
	mux.HandleFunc("GET /payments/{id}", s.GetPayment)
	mux.Handle("POST /transfers", idem.Required(middleware.Deadline(s.TransferDeadline()))(http.HandlerFunc(s.CreateTransfer)))
	mux.HandleFunc("GET /transfers", s.ListTransfers)
	mux.Handle("PUT /profile", idem.Optional()(http.HandlerFunc(s.PutProfile)))
	mux.HandleFunc("GET /healthz", s.Healthz)

	mux.Handle("/", payments.Unrouted(func(req *http.Request) bool {
		_, pattern := mux.Handler(req)
		return pattern != "" && pattern != "/"
	}))

	return payments.RequestID(payments.Auth(mux))
}
