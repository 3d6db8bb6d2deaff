package payments

import (
	"net/http"
	"slices"
	"strings"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/middleware"
)

// ProblemTypePrefix starts the type URI of the service's own problems; the
// code follows. The idempotency middleware's problems have their own prefix,
// idemkey.ProblemTypePrefix.
const ProblemTypePrefix = "urn:idemkey:example:problem:"

// The codes of the service's own problems.
const (
	// CodeInvalidRequest (400): the body is not the JSON the operation
	// takes, or a field is out of range.
	CodeInvalidRequest = "invalid_request"
	// CodeUnsupportedMediaType (415): the body is not labelled
	// application/json.
	CodeUnsupportedMediaType = "unsupported_media_type"
	// CodeUnauthorized (401): the Authorization header is not
	// "Bearer <user>".
	CodeUnauthorized = "unauthorized"
	// CodeNotFound (404): no such payment, or no such route.
	CodeNotFound = "not_found"
	// CodeMethodNotAllowed (405): the route exists, the method does not;
	// Allow lists the methods it has.
	CodeMethodNotAllowed = "method_not_allowed"
	// CodeBankUnavailable (502): the bank did not make the transfer. Not
	// kept: a retry with the same key asks the bank again, with the same
	// derived key, and the bank makes the transfer at most once.
	CodeBankUnavailable = "bank_unavailable"
	// CodeBankTimeout (504): the bank did not answer within the route's
	// deadline. Not kept, like CodeBankUnavailable.
	CodeBankTimeout = "bank_timeout"
	// CodeUnavailable (503): the idempotency store does not answer
	// (GET /healthz); a payment could not be made, or outlived its
	// deadline, and was undone; the database could not be read (GET
	// /payments with DATABASE_URL). Not kept: retry.
	CodeUnavailable = "unavailable"
)

// writeProblem answers with an RFC 9457 problem+json, in the same shape
// as the idempotency middleware's own errors. detail must not echo the
// request.
func writeProblem(w http.ResponseWriter, r *http.Request, status int, code, detail string) {
	middleware.WriteProblem(w, r, idemkey.Problem{
		Type:   ProblemTypePrefix + code,
		Title:  http.StatusText(status),
		Status: status,
		Detail: detail,
		Code:   code,
	})
}

// probeMethods are the methods Unrouted tries when it builds Allow.
var probeMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
	http.MethodPatch, http.MethodDelete}

// Unrouted answers the requests a router has no route for with
// problem+json, like every other error of the service: 405
// method_not_allowed with Allow when the path has routes for other methods,
// else 404 not_found. routed reports whether the router has a route for a
// request's method and path (chi's Mux.Match, or the pattern
// http.ServeMux.Handler finds). Register it as chi's NotFound and
// MethodNotAllowed handler, or as the ServeMux's catch-all "/".
func Unrouted(routed func(r *http.Request) bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var allow []string
		for _, m := range probeMethods {
			if m == r.Method {
				continue
			}
			probe := r.Clone(r.Context())
			probe.Method = m
			if routed(probe) {
				allow = append(allow, m)
			}
		}
		if len(allow) == 0 {
			writeProblem(w, r, http.StatusNotFound, CodeNotFound, "There is no resource at this path.")
			return
		}
		slices.Sort(allow)
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeProblem(w, r, http.StatusMethodNotAllowed, CodeMethodNotAllowed, "This resource does not support this method; Allow lists the methods it does.")
	}
}
