package chiwalk_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/openapi"
	"github.com/idemkey/idemkey/openapi/chiwalk"
	"github.com/idemkey/idemkey/store/memory"
)

func handle(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }

func auth(next http.Handler) http.Handler { return next }

// service builds a chi router with idempotency attached in every way chi
// allows, and routes it does not cover.
func service(t *testing.T) (*chi.Mux, *middleware.Middleware) {
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	idem, err := middleware.New(mem)
	if err != nil {
		t.Fatal(err)
	}
	r := chi.NewRouter()
	r.Use(auth)
	r.With(idem.Required(middleware.Deadline(10*time.Second))).Post("/payments", handle)
	r.Get("/payments", handle)
	r.With(idem.Required()).Get("/payments/{id}", handle) // GET: never covered
	r.With(auth, idem.Required(), auth).Post("/payments/{id:[0-9]{1,9}}/refunds", handle)
	r.With(idem.Optional()).Put("/profile", handle)
	r.Method(http.MethodDelete, "/profile", idem.Required()(http.HandlerFunc(handle)))
	r.Post("/webhooks", handle)
	r.Route("/v2", func(r chi.Router) {
		r.Use(idem.Handler)
		r.Post("/orders", handle)
		r.Patch("/orders/{id}", handle)
		r.Get("/orders", handle)
	})
	r.Group(func(r chi.Router) {
		r.Use(idem.Optional())
		r.Post("/group/items", handle)
	})
	return r, idem
}

func TestOperations(t *testing.T) {
	r, idem := service(t)
	eps, err := chiwalk.Endpoints(r)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := openapi.Operations(idem, eps)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, op := range ops {
		got = append(got, fmt.Sprintf("%s %s %v %v", op.Method, op.Path, op.Route.Required, op.Route.Deadline))
	}
	want := []string{
		"POST /group/items false 30s",
		"POST /payments true 10s",
		"POST /payments/{id}/refunds true 30s",
		"DELETE /profile true 30s",
		"PUT /profile false 30s",
		"POST /v2/orders false 30s",
		"PATCH /v2/orders/{id} false 30s",
	}
	if !slices.Equal(got, want) {
		t.Errorf("operations:\n got %q\nwant %q", got, want)
	}
}

// TestServedDocument mounts the document on the router it describes, as a
// service does, fetches it and validates it against the OpenAPI 3.1
// schema.
func TestServedDocument(t *testing.T) {
	r, idem := service(t)
	eps, err := chiwalk.Endpoints(r)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapi.New(idem, eps, openapi.WithInfo("payments", "1.0.0"))
	if err != nil {
		t.Fatal(err)
	}
	r.Method(http.MethodGet, "/openapi.json", doc)

	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("GET", "/openapi.json", nil))
	if w.Code != 200 {
		t.Fatalf("GET /openapi.json: %d", w.Code)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	sch, err := c.Compile("../testdata/oas-3.1-schema-2022-10-07.json")
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(w.Body.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if err := sch.Validate(inst); err != nil {
		t.Fatalf("not OpenAPI 3.1: %v", err)
	}
	var m struct {
		Paths map[string]map[string]struct {
			Parameters []map[string]any `json:"parameters"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	var got []string
	for path, item := range m.Paths {
		for method, op := range item {
			var params []string
			for _, p := range op.Parameters {
				if ref, ok := p["$ref"].(string); ok {
					params = append(params, strings.TrimPrefix(ref, "#/components/parameters/"))
				} else {
					params = append(params, fmt.Sprintf("%v:%v", p["in"], p["name"]))
				}
			}
			got = append(got, strings.ToUpper(method)+" "+path+" "+strings.Join(params, ","))
		}
	}
	slices.Sort(got)
	want := []string{
		"DELETE /profile IdempotencyKey",
		"PATCH /v2/orders/{id} IdempotencyKeyOptional,path:id",
		"POST /group/items IdempotencyKeyOptional",
		"POST /payments IdempotencyKey",
		"POST /payments/{id}/refunds IdempotencyKey,path:id",
		"POST /v2/orders IdempotencyKeyOptional",
		"PUT /profile IdempotencyKeyOptional",
	}
	if !slices.Equal(got, want) {
		t.Errorf("served operations:\n got %q\nwant %q", got, want)
	}
}

func TestWrappedTwice(t *testing.T) {
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	idem, err := middleware.New(mem)
	if err != nil {
		t.Fatal(err)
	}
	r := chi.NewRouter()
	r.Use(idem.Handler)
	r.With(idem.Required()).Post("/x", handle)
	eps, err := chiwalk.Endpoints(r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := openapi.New(idem, eps); err == nil {
		t.Error("a route under two idempotency layers gave no error")
	}
}

// TestTwoMiddlewares: two Middlewares with different headers on one chi
// router, attached on routes, in sub-routers' Use and as handlers; each
// Operations call lists exactly its own routes, and each document names
// its own header.
func TestTwoMiddlewares(t *testing.T) {
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	a, err := middleware.New(mem)
	if err != nil {
		t.Fatal(err)
	}
	b, err := middleware.New(mem, middleware.WithHeader("X-Partner-Key"))
	if err != nil {
		t.Fatal(err)
	}
	r := chi.NewRouter()
	r.Use(auth)
	r.With(a.Required()).Post("/payments", handle)
	r.Method(http.MethodDelete, "/payments/{id}", a.Optional()(http.HandlerFunc(handle)))
	r.With(b.Required()).Post("/partner/orders", handle)
	r.Method(http.MethodDelete, "/partner/orders/{id}", b.Required()(http.HandlerFunc(handle)))
	r.Route("/v2", func(r chi.Router) {
		r.Use(a.Handler)
		r.Post("/refunds", handle)
	})
	r.Route("/partner/v2", func(r chi.Router) {
		r.Use(b.Optional())
		r.Patch("/orders/{id}", handle)
	})
	r.Post("/webhooks", handle)
	eps, err := chiwalk.Endpoints(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		m      *middleware.Middleware
		header string
		want   []string
	}{
		{"a", a, "Idempotency-Key", []string{
			"POST /payments true",
			"DELETE /payments/{id} false",
			"POST /v2/refunds false",
		}},
		{"b", b, "X-Partner-Key", []string{
			"POST /partner/orders true",
			"DELETE /partner/orders/{id} true",
			"PATCH /partner/v2/orders/{id} false",
		}},
	} {
		ops, err := openapi.Operations(c.m, eps)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var got []string
		for _, op := range ops {
			got = append(got, fmt.Sprintf("%s %s %v", op.Method, op.Path, op.Route.Required))
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: operations:\n got %q\nwant %q", c.name, got, c.want)
		}
		doc, err := openapi.New(c.m, eps)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for _, p := range doc.Components.Parameters {
			if p.Name != c.header {
				t.Errorf("%s: key parameter names header %q, want %q", c.name, p.Name, c.header)
			}
		}
		if len(doc.Components.Parameters) == 0 {
			t.Errorf("%s: no key parameter", c.name)
		}
	}
}
