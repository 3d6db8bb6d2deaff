// Command echo-app is the payment service of examples/chi-app on echo,
// protected by idemkey through idemecho: a retried POST makes one payment,
// however often its reply is lost.
//
//	go run ./examples/echo-app
//	curl -i localhost:8080/payments -H 'Content-Type: application/json' -H 'Idempotency-Key: k1' -d '{"amount":10,"currency":"EUR"}'
//
// idemecho.Middleware is echo middleware: an echo handler reads the
// request idemkey passes on (c.Request(), whose context carries the key
// and, with DATABASE_URL, the request's transaction), and an error it
// returns is answered by echo's error handler inside the idempotency
// layer, so that the answer the client gets is the one kept (a 4xx) or
// released (a 5xx). Events and metrics name the route by echo's path
// ("/payments/:id").
package main

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemkey/idemkey/examples/internal/payments"
	"github.com/idemkey/idemkey/idemecho"
	idem "github.com/idemkey/idemkey/middleware" // the name the README and chi-app use
	"github.com/idemkey/idemkey/openapi"
)

func main() {
	payments.Main(routes)
}

// route is one route of the API: its method and path in http.ServeMux's
// syntax (for the 404 and 405 answers and the OpenAPI document), echo's
// path, and its idempotency, if any.
type route struct {
	method, pattern, echoPath string
	idem                      func(http.Handler) http.Handler
	handler                   echo.HandlerFunc
}

// routes is the service's API on echo. The request id and authentication
// wrap the whole server, so they run first (the idempotency scope is the
// signed-in user); idempotency is per route.
func routes(s *payments.Service) http.Handler {
	mw := s.Idempotency()
	wrap := func(f http.HandlerFunc) echo.HandlerFunc { return echo.WrapHandler(f) }
	api := []route{
		{"POST", "/payments", "/payments", mw.Required(idem.Deadline(payments.PaymentDeadline)), wrap(s.CreatePayment)},
		{"GET", "/payments", "/payments", nil, wrap(s.ListPayments)},
		{"GET", "/payments/{id}", "/payments/:id", nil, func(c echo.Context) error {
			c.Request().SetPathValue("id", c.Param("id"))
			s.GetPayment(c.Response(), c.Request())
			return nil
		}},
		{"POST", "/transfers", "/transfers", mw.Required(idem.Deadline(s.TransferDeadline())), wrap(s.CreateTransfer)},
		{"GET", "/transfers", "/transfers", nil, wrap(s.ListTransfers)},
		{"PUT", "/profile", "/profile", mw.Optional(), wrap(s.PutProfile)},
		{"GET", "/healthz", "/healthz", nil, wrap(s.Healthz)},
		{"GET", "/metrics", "/metrics", nil, echo.WrapHandler(s.Metrics())},
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	known := http.NewServeMux() // which method and path have a route, for Unrouted
	var eps []openapi.Endpoint
	for _, rt := range api {
		ep := openapi.Endpoint{Method: rt.method, Pattern: rt.pattern}
		var m []echo.MiddlewareFunc
		if rt.idem != nil {
			m = []echo.MiddlewareFunc{idemecho.Middleware(rt.idem)}
			ep.Middlewares = []func(http.Handler) http.Handler{rt.idem}
		}
		e.Add(rt.method, rt.echoPath, rt.handler, m...)
		known.Handle(rt.method+" "+rt.pattern, http.NotFoundHandler())
		eps = append(eps, ep)
	}
	// The OpenAPI fragments of the covered operations.
	doc, err := openapi.New(mw, eps, openapi.WithInfo("payments", "1.0.0"))
	if err != nil {
		panic(err)
	}
	e.GET("/openapi.json", echo.WrapHandler(doc))
	known.Handle("GET /openapi.json", http.NotFoundHandler())

	unrouted := payments.Unrouted(func(req *http.Request) bool {
		_, pattern := known.Handler(req)
		return pattern != ""
	})
	e.HTTPErrorHandler = func(err error, c echo.Context) {
		if errors.Is(err, echo.ErrNotFound) || errors.Is(err, echo.ErrMethodNotAllowed) {
			unrouted(c.Response(), c.Request())
			return
		}
		e.DefaultHTTPErrorHandler(err, c)
	}
	return payments.RequestID(payments.Auth(e))
}
