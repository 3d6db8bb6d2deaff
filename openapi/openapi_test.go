package openapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/openapi"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

func newMiddleware(t *testing.T, opts ...middleware.Option) *middleware.Middleware {
	t.Helper()
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	m, err := middleware.New(mem, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })

func passThrough(next http.Handler) http.Handler { return next }

// opList renders operations as "METHOD path required|optional deadline".
func opList(ops []openapi.Operation) []string {
	var s []string
	for _, op := range ops {
		kind := "optional"
		if op.Route.Required {
			kind = "required"
		}
		s = append(s, fmt.Sprintf("%s %s %s %v", op.Method, op.Path, kind, op.Route.Deadline))
	}
	return s
}

// docOps lists the operations a document's paths hold, with whether each
// one's key parameter is the required one.
func docOps(t *testing.T, doc map[string]any) []string {
	t.Helper()
	var s []string
	for path, item := range doc["paths"].(map[string]any) {
		for method, op := range item.(map[string]any) {
			params := op.(map[string]any)["parameters"].([]any)
			ref := params[0].(map[string]any)["$ref"]
			s = append(s, fmt.Sprintf("%s %s %v", strings.ToUpper(method), path, ref))
		}
	}
	slices.Sort(s)
	return s
}

func serveMuxEndpoints(idem *middleware.Middleware) []openapi.Endpoint {
	return []openapi.Endpoint{
		openapi.FromServeMux("POST /payments", idem.Required(middleware.Deadline(10*time.Second))(ok)),
		openapi.FromServeMux("GET /payments", ok),
		openapi.FromServeMux("GET /payments/{id}", idem.Required()(ok)), // GET is never covered
		openapi.FromServeMux("PUT /profile", idem.Optional()(ok)),
		openapi.FromServeMux("DELETE api.example.com/payments/{id}/{$}", idem.Handler(ok)),
		openapi.FromServeMux("PATCH /files/{path...}", idem.Required()(ok)),
		openapi.FromServeMux("POST /webhooks", ok), // no idempotency
		{Method: "POST", Pattern: "/wrapped", Handler: ok, Middlewares: []func(http.Handler) http.Handler{passThrough, idem.Required(), passThrough}},
	}
}

func TestServeMuxOperations(t *testing.T) {
	idem := newMiddleware(t)
	ops, err := openapi.Operations(idem, serveMuxEndpoints(idem))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"POST /payments required 10s",
		"PUT /profile optional 30s",
		"DELETE /payments/{id}/ optional 30s",
		"PATCH /files/{path} required 30s",
		"POST /wrapped required 30s",
	}
	if got := opList(ops); !slices.Equal(got, want) {
		t.Errorf("operations:\n got %q\nwant %q", got, want)
	}
}

func TestServeMuxDocument(t *testing.T) {
	idem := newMiddleware(t)
	doc, err := openapi.New(idem, serveMuxEndpoints(idem), openapi.WithInfo("payments", "2.1.0"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	m := validDocument(t, b)

	if m["openapi"] != "3.1.0" {
		t.Errorf("openapi %v", m["openapi"])
	}
	if info := m["info"].(map[string]any); info["title"] != "payments" || info["version"] != "2.1.0" {
		t.Errorf("info %v", info)
	}
	wantOps := []string{
		"DELETE /payments/{id}/ #/components/parameters/IdempotencyKeyOptional",
		"PATCH /files/{path} #/components/parameters/IdempotencyKey",
		"POST /payments #/components/parameters/IdempotencyKey",
		"POST /wrapped #/components/parameters/IdempotencyKey",
		"PUT /profile #/components/parameters/IdempotencyKeyOptional",
	}
	if got := docOps(t, m); !slices.Equal(got, wantOps) {
		t.Errorf("document operations:\n got %q\nwant %q", got, wantOps)
	}
	wantSorted := []string{
		"PATCH /files/{path} required 30s",
		"POST /payments required 10s",
		"DELETE /payments/{id}/ optional 30s",
		"PUT /profile optional 30s",
		"POST /wrapped required 30s",
	}
	if got := opList(doc.Operations); !slices.Equal(got, wantSorted) {
		t.Errorf("Document.Operations:\n got %q\nwant %q", got, wantSorted)
	}

	params := m["components"].(map[string]any)["parameters"].(map[string]any)
	req, opt := params["IdempotencyKey"].(map[string]any), params["IdempotencyKeyOptional"].(map[string]any)
	for _, p := range []map[string]any{req, opt} {
		s := p["schema"].(map[string]any)
		if p["name"] != "Idempotency-Key" || p["in"] != "header" || s["type"] != "string" || s["maxLength"] != 255.0 {
			t.Errorf("key parameter %v", p)
		}
	}
	if req["required"] != true || opt["required"] != false {
		t.Errorf("required %v, optional %v", req["required"], opt["required"])
	}

	// Path parameters are declared, as OpenAPI wants for templated paths.
	patch := m["paths"].(map[string]any)["/files/{path}"].(map[string]any)["patch"].(map[string]any)
	pp := patch["parameters"].([]any)[1].(map[string]any)
	if pp["name"] != "path" || pp["in"] != "path" || pp["required"] != true {
		t.Errorf("path parameter %v", pp)
	}

	// Each covered operation has the problem responses and the success
	// response with Idempotent-Replayed.
	post := m["paths"].(map[string]any)["/payments"].(map[string]any)["post"].(map[string]any)
	var statuses []string
	for s := range post["responses"].(map[string]any) {
		statuses = append(statuses, s)
	}
	slices.Sort(statuses)
	if want := []string{"2XX", "400", "409", "413", "422", "503"}; !slices.Equal(statuses, want) {
		t.Errorf("responses %v, want %v", statuses, want)
	}
	success := m["components"].(map[string]any)["responses"].(map[string]any)["IdempotentSuccess"].(map[string]any)
	if _, ok := success["headers"].(map[string]any)["Idempotent-Replayed"]; !ok {
		t.Errorf("success response without Idempotent-Replayed: %v", success)
	}

	// The code values of each response.
	for name, want := range map[string][]string{
		"IdempotencyBadRequest":            {"idempotency_key_invalid", "idempotency_key_missing", "request_body_unreadable"},
		"IdempotencyBadRequestKeyOptional": {"idempotency_key_invalid", "request_body_unreadable"},
		"IdempotencyConflict":              {"conflict"},
		"IdempotencyRequestTooLarge":       {"request_too_large"},
		"IdempotencyKeyReused":             {"idempotency_key_reused"},
		"IdempotencyUnavailable":           {"unavailable"},
	} {
		v, found := lookupPath(m, "components", "responses", name, "content", "application/problem+json", "schema", "allOf")
		if !found {
			t.Errorf("no schema for %s", name)
			continue
		}
		enum := v.([]any)[1].(map[string]any)["properties"].(map[string]any)["code"].(map[string]any)["enum"].([]any)
		var got []string
		for _, c := range enum {
			got = append(got, c.(string))
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s codes %v, want %v", name, got, want)
		}
	}
	for _, name := range []string{"IdempotencyConflict", "IdempotencyUnavailable"} {
		if _, found := lookupPath(m, "components", "responses", name, "headers", "Retry-After"); !found {
			t.Errorf("%s without Retry-After", name)
		}
	}
	if _, found := lookupPath(m, "components", "schemas", "IdempotencyProblem"); !found {
		t.Error("no IdempotencyProblem schema")
	}
}

func lookupPath(v any, keys ...string) (any, bool) {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[k]; !ok {
			return nil, false
		}
	}
	return v, true
}

// slowStore fails claims for one key, so the middleware answers 503.
type downStore struct {
	store.Store
	down string
}

func (s *downStore) Claim(ctx context.Context, key string, c store.Claim) (store.Result, error) {
	if key == s.down {
		return store.Result{}, store.ErrUnavailable
	}
	return s.Store.Claim(ctx, key, c)
}

// TestProblemsMatchTheirSchemas drives a real middleware into each of its
// refusals and validates the body it wrote against the document's schema
// for that status; a body under another status's schema must not validate.
func TestProblemsMatchTheirSchemas(t *testing.T) {
	mem, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	idem, err := middleware.New(&downStore{Store: mem, down: store.KeyName("anonymous", "down")}, middleware.WithMaxRequestBody(16))
	if err != nil {
		t.Fatal(err)
	}
	entered, proceed := make(chan struct{}), make(chan struct{})
	h := idem.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "slow" {
			entered <- struct{}{}
			<-proceed
		}
		w.Write([]byte("ok"))
	}))
	doc, err := openapi.New(idem, []openapi.Endpoint{openapi.FromServeMux("POST /x", h)})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(doc)
	validDocument(t, b)

	send := func(key, body string) *httptest.ResponseRecorder {
		var rd io.Reader = strings.NewReader(body)
		if body == "broken" {
			rd = io.MultiReader(strings.NewReader("{"), iotest.ErrReader(errors.New("connection reset")))
		}
		r := httptest.NewRequest("POST", "/x", rd)
		if key != "" {
			r.Header.Add("Idempotency-Key", key)
		}
		if key == "twice" {
			r.Header.Add("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	bodies := map[int][]*httptest.ResponseRecorder{}
	add := func(w *httptest.ResponseRecorder) { bodies[w.Code] = append(bodies[w.Code], w) }
	add(send("", "{}"))
	add(send("twice", "{}"))
	add(send("big", strings.Repeat("x", 17)))
	add(send("cut", "broken"))
	add(send("down", "{}"))
	send("k", "{}")
	add(send("k", "[]"))
	done := make(chan struct{})
	go func() { defer close(done); send("slow", "{}") }()
	<-entered
	add(send("slow", "{}"))
	close(proceed)
	<-done

	schemas := map[int]string{
		400: "IdempotencyBadRequest",
		409: "IdempotencyConflict",
		413: "IdempotencyRequestTooLarge",
		422: "IdempotencyKeyReused",
		503: "IdempotencyUnavailable",
	}
	for status, name := range schemas {
		ws := bodies[status]
		if len(ws) == 0 {
			t.Errorf("no %d response was produced", status)
		}
		s := responseSchema(t, b, name)
		for _, w := range ws {
			if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("%d: content type %q", status, ct)
			}
			if (status == 409 || status == 503) && w.Header().Get("Retry-After") == "" {
				t.Errorf("%d without Retry-After", status)
			}
			if err := s.Validate(decode(t, w.Body.Bytes())); err != nil {
				t.Errorf("%d body %s does not match %s: %v", status, w.Body, name, err)
			}
			for other, otherName := range schemas {
				if other == status {
					continue
				}
				if responseSchema(t, b, otherName).Validate(decode(t, w.Body.Bytes())) == nil {
					t.Errorf("%d body %s also matches %s", status, w.Body, otherName)
				}
			}
		}
	}
	var codes400 []string
	for _, w := range bodies[400] {
		var p struct{ Code string }
		json.Unmarshal(w.Body.Bytes(), &p)
		codes400 = append(codes400, p.Code)
	}
	if want := []string{"idempotency_key_missing", "idempotency_key_invalid", "request_body_unreadable"}; !slices.Equal(codes400, want) {
		t.Errorf("400 responses %q, want %q", codes400, want)
	}
}

func decode(t *testing.T, b []byte) any {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestHeaderName(t *testing.T) {
	idem := newMiddleware(t, middleware.WithHeader("x-request-key"), middleware.WithMethods("POST"))
	doc, err := openapi.New(idem, []openapi.Endpoint{
		openapi.FromServeMux("POST /a", idem.Required()(ok)),
		openapi.FromServeMux("PUT /b", idem.Required()(ok)), // PUT not covered here
	})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(doc)
	m := validDocument(t, b)
	if got := docOps(t, m); !slices.Equal(got, []string{"POST /a #/components/parameters/IdempotencyKey"}) {
		t.Errorf("operations %q", got)
	}
	if name, _ := lookupPath(m, "components", "parameters", "IdempotencyKey", "name"); name != "X-Request-Key" {
		t.Errorf("header parameter named %v", name)
	}
	// Only the components in use: no optional route, no optional variants.
	for _, unused := range []string{"IdempotencyKeyOptional"} {
		if _, found := lookupPath(m, "components", "parameters", unused); found {
			t.Errorf("unused component %s present", unused)
		}
	}
	if _, found := lookupPath(m, "components", "responses", "IdempotencyBadRequestKeyOptional"); found {
		t.Error("unused optional 400 response present")
	}
}

func TestNoCoveredOperations(t *testing.T) {
	idem := newMiddleware(t)
	doc, err := openapi.New(idem, []openapi.Endpoint{openapi.FromServeMux("GET /x", idem.Required()(ok))})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(doc)
	m := validDocument(t, b)
	if len(m["paths"].(map[string]any)) != 0 || len(doc.Operations) != 0 {
		t.Errorf("paths %v for a service with no covered operation", m["paths"])
	}
}

func TestServeHTTP(t *testing.T) {
	idem := newMiddleware(t)
	doc, err := openapi.New(idem, serveMuxEndpoints(idem))
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	doc.ServeHTTP(w, httptest.NewRequest("GET", "/openapi.json", nil))
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q", w.Code, w.Header().Get("Content-Type"))
	}
	validDocument(t, w.Body.Bytes())
}

// TestRetryAfterHint: the 409 response's Retry-After is described as a
// hint, which a retry may find too early.
func TestRetryAfterHint(t *testing.T) {
	idem := newMiddleware(t)
	doc, err := openapi.New(idem, serveMuxEndpoints(idem))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(doc)
	m := validDocument(t, b)
	ref, _ := lookupPath(m, "components", "responses", "IdempotencyConflict", "headers", "Retry-After", "$ref")
	r, _ := ref.(string)
	h, found := lookupPath(m, strings.Split(strings.TrimPrefix(r, "#/"), "/")...)
	if !found {
		t.Fatalf("409 Retry-After refers to %q, not found", ref)
	}
	desc, _ := h.(map[string]any)["description"].(string)
	if !strings.Contains(desc, "On 409 it is a hint") || !strings.Contains(desc, "gets 409 again") {
		t.Errorf("Retry-After description %q does not call the 409 value a hint", desc)
	}
	conflict, _ := lookupPath(m, "components", "responses", "IdempotencyConflict", "description")
	if s, _ := conflict.(string); !strings.Contains(s, "Retry-After hint") {
		t.Errorf("409 description %q", s)
	}
}

// TestDefaultInfo: without WithInfo the info object is DefaultTitle and
// DefaultVersion.
func TestDefaultInfo(t *testing.T) {
	idem := newMiddleware(t)
	doc, err := openapi.New(idem, nil)
	if err != nil {
		t.Fatal(err)
	}
	if doc.Info.Title != "Idempotency" || doc.Info.Version != "1" || openapi.DefaultTitle != "Idempotency" || openapi.DefaultVersion != "1" {
		t.Errorf("default info %+v", doc.Info)
	}
	doc, err = openapi.New(idem, nil, openapi.WithInfo("a", "1"), openapi.WithInfo("payments", "2.0.0"))
	if err != nil {
		t.Fatal(err)
	}
	if doc.Info.Title != "payments" || doc.Info.Version != "2.0.0" {
		t.Errorf("info %+v, want the later WithInfo's", doc.Info)
	}
}

func TestErrors(t *testing.T) {
	idem := newMiddleware(t)
	for name, eps := range map[string][]openapi.Endpoint{
		"no method": {openapi.FromServeMux("/payments", idem.Required()(ok))},
		"wrapped twice": {{Method: "POST", Pattern: "/p", Handler: idem.Required()(ok),
			Middlewares: []func(http.Handler) http.Handler{idem.Handler}}},
		"listed twice": {openapi.FromServeMux("POST /p", idem.Required()(ok)), openapi.FromServeMux("POST /p", idem.Optional()(ok))},
	} {
		if _, err := openapi.New(idem, eps); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := openapi.New(nil, nil); err == nil {
		t.Error("nil middleware: no error")
	}
	if _, err := openapi.New(idem, nil, openapi.WithInfo("", "1")); err == nil {
		t.Error("empty title: no error")
	}
	if _, err := openapi.New(idem, nil, openapi.WithInfo("x", "")); err == nil {
		t.Error("empty version: no error")
	}
	// Every problem at once: an invalid option, a nil option, a bad
	// endpoint.
	_, err := openapi.New(idem, []openapi.Endpoint{openapi.FromServeMux("/payments", idem.Required()(ok))}, openapi.WithInfo("", ""), nil)
	if err == nil {
		t.Fatal("invalid options and endpoint: no error")
	}
	for _, want := range []string{"idemkey: openapi: WithInfo(", "idemkey: openapi: option 2 is nil", "needs a method"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not report %q", err, want)
		}
	}
}

func TestFromServeMux(t *testing.T) {
	for pattern, want := range map[string][2]string{
		"POST /payments":               {"POST", "/payments"},
		"DELETE host.example/a/{id}":   {"DELETE", "/a/{id}"},
		"/plain":                       {"", "/plain"},
		"host.example/plain":           {"", "/plain"},
		"PATCH  /two-spaces/{rest...}": {"PATCH", "/two-spaces/{rest...}"},
	} {
		ep := openapi.FromServeMux(pattern, ok)
		if ep.Method != want[0] || ep.Pattern != want[1] {
			t.Errorf("FromServeMux(%q) = %q %q, want %q %q", pattern, ep.Method, ep.Pattern, want[0], want[1])
		}
	}
}

// TestTwoMiddlewares: a service with two Middlewares (different headers)
// on one ServeMux describes each one's routes with its own call: each
// Operations lists exactly the routes its Middleware made, however they are
// attached, and each document names its own header.
func TestTwoMiddlewares(t *testing.T) {
	a := newMiddleware(t)
	b := newMiddleware(t, middleware.WithHeader("X-Partner-Key"))
	eps := []openapi.Endpoint{
		openapi.FromServeMux("POST /payments", a.Required()(ok)),
		openapi.FromServeMux("PUT /profile", a.Optional()(ok)),
		openapi.FromServeMux("POST /partner/orders", b.Required()(ok)),
		openapi.FromServeMux("PATCH /partner/orders/{id}", b.Optional()(ok)),
		{Method: "DELETE", Pattern: "/partner/orders/{id}", Handler: ok, Middlewares: []func(http.Handler) http.Handler{passThrough, b.Handler}},
		{Method: "DELETE", Pattern: "/payments/{id}", Handler: ok, Middlewares: []func(http.Handler) http.Handler{a.Required(), passThrough}},
		openapi.FromServeMux("POST /webhooks", ok),
	}
	for _, c := range []struct {
		name   string
		m      *middleware.Middleware
		header string
		ops    []string
	}{
		{"a", a, "Idempotency-Key", []string{
			"POST /payments required 30s",
			"PUT /profile optional 30s",
			"DELETE /payments/{id} required 30s",
		}},
		{"b", b, "X-Partner-Key", []string{
			"POST /partner/orders required 30s",
			"PATCH /partner/orders/{id} optional 30s",
			"DELETE /partner/orders/{id} optional 30s",
		}},
	} {
		ops, err := openapi.Operations(c.m, eps)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := opList(ops); !slices.Equal(got, c.ops) {
			t.Errorf("%s: operations:\n got %q\nwant %q", c.name, got, c.ops)
		}
		doc, err := openapi.New(c.m, eps)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		j, _ := json.Marshal(doc)
		m := validDocument(t, j)
		if got := len(docOps(t, m)); got != len(c.ops) {
			t.Errorf("%s: the document has %d operations, want %d", c.name, got, len(c.ops))
		}
		for _, p := range []string{"IdempotencyKey", "IdempotencyKeyOptional"} {
			if name, _ := lookupPath(m, "components", "parameters", p, "name"); name != c.header {
				t.Errorf("%s: %s names header %v, want %s", c.name, p, name, c.header)
			}
		}
	}
}

// TestInvalidRouteOption: a route built with a deadline that is not
// positive answers 500; its document is an error naming it, not a
// description of a route that does not work.
func TestInvalidRouteOption(t *testing.T) {
	idem := newMiddleware(t)
	h := idem.Required(middleware.Deadline(0))(http.NotFoundHandler())
	_, err := openapi.Operations(idem, []openapi.Endpoint{openapi.FromServeMux("POST /payments", h)})
	if err == nil || !strings.Contains(err.Error(), "POST /payments") || !strings.Contains(err.Error(), "Deadline") {
		t.Fatalf("Operations = %v, want an error naming the route and Deadline", err)
	}
}
