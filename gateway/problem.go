package gateway

import (
	"bytes"
	"io"
	"net/http"
	"strconv"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/problem"
)

// The codes of the problems only the gateway answers with; it answers
// idemkey.CodeBodyUnreadable (400) and idemkey.CodeRequestTooLarge (413)
// from the ReverseProxy error handler as well.
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
)

// encoded is one of the gateway's problems (idemkey.Problem, the
// middleware's shape), encoded once.
type encoded struct {
	idemkey.Problem
	body []byte
}

func newProblem(code string, status int, title, detail string, retryAfter int) *encoded {
	p := problem.New(code, status, title, detail)
	p.RetryAfter = retryAfter
	return &encoded{Problem: p, body: p.Body()}
}

var (
	problemReplyLost = newProblem(CodeReplyLost, http.StatusBadGateway, "Upstream reply lost",
		"The request may have reached an upstream instance, whose reply was lost: it may have been processed. It was not sent again because it carries no idempotency key; send mutations with an idempotency key to have them retried safely.", 0)
	problemUnavailable = newProblem(CodeUnavailable, http.StatusServiceUnavailable, "Upstream unavailable",
		"No upstream instance answered the request. Retry after the delay in Retry-After; a mutation is retried safely only with the same idempotency key.", 1)
	problemTimeout = newProblem(CodeTimeout, http.StatusGatewayTimeout, "Upstream timeout",
		"No upstream instance answered before the request's deadline. A mutation is retried safely only with the same idempotency key.", 0)
	problemBodyUnreadable = newProblem(idemkey.CodeBodyUnreadable, http.StatusBadRequest, "Request body unreadable",
		"The request body could not be read in full.", 0)
	problemTooLarge = newProblem(idemkey.CodeRequestTooLarge, http.StatusRequestEntityTooLarge, "Request too large",
		"The request body is larger than this gateway accepts.", 0)
)

func (p *encoded) header() http.Header {
	h := make(http.Header, 4)
	problem.SetHeader(h, p.Problem, p.body)
	return h
}

// problemResponse is p as the response to req.
func problemResponse(req *http.Request, p *encoded) *http.Response {
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
func writeProblem(w http.ResponseWriter, p *encoded) {
	problem.Write(w, p.Problem, p.body)
}
