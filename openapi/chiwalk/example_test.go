package chiwalk_test

import (
	"fmt"
	"log"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/openapi"
	"github.com/idemkey/idemkey/openapi/chiwalk"
	"github.com/idemkey/idemkey/store/memory"
)

// Walk the router once every route is registered, then serve the document
// from the same router.
func ExampleEndpoints() {
	st, err := memory.New()
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	idem, err := middleware.New(st)
	if err != nil {
		log.Fatal(err)
	}
	r := chi.NewRouter()
	r.With(idem.Required()).Post("/payments", handle)
	r.Get("/payments/{id}", handle)
	r.Route("/v2", func(r chi.Router) {
		r.Use(idem.Optional())
		r.Patch("/orders/{id:[0-9]+}", handle)
	})

	eps, err := chiwalk.Endpoints(r)
	if err != nil {
		log.Fatal(err)
	}
	doc, err := openapi.New(idem, eps, openapi.WithInfo("payments", "1.0.0"))
	if err != nil {
		log.Fatal(err)
	}
	r.Method(http.MethodGet, "/openapi.json", doc)

	for _, op := range doc.Operations {
		fmt.Println(op.Method, op.Path, "required:", op.Route.Required)
	}
	// Output:
	// POST /payments required: true
	// PATCH /v2/orders/{id} required: false
}
