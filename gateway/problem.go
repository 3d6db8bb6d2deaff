package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
)

// The codes of the problems the gateway answers with itself.
const (
	// CodeReplyLost (502): a request that may not be sent twice (a
	// mutation without a key the upstreams honour) may have reached an
	// upstream, and its reply was lost. It may have run; it was not sent
	// again.
	CodeReplyLost = "upstream_reply_lost"
	// CodeUnavailable (503, Retry-After: 1): no attempt got a response.
	CodeUnavailable = "upstream_unavailable"
	// CodeTimeout (504): the request's deadline passed before any
	// upstream answered.
	CodeTimeout = "upstream_timeout"
	// CodeBodyUnreadable (400), written by the ReverseProxy error handler:
	// the request body could not be read in full.
	CodeBodyUnreadable = "request_body_unreadable"
	// CodeRequestTooLarge (413), written by the ReverseProxy error handler:
	// the request body is over an http.MaxBytesReader limit.
	CodeRequestTooLarge = "request_too_large"
)

// ProblemTypePrefix starts the type URI of every problem; the code follows.
// It is the middleware's prefix: the gateway's problems and the
// middleware's read alike.
const ProblemTypePrefix = "urn:idemkey:problem:"

// problem is an RFC 9457 problem details object with a machine-readable
// code, encoded once.
type problem struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Status     int    `json:"status"`
	Detail     string `json:"detail"`
	Code       string `json:"code"`
	retryAfter string
	body       []byte
}

func newProblem(code string, status int, title, detail, retryAfter string) *problem {
	p := &problem{Type: ProblemTypePrefix + code, Title: title, Status: status, Detail: detail, Code: code, retryAfter: retryAfter}
	b, err := json.Marshal(p)
	if err != nil {
		panic(err)
	}
	p.body = append(b, '\n')
	return p
}

var (
	problemReplyLost = newProblem(CodeReplyLost, http.StatusBadGateway, "Upstream reply lost",
		"The request may have reached an upstream instance, whose reply was lost: it may have been processed. It was not sent again because it carries no idempotency key; send mutations with an idempotency key to have them retried safely.", "")
	problemUnavailable = newProblem(CodeUnavailable, http.StatusServiceUnavailable, "Upstream unavailable",
		"No upstream instance answered the request. Retry after the delay in Retry-After; a mutation is retried safely only with the same idempotency key.", "1")
	problemTimeout = newProblem(CodeTimeout, http.StatusGatewayTimeout, "Upstream timeout",
		"No upstream instance answered before the request's deadline. A mutation is retried safely only with the same idempotency key.", "")
	problemBodyUnreadable = newProblem(CodeBodyUnreadable, http.StatusBadRequest, "Request body unreadable",
		"The request body could not be read in full.", "")
	problemTooLarge = newProblem(CodeRequestTooLarge, http.StatusRequestEntityTooLarge, "Request too large",
		"The request body is larger than this gateway accepts.", "")
)

func (p *problem) header() http.Header {
	h := http.Header{
		"Content-Type":   {"application/problem+json"},
		"Cache-Control":  {"no-store"},
		"Content-Length": {strconv.Itoa(len(p.body))},
	}
	if p.retryAfter != "" {
		h["Retry-After"] = []string{p.retryAfter}
	}
	return h
}

// problemResponse is p as the response to req.
func problemResponse(req *http.Request, p *problem) *http.Response {
	return &http.Response{
		Status:        strconv.Itoa(p.Status) + " " + http.StatusText(p.Status),
		StatusCode:    p.Status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        p.header(),
		Body:          io.NopCloser(bytes.NewReader(p.body)),
		ContentLength: int64(len(p.body)),
		Request:       req,
	}
}

// writeProblem writes p as the response.
func writeProblem(w http.ResponseWriter, p *problem) {
	h := w.Header()
	for k, v := range p.header() {
		h[k] = v
	}
	w.WriteHeader(p.Status)
	w.Write(p.body)
}
