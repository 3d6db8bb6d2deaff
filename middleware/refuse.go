package middleware

import (
	"net/http"

	"github.com/idemkey/idemkey"
)

// Refusals: the answers the middleware writes itself, each an
// idemkey.Problem, reported as an event.

// refuse writes one of the middleware's problems and reports ev (when its
// Kind is set), with the problem's status.
func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, ev Event, p idemkey.Problem, retryAfter int) {
	m.refuseWithID(w, r, ev, p, retryAfter, "")
}

// refuse is Middleware.refuse for the attempt's request, whose new request
// id (when it needs one) was made with its owner token.
func (a *attempt) refuse(ev Event, p idemkey.Problem, retryAfter int) {
	a.h.m.refuseWithID(a.w, a.r, ev, p, retryAfter, a.id)
}

// refuseWithID is refuse, with fresh as for requestID.
func (m *Middleware) refuseWithID(w http.ResponseWriter, r *http.Request, ev Event, p idemkey.Problem, retryAfter int, fresh string) {
	p.RetryAfter = retryAfter
	if ev.Kind != 0 {
		if ev.Status == 0 {
			ev.Status = p.Status
		}
		m.emit(r, ev)
	}
	m.setRequestID(w, r, nil, fresh)
	m.cfg.errorWriter(w, r, p)
}
