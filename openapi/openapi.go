// Package openapi describes the idempotency middleware's part of a service's
// API as an OpenAPI 3.1 document fragment, for the service to merge into its
// own document.
//
// For each operation the middleware covers (a route wrapped by the
// middleware's Handler, Required or Optional, with a method it covers) the
// fragment holds:
//
//   - the key header parameter (Idempotency-Key by default), required or
//     optional as the route is, a string of at most 255 characters;
//   - a "2XX" response that carries the Idempotent-Replayed and
//     Idempotent-Body-Omitted headers, to merge into the operation's own
//     success responses;
//   - the 400, 409, 413, 422 and 503 application/problem+json responses the
//     middleware writes itself, each listing its code values (400:
//     idempotency_key_invalid, request_body_unreadable, and
//     idempotency_key_missing only where the key is required), with
//     Retry-After on 409 (a hint of when the first request is likely done)
//     and 503;
//   - the path parameters of the route's template, as strings.
//
// The components those refer to (parameters, headers, responses and the
// IdempotencyProblem schema) are named with an Idempotency or Idempotent
// prefix, so that they do not collide with the service's own on merging.
// Only components some operation uses are included.
//
// A document describes the routes of one Middleware, under its header
// name: a service with two Middlewares (different headers or methods)
// builds one document per Middleware, and each leaves out the routes the
// other made.
//
// Routes reach New as Endpoints: from a chi router, through package
// openapi/chiwalk; from an http.ServeMux, as a list built with FromServeMux
// next to the mux.Handle calls. Build the document once, after every route
// is registered, and serve it with Document's ServeHTTP.
package openapi

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/describe"
	"github.com/idemkey/idemkey/internal/option"
	"github.com/idemkey/idemkey/middleware"
)

// Version is the OpenAPI version of the documents New returns.
const Version = "3.1.0"

// Endpoint is one route of a service as its router knows it.
type Endpoint struct {
	// Method is the request method, such as "POST".
	Method string
	// Pattern is the route's path pattern in the router's own syntax:
	// "/payments/{id}" in both chi and http.ServeMux, "{id:[0-9]+}" for a
	// chi parameter with a regular expression, "{rest...}" and "{$}" in
	// http.ServeMux. No method and no host.
	Pattern string
	// Handler serves the route.
	Handler http.Handler
	// Middlewares wrap Handler, outermost first, as chi.Walk reports them.
	// Nil when Handler is the whole chain.
	Middlewares []func(http.Handler) http.Handler
}

// FromServeMux returns the Endpoint of an http.ServeMux route: pattern is
// the one given to mux.Handle ("POST /payments/{id}", with an optional host
// before the path), h the handler given with it. A pattern without a method
// gives an Endpoint without one, which New refuses: an OpenAPI operation
// needs a method.
func FromServeMux(pattern string, h http.Handler) Endpoint {
	method, rest, found := strings.Cut(strings.TrimLeft(pattern, " \t"), " ")
	if !found || strings.HasPrefix(method, "/") {
		method, rest = "", pattern
	}
	rest = strings.TrimLeft(rest, " \t")
	if i := strings.IndexByte(rest, '/'); i > 0 {
		rest = rest[i:] // drop the host
	}
	return Endpoint{Method: method, Pattern: rest, Handler: h}
}

// Operation is one operation the middleware covers.
type Operation struct {
	// Method is the request method, in upper case.
	Method string
	// Path is the OpenAPI path template, such as "/payments/{id}".
	Path string
	// Route is the idempotency configuration of the route.
	Route Route
}

// Route is the idempotency configuration of one route, as the middleware's
// Required or Optional built it.
type Route struct {
	// Required: a covered request without a key gets 400.
	Required bool
	// Deadline bounds the handler's context (middleware.Deadline, else
	// middleware.WithDeadline's default).
	Deadline time.Duration
}

// Operations returns the endpoints m covers, in the order given: those
// whose handler, or one of whose middlewares, is m's Handler, Required or
// Optional, and whose method m covers. It returns an error for an endpoint
// without a method or a pattern, for a route wrapped by the idempotency
// middleware twice (each layer would claim the key, and the inner one would
// find it in flight), for a route built with an invalid route option (a
// middleware.Deadline that is not positive: the route answers 500), and for
// two endpoints with the same method and path.
//
// A middleware in Endpoint.Middlewares is recognised by applying it to a
// placeholder handler that is never served; it must not have side effects
// when applied. Only m's own routes are described: a service with two
// Middlewares (different headers or methods) describes each one's routes
// with its own call.
func Operations(m *middleware.Middleware, eps []Endpoint) ([]Operation, error) {
	d, ok := describe.Of(m)
	if !ok {
		return nil, errors.New("idemkey: openapi: nil middleware")
	}
	var ops []Operation
	seen := map[string]bool{}
	for _, ep := range eps {
		if ep.Method == "" || ep.Pattern == "" {
			return nil, fmt.Errorf("idemkey: openapi: endpoint %q %q needs a method and a pattern", ep.Method, ep.Pattern)
		}
		route, n, rerr := routeOf(d, ep)
		if rerr != nil {
			return nil, fmt.Errorf("idemkey: openapi: %s %s: %w", ep.Method, ep.Pattern, rerr)
		}
		if n > 1 {
			return nil, fmt.Errorf("idemkey: openapi: %s %s is wrapped by the idempotency middleware %d times", ep.Method, ep.Pattern, n)
		}
		method := strings.ToUpper(ep.Method)
		if n == 0 || !d.Covers(method) {
			continue
		}
		path, _ := pathTemplate(ep.Pattern)
		id := method + " " + path
		if seen[id] {
			return nil, fmt.Errorf("idemkey: openapi: %s is listed twice", id)
		}
		seen[id] = true
		ops = append(ops, Operation{Method: method, Path: path, Route: route})
	}
	return ops, nil
}

// placeholder is the handler middlewares are applied to, to recognise them.
var placeholder = http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})

// routeOf finds the idempotency configuration of an endpoint, counts how
// many idempotency layers wrap it, and returns the error of a layer built
// with an invalid route option.
func routeOf(d describe.Middleware, ep Endpoint) (Route, int, error) {
	var route Route
	var err error
	n := 0
	found := func(r describe.Route) {
		route = Route{Required: r.Required, Deadline: r.Deadline}
		err = cmp.Or(err, r.Err)
		n++
	}
	for _, mw := range ep.Middlewares {
		if mw == nil {
			continue
		}
		if r, ok := d.RouteOf(mw(placeholder)); ok {
			found(r)
		}
	}
	if ep.Handler != nil {
		if r, ok := d.RouteOf(ep.Handler); ok {
			found(r)
		}
	}
	return route, n, err
}

// pathTemplate turns a router pattern into an OpenAPI path template and
// lists the names of its parameters. "{id:[0-9]+}" (chi) and "{rest...}"
// (http.ServeMux) become "{id}" and "{rest}"; "{$}" (http.ServeMux) is
// dropped.
func pathTemplate(pattern string) (string, []string) {
	var b strings.Builder
	var params []string
	for i := 0; i < len(pattern); {
		c := pattern[i]
		if c != '{' {
			b.WriteByte(c)
			i++
			continue
		}
		// Find the matching brace: a chi regular expression may hold braces.
		depth, j := 0, i
		for ; j < len(pattern); j++ {
			if pattern[j] == '{' {
				depth++
			} else if pattern[j] == '}' {
				depth--
				if depth == 0 {
					break
				}
			}
		}
		if j == len(pattern) { // unbalanced: keep the rest as it is
			b.WriteString(pattern[i:])
			break
		}
		inner := pattern[i+1 : j]
		i = j + 1
		if inner == "$" {
			continue
		}
		name, _, _ := strings.Cut(inner, ":")
		name = strings.TrimSuffix(name, "...")
		params = append(params, name)
		b.WriteString("{" + name + "}")
	}
	return b.String(), params
}

// Defaults of the document's info object; WithInfo replaces them.
const (
	DefaultTitle   = "Idempotency"
	DefaultVersion = "1"
)

// An Option configures New. New applies options in order (a later option
// of a kind overrides an earlier one) and returns an error naming every
// invalid value and nil option. No option panics.
type Option func(*config) error

type config struct {
	title, version string
}

// WithInfo sets the document's info title and version, both non-empty.
// Default: DefaultTitle ("Idempotency") and DefaultVersion ("1"). A service
// that merges only the paths and components into its own document can
// leave them.
func WithInfo(title, version string) Option {
	return func(c *config) error {
		if title == "" || version == "" {
			return fmt.Errorf("WithInfo(%q, %q): the title and the version must not be empty", title, version)
		}
		c.title, c.version = title, version
		return nil
	}
}

// New returns the OpenAPI 3.1 fragment for the endpoints m covers; see
// Operations for the endpoints it picks and the errors it returns. It also
// reports every invalid option value and nil option.
func New(m *middleware.Middleware, eps []Endpoint, opts ...Option) (*Document, error) {
	c := config{title: DefaultTitle, version: DefaultVersion}
	err := option.Apply("idemkey: openapi", &c, opts)
	ops, opsErr := Operations(m, eps)
	if err := errors.Join(err, opsErr); err != nil {
		return nil, err
	}
	d, _ := describe.Of(m) // Operations refused a nil m
	return build(d.Header, ops, c), nil
}

// Document is an OpenAPI 3.1 document holding the middleware's fragment.
// Encode it with encoding/json.
type Document struct {
	OpenAPI    string                                 `json:"openapi"`
	Info       Info                                   `json:"info"`
	Paths      map[string]map[string]*OperationObject `json:"paths"`
	Components Components                             `json:"components"`
	// Operations lists the covered operations the paths describe, sorted
	// by path, then method. It is not part of the encoded document.
	Operations []Operation `json:"-"`
}

// Info is the document's info object.
type Info struct {
	Title   string `json:"title"`
	Version string `json:"version"`
}

// OperationObject is an OpenAPI operation object: the parameters and responses
// the middleware adds to one operation.
type OperationObject struct {
	Parameters []Ref          `json:"parameters"`
	Responses  map[string]Ref `json:"responses"`
}

// Ref is an OpenAPI reference object, or, for a path parameter, the
// parameter itself.
type Ref struct {
	Ref string `json:"$ref,omitempty"`
	*Parameter
}

// Parameter is an OpenAPI parameter object.
type Parameter struct {
	Name        string         `json:"name"`
	In          string         `json:"in"`
	Description string         `json:"description,omitempty"`
	Required    bool           `json:"required"`
	Schema      map[string]any `json:"schema"`
}

// Components holds the objects the operations refer to.
type Components struct {
	Schemas    map[string]map[string]any `json:"schemas"`
	Parameters map[string]*Parameter     `json:"parameters"`
	Headers    map[string]*Header        `json:"headers"`
	Responses  map[string]*Response      `json:"responses"`
}

// Header is an OpenAPI header object.
type Header struct {
	Description string         `json:"description"`
	Schema      map[string]any `json:"schema"`
}

// Response is an OpenAPI response object.
type Response struct {
	Description string               `json:"description"`
	Headers     map[string]Ref       `json:"headers,omitempty"`
	Content     map[string]MediaType `json:"content,omitempty"`
}

// MediaType is an OpenAPI media type object.
type MediaType struct {
	Schema   map[string]any     `json:"schema"`
	Examples map[string]Example `json:"examples,omitempty"`
}

// Example is an OpenAPI example object.
type Example struct {
	Summary string `json:"summary,omitempty"`
	Value   any    `json:"value"`
}

// ServeHTTP writes the document as application/json.
func (d *Document) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, err := json.Marshal(d)
	if err != nil {
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// Names of the components.
const (
	ProblemSchema         = "IdempotencyProblem"
	KeyParameter          = "IdempotencyKey"
	OptionalKeyParameter  = "IdempotencyKeyOptional"
	ReplayedHeader        = "IdempotentReplayed"
	BodyOmittedHeader     = "IdempotentBodyOmitted"
	RetryAfterHeader      = "IdempotencyRetryAfter"
	SuccessResponse       = "IdempotentSuccess"
	BadRequestResponse    = "IdempotencyBadRequest"
	BadRequestOptResponse = "IdempotencyBadRequestKeyOptional"
	ConflictResponse      = "IdempotencyConflict"
	TooLargeResponse      = "IdempotencyRequestTooLarge"
	KeyReusedResponse     = "IdempotencyKeyReused"
	UnavailableResponse   = "IdempotencyUnavailable"
)

func ref(kind, name string) Ref { return Ref{Ref: "#/components/" + kind + "/" + name} }

func build(header string, ops []Operation, c config) *Document {
	slices.SortFunc(ops, func(a, b Operation) int {
		if a.Path != b.Path {
			return strings.Compare(a.Path, b.Path)
		}
		return strings.Compare(a.Method, b.Method)
	})
	d := &Document{
		OpenAPI:    Version,
		Info:       Info{Title: c.title, Version: c.version},
		Paths:      map[string]map[string]*OperationObject{},
		Components: Components{Schemas: map[string]map[string]any{}, Parameters: map[string]*Parameter{}, Headers: map[string]*Header{}, Responses: map[string]*Response{}},
		Operations: ops,
	}
	comp := &d.Components
	var required, optional bool
	for _, op := range ops {
		_, params := pathTemplate(op.Path)
		o := &OperationObject{Responses: map[string]Ref{
			"2XX": ref("responses", SuccessResponse),
			"409": ref("responses", ConflictResponse),
			"413": ref("responses", TooLargeResponse),
			"422": ref("responses", KeyReusedResponse),
			"503": ref("responses", UnavailableResponse),
		}}
		if op.Route.Required {
			required = true
			o.Parameters = append(o.Parameters, ref("parameters", KeyParameter))
			o.Responses["400"] = ref("responses", BadRequestResponse)
		} else {
			optional = true
			o.Parameters = append(o.Parameters, ref("parameters", OptionalKeyParameter))
			o.Responses["400"] = ref("responses", BadRequestOptResponse)
		}
		for _, p := range params {
			o.Parameters = append(o.Parameters, Ref{Parameter: &Parameter{
				Name: p, In: "path", Required: true, Schema: map[string]any{"type": "string"},
			}})
		}
		if d.Paths[op.Path] == nil {
			d.Paths[op.Path] = map[string]*OperationObject{}
		}
		d.Paths[op.Path][strings.ToLower(op.Method)] = o
	}
	if len(ops) == 0 {
		return d
	}

	keySchema := map[string]any{"type": "string", "minLength": 1, "maxLength": idemkey.MaxKeyLength}
	keyDoc := "A key the client makes for one logical request (a UUID, for example) and sends again with every retry of it: 1 to " +
		fmt.Sprint(idemkey.MaxKeyLength) + " printable ASCII characters, bare (without commas or double quotes) or as a quoted string. The first request with a key runs; " +
		"a retry with the same request gets the first response again, with Idempotent-Replayed: true. Keys are kept per caller for the retention window."
	if required {
		comp.Parameters[KeyParameter] = &Parameter{Name: header, In: "header", Required: true, Description: keyDoc, Schema: keySchema}
	}
	if optional {
		comp.Parameters[OptionalKeyParameter] = &Parameter{Name: header, In: "header", Required: false,
			Description: keyDoc + " Without a key the request runs with no idempotency.", Schema: keySchema}
	}

	comp.Headers[ReplayedHeader] = &Header{
		Description: `"true" when this response is the kept response of an earlier request with the same key, replayed.`,
		Schema:      map[string]any{"type": "string", "enum": []string{"true"}},
	}
	comp.Headers[BodyOmittedHeader] = &Header{
		Description: `"true" on a replay whose body was not kept (it was streamed, or too large to keep): the status and headers are the first response's, the body is empty.`,
		Schema:      map[string]any{"type": "string", "enum": []string{"true"}},
	}
	comp.Headers[RetryAfterHeader] = &Header{
		Description: "Seconds to wait before retrying with the same key, at least 1. On 409 it is a hint, not a promise: when the first request " +
			"is likely done, from the route's recent first runs less the time this one has already run, or, once it runs longer than usual, " +
			"half of how long it has run (at most 10); never past its claim's life; a retry " +
			"that still finds it running gets 409 again. On 503, when to try the idempotency store again.",
		Schema: map[string]any{"type": "integer", "minimum": 1},
	}
	comp.Responses[SuccessResponse] = &Response{
		Description: "The operation's response. A retry with the same key and request gets the same status, headers and body, " +
			"with Idempotent-Replayed: true (kept 4xx responses are replayed the same way). Merge these headers into the operation's own responses.",
		Headers: map[string]Ref{
			idemkey.HeaderReplayed:    ref("headers", ReplayedHeader),
			idemkey.HeaderBodyOmitted: ref("headers", BodyOmittedHeader),
		},
	}

	problems := describe.Problems()
	codes := make([]string, len(problems))
	for i, p := range problems {
		codes[i] = p.Code
	}
	comp.Schemas[ProblemSchema] = map[string]any{
		"type":        "object",
		"description": "An error the idempotency layer answers with itself (RFC 9457 problem details).",
		"required":    []string{"type", "title", "status", "detail", "code"},
		"properties": map[string]any{
			"type":   map[string]any{"type": "string", "format": "uri", "description": "A URI naming the problem: " + idemkey.ProblemTypePrefix + " and the code."},
			"title":  map[string]any{"type": "string"},
			"status": map[string]any{"type": "integer"},
			"detail": map[string]any{"type": "string"},
			"code":   map[string]any{"type": "string", "enum": codes, "description": "What went wrong, for programs to branch on."},
		},
	}
	problem := func(status int, without string, retry bool, desc string) *Response {
		var cs []string
		examples := map[string]Example{}
		for _, p := range problems {
			if p.Status != status || p.Code == without {
				continue
			}
			cs = append(cs, p.Code)
			examples[p.Code] = Example{Summary: p.Title, Value: p}
		}
		resp := &Response{
			Description: desc,
			Content: map[string]MediaType{"application/problem+json": {
				Schema: map[string]any{"allOf": []any{
					map[string]any{"$ref": "#/components/schemas/" + ProblemSchema},
					map[string]any{"properties": map[string]any{
						"status": map[string]any{"const": status},
						"code":   map[string]any{"enum": cs},
					}},
				}},
				Examples: examples,
			}},
		}
		if retry {
			resp.Headers = map[string]Ref{"Retry-After": ref("headers", RetryAfterHeader)}
		}
		return resp
	}
	const badRequest = "The idempotency key is malformed (sent twice, empty, too long, or not printable ASCII), or the body could not be read. The request did not run."
	if required {
		comp.Responses[BadRequestResponse] = problem(http.StatusBadRequest, "", false,
			"The idempotency key is missing, or malformed (sent twice, empty, too long, or not printable ASCII), or the body could not be read. The request did not run.")
	}
	if optional {
		comp.Responses[BadRequestOptResponse] = problem(http.StatusBadRequest, idemkey.CodeKeyMissing, false, badRequest)
	}
	comp.Responses[ConflictResponse] = problem(http.StatusConflict, "", true,
		"A request with this key is still running. Retry with the same key after the Retry-After hint to get its response; a retry while it still runs gets 409 again.")
	comp.Responses[TooLargeResponse] = problem(http.StatusRequestEntityTooLarge, "", false,
		"The request body is larger than the idempotency layer reads. The request did not run.")
	comp.Responses[KeyReusedResponse] = problem(http.StatusUnprocessableEntity, "", false,
		"This key was already used for a different request (method, path, query, media type or body differ). The request did not run; use a new key for a new request.")
	comp.Responses[UnavailableResponse] = problem(http.StatusServiceUnavailable, "", true,
		"The idempotency store could not record the key. The request did not run; retry with the same key after Retry-After seconds.")
	return d
}
