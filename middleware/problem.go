package middleware

import (
	"fmt"
	"maps"
	"net/http"
	"slices"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/problem"
)

// The middleware answers with the problems whose codes are package
// idemkey's Code constants (idemkey.CodeKeyMissing, ...). Every problem is
// an idemkey.Problem, whose type URI is idemkey.ProblemTypePrefix and the
// code.

// problems lists every problem the middleware can answer with, keyed by
// code (RetryAfter is filled per response).
var problems = map[string]idemkey.Problem{
	idemkey.CodeKeyMissing:      newProblem(idemkey.CodeKeyMissing, http.StatusBadRequest, "Idempotency key missing", "This operation requires an idempotency key header."),
	idemkey.CodeKeyInvalid:      newProblem(idemkey.CodeKeyInvalid, http.StatusBadRequest, "Idempotency key invalid", fmt.Sprintf("The idempotency key must be sent once, as 1 to %d printable ASCII characters, bare (without commas or double quotes) or as a quoted string.", idemkey.MaxKeyLength)),
	idemkey.CodeRequestTooLarge: newProblem(idemkey.CodeRequestTooLarge, http.StatusRequestEntityTooLarge, "Request too large", "The request body is larger than this operation accepts."),
	idemkey.CodeBodyUnreadable:  newProblem(idemkey.CodeBodyUnreadable, http.StatusBadRequest, "Request body unreadable", "The request body could not be read in full."),
	idemkey.CodeKeyReused:       newProblem(idemkey.CodeKeyReused, http.StatusUnprocessableEntity, "Idempotency key reused", "This idempotency key was already used with a different request."),
	idemkey.CodeConflict:        newProblem(idemkey.CodeConflict, http.StatusConflict, "Request in progress", "A request with this idempotency key is still being processed; retry after the delay in Retry-After."),
	idemkey.CodeUnavailable:     newProblem(idemkey.CodeUnavailable, http.StatusServiceUnavailable, "Idempotency store unavailable", "The request was not processed: the service could not reach its idempotency store in time. Retry after the delay in Retry-After."),
	idemkey.CodeScopeMissing:    newProblem(idemkey.CodeScopeMissing, http.StatusInternalServerError, "Caller scope missing", "The request was not processed because the service could not tell whose idempotency keys it uses."),
	idemkey.CodeRouteInvalid:    newProblem(idemkey.CodeRouteInvalid, http.StatusInternalServerError, "Route misconfigured", "The request was not processed because the service configured this operation's idempotency wrongly."),
}

// The problems, one value each, for the flow to answer with: a misspelt
// name does not compile.
var (
	problemKeyMissing      = problems[idemkey.CodeKeyMissing]
	problemKeyInvalid      = problems[idemkey.CodeKeyInvalid]
	problemRequestTooLarge = problems[idemkey.CodeRequestTooLarge]
	problemBodyUnreadable  = problems[idemkey.CodeBodyUnreadable]
	problemKeyReused       = problems[idemkey.CodeKeyReused]
	problemConflict        = problems[idemkey.CodeConflict]
	problemUnavailable     = problems[idemkey.CodeUnavailable]
	problemScopeMissing    = problems[idemkey.CodeScopeMissing]
	problemRouteInvalid    = problems[idemkey.CodeRouteInvalid]
)

// problemFor returns the problem the middleware answers with code, and
// whether there is one (a copy: the table cannot be changed through it).
func problemFor(code string) (idemkey.Problem, bool) {
	p, ok := problems[code]
	return p, ok
}

// problemCodes returns the codes of every problem the middleware can
// answer with, sorted.
func problemCodes() []string {
	return slices.Sorted(maps.Keys(problems))
}

func newProblem(code string, status int, title, detail string) idemkey.Problem {
	return problem.New(code, status, title, detail)
}

// An ErrorWriter writes one of the middleware's problems as the response.
type ErrorWriter func(w http.ResponseWriter, r *http.Request, p idemkey.Problem)

// problemBodies holds each default problem encoded once.
var problemBodies = func() map[string][]byte {
	m := make(map[string][]byte, len(problems))
	for code, p := range problems {
		m[code] = p.Body()
	}
	return m
}()

// WriteProblem is the default ErrorWriter: application/problem+json, with
// Retry-After when p.RetryAfter is positive and Cache-Control: no-store.
func WriteProblem(w http.ResponseWriter, _ *http.Request, p idemkey.Problem) {
	var body []byte // encoded by problem.Write, unless one of ours
	if withoutRetry(p) == problems[p.Code] {
		body = problemBodies[p.Code]
	}
	problem.Write(w, p, body)
}

func withoutRetry(p idemkey.Problem) idemkey.Problem {
	p.RetryAfter = 0
	return p
}
