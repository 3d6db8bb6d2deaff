package gateway

import (
	"context"
	"errors"
	"log"
	"net/http"
	"net/http/httputil"
)

// ReverseProxy returns an httputil.ReverseProxy that sends every request
// through g, to serve as the gateway's handler, or to adjust first. It sets
// X-Forwarded-For, X-Forwarded-Host and X-Forwarded-Proto (replacing any
// the client sent) and keeps the client's Host header.
//
// Its error handler answers the errors RoundTrip returns: a body over an
// http.MaxBytesReader limit gets 413 request_too_large and another
// unreadable body 400 request_body_unreadable, as problem+json; a request
// whose client went away gets a bare 502 that nobody reads. Any other
// error (the proxy's own, for example a failed protocol upgrade) is logged
// to the proxy's ErrorLog (the log package's standard logger when nil) and
// answered with a bare 502, as httputil does by default.
//
// 1xx informational responses (103 Early Hints) of an attempt after which
// the request may still go to another upstream are held until that attempt
// answers, and dropped when it fails: the client never sees the hints of
// an upstream whose answer it does not get. Those of an attempt that is
// the last possible pass straight through.
func (g *Gateway) ReverseProxy() *Proxy {
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetXForwarded()
			pr.Out.Host = pr.In.Host
		},
		Transport: g,
	}
	p.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		var tooLarge *http.MaxBytesError
		switch {
		case r.Context().Err() != nil:
			w.WriteHeader(http.StatusBadGateway)
		case errors.As(err, &tooLarge):
			writeProblem(w, problemTooLarge)
		case errors.Is(err, ErrRequestBody):
			writeProblem(w, problemBodyUnreadable)
		default:
			if p.ErrorLog != nil {
				p.ErrorLog.Printf("idemkey: gateway: %v", err)
			} else {
				log.Printf("idemkey: gateway: %v", err)
			}
			w.WriteHeader(http.StatusBadGateway)
		}
	}
	return &Proxy{ReverseProxy: p}
}

// Proxy is the reverse proxy ReverseProxy returns: an
// httputil.ReverseProxy, whose fields may be adjusted before it serves,
// and a ServeHTTP that holds the 1xx informational responses of attempts
// that may fail over (see ReverseProxy).
type Proxy struct {
	*httputil.ReverseProxy
}

// ServeHTTP serves r through the reverse proxy.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e := &early{w: w}
	p.ReverseProxy.ServeHTTP(&holdWriter{ResponseWriter: w, e: e}, r.WithContext(context.WithValue(r.Context(), earlyKey{}, e)))
}
