package idemkey

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// ProblemTypePrefix starts the type URI of every problem idemkey answers
// with itself, in the middleware and the gateway alike; the code follows.
const ProblemTypePrefix = "urn:idemkey:problem:"

// Codes of the problems both the middleware and the gateway answer with.
const (
	// CodeRequestTooLarge (413): the request body is over the limit.
	CodeRequestTooLarge = "request_too_large"
	// CodeBodyUnreadable (400): the request body could not be read in full.
	CodeBodyUnreadable = "request_body_unreadable"
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

// NewProblem returns the problem with code, its type URI made from
// ProblemTypePrefix.
func NewProblem(code string, status int, title, detail string) Problem {
	return Problem{Type: ProblemTypePrefix + code, Title: title, Status: status, Detail: detail, Code: code}
}

// Body returns p encoded as JSON, with a final newline: the body
// WriteProblem sends. Encode a fixed problem once and keep the body.
func (p Problem) Body() []byte {
	b, err := json.Marshal(p)
	if err != nil {
		// A struct of strings and ints always encodes.
		panic("idemkey: encoding a problem: " + err.Error())
	}
	return append(b, '\n')
}

// ProblemHeader sets the headers of p's response on h: the
// application/problem+json media type, Cache-Control: no-store, the
// Content-Length of body, and Retry-After when p has one.
func ProblemHeader(h http.Header, p Problem, body []byte) {
	h["Content-Type"] = []string{"application/problem+json"}
	h["Cache-Control"] = []string{"no-store"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	if p.RetryAfter > 0 {
		h["Retry-After"] = []string{strconv.Itoa(p.RetryAfter)}
	} else {
		delete(h, "Retry-After")
	}
}

// WriteProblem writes p as the response, with body as its encoding (nil:
// p.Body()).
func WriteProblem(w http.ResponseWriter, p Problem, body []byte) {
	if body == nil {
		body = p.Body()
	}
	ProblemHeader(w.Header(), p, body)
	w.WriteHeader(p.Status)
	w.Write(body)
}

// ValidHeaderName reports whether name can name a header field: an RFC 9110
// token (letters, digits and !#$%&'*+-.^_`|~).
func ValidHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '!', c == '#', c == '$', c == '%', c == '&', c == '\'', c == '*',
			c == '+', c == '-', c == '.', c == '^', c == '_', c == '`', c == '|', c == '~':
		default:
			return false
		}
	}
	return true
}
