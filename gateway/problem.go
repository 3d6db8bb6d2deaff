package gateway

import (
	"bytes"
	"io"
	"net/http"
	"strconv"

	"github.com/idemkey/idemkey"
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
	CodeBodyUnreadable = idemkey.CodeBodyUnreadable
	// CodeRequestTooLarge (413), written by the ReverseProxy error handler:
	// the request body is over an http.MaxBytesReader limit.
	CodeRequestTooLarge = idemkey.CodeRequestTooLarge
)

// problem is one of the gateway's problems (idemkey.Problem, the
// middleware's shape), encoded once.
type problem struct {
	idemkey.Problem
	body []byte
}

func newProblem(code string, status int, title, detail string, retryAfter int) *problem {
	p := idemkey.NewProblem(code, status, title, detail)
	p.RetryAfter = retryAfter
	return &problem{Problem: p, body: p.Body()}
}

var (
	problemReplyLost = newProblem(CodeReplyLost, http.StatusBadGateway, "Upstream reply lost",
		"The request may have reached an upstream instance, whose reply was lost: it may have been processed. It was not sent again because it carries no idempotency key; send mutations with an idempotency key to have them retried safely.", 0)
	problemUnavailable = newProblem(CodeUnavailable, http.StatusServiceUnavailable, "Upstream unavailable",
		"No upstream instance answered the request. Retry after the delay in Retry-After; a mutation is retried safely only with the same idempotency key.", 1)
	problemTimeout = newProblem(CodeTimeout, http.StatusGatewayTimeout, "Upstream timeout",
		"No upstream instance answered before the request's deadline. A mutation is retried safely only with the same idempotency key.", 0)
	problemBodyUnreadable = newProblem(CodeBodyUnreadable, http.StatusBadRequest, "Request body unreadable",
		"The request body could not be read in full.", 0)
	problemTooLarge = newProblem(CodeRequestTooLarge, http.StatusRequestEntityTooLarge, "Request too large",
		"The request body is larger than this gateway accepts.", 0)
)

func (p *problem) header() http.Header {
	h := make(http.Header, 4)
	idemkey.ProblemHeader(h, p.Problem, p.body)
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
	idemkey.WriteProblem(w, p.Problem, p.body)
}
