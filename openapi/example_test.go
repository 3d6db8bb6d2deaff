package openapi_test

import (
	"encoding/json"
	"fmt"
	"log"
	"net/http"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/openapi"
	"github.com/idemkey/idemkey/store/memory"
)

// A service on http.ServeMux lists its routes with FromServeMux next to
// the mux.Handle calls, then builds the document once every route is
// registered and serves it.
func Example() {
	st, err := memory.New()
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	idem, err := middleware.New(st)
	if err != nil {
		log.Fatal(err)
	}
	created := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })

	mux := http.NewServeMux()
	var eps []openapi.Endpoint
	handle := func(pattern string, h http.Handler) {
		mux.Handle(pattern, h)
		eps = append(eps, openapi.FromServeMux(pattern, h))
	}
	handle("POST /payments", idem.Required()(created))
	handle("PUT /payments/{id}/note", idem.Optional()(created))
	handle("GET /payments/{id}", created) // not covered: GET is safe
	handle("POST /webhooks", created)     // not wrapped

	doc, err := openapi.New(idem, eps, openapi.WithInfo("payments", "1.0.0"))
	if err != nil {
		log.Fatal(err)
	}
	mux.Handle("GET /openapi.json", doc)

	for _, op := range doc.Operations {
		fmt.Println(op.Method, op.Path, "required:", op.Route.Required)
	}
	post, err := json.MarshalIndent(doc.Paths["/payments"]["post"], "", "  ")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(post))
	fmt.Println(doc.Components.Parameters[openapi.KeyParameter].Name)
	// Output:
	// POST /payments required: true
	// PUT /payments/{id}/note required: false
	// {
	//   "parameters": [
	//     {
	//       "$ref": "#/components/parameters/IdempotencyKey"
	//     }
	//   ],
	//   "responses": {
	//     "2XX": {
	//       "$ref": "#/components/responses/IdempotentSuccess"
	//     },
	//     "400": {
	//       "$ref": "#/components/responses/IdempotencyBadRequest"
	//     },
	//     "409": {
	//       "$ref": "#/components/responses/IdempotencyConflict"
	//     },
	//     "413": {
	//       "$ref": "#/components/responses/IdempotencyRequestTooLarge"
	//     },
	//     "422": {
	//       "$ref": "#/components/responses/IdempotencyKeyReused"
	//     },
	//     "503": {
	//       "$ref": "#/components/responses/IdempotencyUnavailable"
	//     }
	//   }
	// }
	// Idempotency-Key
}
