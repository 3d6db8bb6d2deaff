// Package problem builds and writes the problem+json responses that the
// middleware and the gateway answer with themselves, in the shape
// idemkey.Problem describes.
package problem

import (
	"net/http"
	"strconv"

	"github.com/idemkey/idemkey"
)

// New returns the problem with code, its type URI made from
// idemkey.ProblemTypePrefix.
func New(code string, status int, title, detail string) idemkey.Problem {
	return idemkey.Problem{Type: idemkey.ProblemTypePrefix + code, Title: title, Status: status, Detail: detail, Code: code}
}

// SetHeader sets the headers of p's response on h: the
// application/problem+json media type, Cache-Control: no-store, the
// Content-Length of body, and Retry-After when p has one.
func SetHeader(h http.Header, p idemkey.Problem, body []byte) {
	h["Content-Type"] = []string{"application/problem+json"}
	h["Cache-Control"] = []string{"no-store"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	if p.RetryAfter > 0 {
		h["Retry-After"] = []string{strconv.Itoa(p.RetryAfter)}
	} else {
		delete(h, "Retry-After")
	}
}

// Write writes p as the response, with body as its encoding (nil:
// p.Body()).
func Write(w http.ResponseWriter, p idemkey.Problem, body []byte) {
	if body == nil {
		body = p.Body()
	}
	SetHeader(w.Header(), p, body)
	w.WriteHeader(p.Status)
	w.Write(body)
}
