package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemkey/idemkey"
)

// Attempt describes one finished attempt of a logical request, for a
// RetryPolicy.
type Attempt struct {
	// Number counts the attempts of the logical request, starting at 1.
	Number int
	// Key is the idempotency key sent with the request, or "" for none.
	Key string
	// Request is the request as this attempt sent it, key header included.
	Request *http.Request
	// Response is the attempt's response, nil when Err is set. A policy may
	// read its status and headers, never its body.
	Response *http.Response
	// Err is the attempt's transport error, nil when Response is set.
	Err error
}

// A RetryPolicy decides whether a finished attempt is retried. It is
// consulted only when a retry is possible and safe (see WithRetryPolicy),
// so a policy cannot make the transport retry a mutation without a key.
type RetryPolicy func(a Attempt) bool

// DefaultRetryPolicy is the retry decision a Transport makes unless
// WithRetryPolicy replaces it. It retries:
//
//   - transport errors, except TLS certificate and record errors, which
//     another attempt would meet again;
//   - 429, 502, 503 and 504;
//   - 409, for requests that are not GET, HEAD, OPTIONS or TRACE: an
//     idemkey server answers 409 while the first request with the same key
//     is still running.
//
// It never retries a response with Idempotent-Replayed: true (the kept
// answer of the first run, which another attempt would replay again), 500
// or any other status.
func DefaultRetryPolicy(a Attempt) bool {
	if a.Err != nil {
		return RetryableError(a.Err)
	}
	if a.Response == nil || Replayed(a.Response) {
		return false
	}
	switch a.Response.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	case http.StatusConflict:
		return a.Request == nil || !idemkey.Safe(methodOf(a.Request))
	}
	return false
}

// Resendable reports whether a request may be sent again at all once it may
// have reached the server: a read (idemkey.Safe: GET, HEAD, OPTIONS,
// TRACE), or a request that carries an idempotency key (keyed), which the
// server runs once whatever the number of copies. A request that is neither
// is sent once: its reply lost, nobody can tell whether it ran.
//
// Resendable and RetryableError are the rule for a request whose attempt
// ended without a response, the same on both sides of a fleet: the
// Transport applies it between its attempts and package gateway between
// upstreams. Where they differ, and why, is written in the gateway's
// package documentation.
func Resendable(method string, keyed bool) bool {
	return keyed || idemkey.Safe(method)
}

// RetryableError reports whether another attempt after the transport error
// err could end differently: every transport error (connection refused or
// reset, EOF before a response, a timeout) except TLS certificate and
// record errors, which another attempt would meet again. It does not look
// at the caller's context: a caller whose context is done stops anyway.
func RetryableError(err error) bool {
	var (
		verify    *tls.CertificateVerificationError
		record    tls.RecordHeaderError
		authority x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
	)
	switch {
	case errors.As(err, &verify), errors.As(err, &record),
		errors.As(err, &authority), errors.As(err, &hostname),
		errors.As(err, &invalid):
		return false
	}
	return true
}

func methodOf(req *http.Request) string {
	if req.Method == "" {
		return http.MethodGet
	}
	return req.Method
}

// retryAfter reads the Retry-After header of resp: delay seconds or an HTTP
// date, relative to now. It reports false when there is none or it cannot
// be read. A date in the past is a zero wait.
func retryAfter(resp *http.Response, now time.Time) (time.Duration, bool) {
	if resp == nil {
		return 0, false
	}
	v := strings.TrimSpace(resp.Header.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		secs, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			if errors.Is(err, strconv.ErrRange) {
				return maxDuration, true
			}
			return 0, false
		}
		if secs > uint64(maxDuration/time.Second) {
			return maxDuration, true
		}
		return time.Duration(secs) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(at.Sub(now), 0), true
}

const maxDuration = time.Duration(1<<63 - 1)

// backoffCeiling is the largest wait before attempt n+1: min(cap, base × 2^(n-1)).
func (t *Transport) backoffCeiling(n int) time.Duration {
	d := t.backoffBase
	for i := 1; i < n && d < t.backoffCap; i++ {
		if d > t.backoffCap/2 {
			return t.backoffCap
		}
		d *= 2
	}
	return min(d, t.backoffCap)
}

// wait is how long to wait after attempt n, which ended with resp (nil for a
// transport error): the jittered backoff, after the server's Retry-After
// when it sent one. Adding the backoff to the hint, rather than taking the
// larger of the two, keeps the jitter when the hint is the longer: an
// idemkey server's 409 hints at least one second, and clients told the same
// second must not all come back in the same instant. It reports false when
// the server asks for a wait longer than the Retry-After limit.
func (t *Transport) wait(n int, resp *http.Response) (time.Duration, bool) {
	d := time.Duration(t.jitter(int64(t.backoffCeiling(n))))
	if ra, ok := retryAfter(resp, t.now()); ok {
		if ra > t.retryAfterLimit {
			return 0, false
		}
		if d > maxDuration-ra {
			return maxDuration, true
		}
		d += ra
	}
	return d, true
}
