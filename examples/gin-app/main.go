// Command gin-app is the payment service of examples/chi-app on the gin
// engine, protected by idemkey through idemgin: a retried POST makes one
// payment, however often its reply is lost.
//
//	go run ./examples/gin-app
//	curl -i localhost:8080/payments -H 'Content-Type: application/json' -H 'Idempotency-Key: k1' -d '{"amount":10,"currency":"EUR"}'
//
// The service (its handlers, the demo authentication, the simulated bank
// and the store chosen from the environment) lives in
// examples/internal/payments; this file is only its routing. Its handlers
// are net/http handlers, so they run here through gin.WrapF: a gin handler
// of your own reads the same request, c.Request, whose context carries the
// key and, with DATABASE_URL, the request's transaction.
package main

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/idemkey/idemkey/examples/internal/payments"
	"github.com/idemkey/idemkey/idemgin"
	idem "github.com/idemkey/idemkey/middleware" // the name the README and chi-app use
	"github.com/idemkey/idemkey/openapi"
)

func init() { gin.SetMode(gin.ReleaseMode) } // no route table on stdout

func main() {
	payments.Main(routes)
}

// route is one route of the API: its method and path in http.ServeMux's
// syntax (for the 404 and 405 answers and the OpenAPI document), gin's
// path, and its idempotency, if any.
type route struct {
	method, pattern, ginPath string
	idem                     func(http.Handler) http.Handler
	handler                  gin.HandlerFunc
}

// routes is the service's API on gin. The request id and authentication
// wrap the whole engine, so they run first (the idempotency scope is the
// signed-in user); idempotency is per route, before the route's handler.
func routes(s *payments.Service) http.Handler {
	mw := s.Idempotency()
	api := []route{
		{"POST", "/payments", "/payments", mw.Required(idem.Deadline(payments.PaymentDeadline)), gin.WrapF(s.CreatePayment)},
		{"GET", "/payments", "/payments", nil, gin.WrapF(s.ListPayments)},
		{"GET", "/payments/{id}", "/payments/:id", nil, func(c *gin.Context) {
			c.Request.SetPathValue("id", c.Param("id"))
			s.GetPayment(c.Writer, c.Request)
		}},
		{"POST", "/transfers", "/transfers", mw.Required(idem.Deadline(s.TransferDeadline())), gin.WrapF(s.CreateTransfer)},
		{"GET", "/transfers", "/transfers", nil, gin.WrapF(s.ListTransfers)},
		{"PUT", "/profile", "/profile", mw.Optional(), gin.WrapF(s.PutProfile)},
		{"GET", "/healthz", "/healthz", nil, gin.WrapF(s.Healthz)},
		{"GET", "/metrics", "/metrics", nil, gin.WrapH(s.Metrics())},
	}
	r := gin.New()
	r.HandleMethodNotAllowed = true
	known := http.NewServeMux() // which method and path have a route, for Unrouted
	var eps []openapi.Endpoint
	for _, rt := range api {
		chain := []gin.HandlerFunc{rt.handler}
		ep := openapi.Endpoint{Method: rt.method, Pattern: rt.pattern}
		if rt.idem != nil {
			chain = []gin.HandlerFunc{idemgin.Handler(rt.idem), rt.handler}
			ep.Middlewares = []func(http.Handler) http.Handler{rt.idem}
		}
		r.Handle(rt.method, rt.ginPath, chain...)
		known.Handle(rt.method+" "+rt.pattern, http.NotFoundHandler())
		eps = append(eps, ep)
	}
	// The OpenAPI fragments of the covered operations.
	doc, err := openapi.New(mw, eps, openapi.WithInfo("payments", "1.0.0"))
	if err != nil {
		panic(err)
	}
	r.GET("/openapi.json", gin.WrapH(doc))
	known.Handle("GET /openapi.json", http.NotFoundHandler())

	unrouted := gin.WrapF(payments.Unrouted(func(req *http.Request) bool {
		_, pattern := known.Handler(req)
		return pattern != ""
	}))
	r.NoRoute(unrouted)
	r.NoMethod(unrouted)
	return payments.RequestID(payments.Auth(r))
}
