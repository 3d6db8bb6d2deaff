package idemkey

import "encoding/json"

// ProblemTypePrefix starts the type URI of every problem idemkey answers
// with itself, in the middleware and the gateway alike; the code follows.
const ProblemTypePrefix = "urn:idemkey:problem:"

// The codes of the problems idemkey answers with itself (Problem.Code):
// the middleware every one of them, the gateway the two about the body.
const (
	// CodeKeyMissing (400): a route that requires a key got none.
	CodeKeyMissing = "idempotency_key_missing"
	// CodeKeyInvalid (400): the key header was malformed, or sent twice.
	CodeKeyInvalid = "idempotency_key_invalid"
	// CodeKeyReused (422): the key is held for a different request.
	CodeKeyReused = "idempotency_key_reused"
	// CodeConflict (409): the key's first request is still running.
	CodeConflict = "conflict"
	// CodeUnavailable (503): the store could not be reached in time, or is
	// full; the request was not processed.
	CodeUnavailable = "unavailable"
	// CodeRequestTooLarge (413): the request body is over the limit.
	CodeRequestTooLarge = "request_too_large"
	// CodeBodyUnreadable (400): the request body could not be read in full.
	CodeBodyUnreadable = "request_body_unreadable"

	// The 500s, for a service's configuration errors. CodeScopeMissing: the
	// scope function named no scope for a request. CodeRouteInvalid: the
	// route was built with an invalid route option.
	CodeScopeMissing = "scope_missing"
	CodeRouteInvalid = "route_invalid"
)

// Problem is an error response idemkey writes itself, as an RFC 9457
// problem details object with a machine-readable Code. Detail never echoes
// a key, a body or an internal error.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
	// RetryAfter, in whole seconds, is sent as the Retry-After header when
	// positive.
	RetryAfter int `json:"-"`
}

// Body returns p encoded as JSON, with a final newline: the body the
// middleware and the gateway send. Encode a fixed problem once and keep the body.
func (p Problem) Body() []byte {
	b, err := json.Marshal(p)
	if err != nil {
		// A struct of strings and ints always encodes.
		panic("idemkey: encoding a problem: " + err.Error())
	}
	return append(b, '\n')
}
