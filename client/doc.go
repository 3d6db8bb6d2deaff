// Package client is the caller's half of idemkey: an [http.RoundTripper] that
// gives each logical request one idempotency key, sends that same key on
// every attempt, and retries only what is safe to retry.
//
//	t, err := client.New()
//	if err != nil { ... }
//	c := &http.Client{Transport: t, Timeout: 30 * time.Second}
//
// It works with any API that honours the Idempotency-Key header: services
// protected by the idemkey middleware, Stripe, and others following the IETF
// Idempotency-Key draft. Sending a key (and so retrying) a mutation to a
// service that ignores the header can apply it twice: use [WithoutAutoKey]
// for such services.
//
// # One key per logical request
//
// A logical request is one call of [Transport.RoundTrip] (one http.Client.Do),
// with the 307 and 308 redirects http.Client follows for it: they send the
// same method and body to another URL, so they keep the key the first hop
// was sent with. A 301, 302 or 303 that turns the request into a GET starts
// a new one. Its key is chosen once, in this order:
//
//  1. An Idempotency-Key header already on the request: sent as it is.
//  2. A key put on the request's context with [WithKey].
//  3. When the context carries an incoming key (the idemkey middleware puts
//     it there, see [idemkey.FromContext]) and the call was named with
//     [WithCallName]: the derived key [idemkey.Key.Derive](name).
//  4. When the context carries an incoming key and no call name, for POST,
//     PUT, PATCH and DELETE: the key derived with the name
//     "METHOD host/path", for example "POST api.example.com/v1/charges"
//     (host lower-cased, path escaped, no query). It is stable across
//     retries of the incoming request and distinct per endpoint; two calls
//     to the same endpoint made while serving one request must be told apart
//     with WithCallName, or they share a key and the second one gets the
//     first one's answer.
//  5. Otherwise, for POST, PUT, PATCH and DELETE: a fresh key from the key
//     generator (a random UUID by default).
//
// Steps 4 and 5 are the automatic keys; [WithoutAutoKey] turns them off, and
// then a mutation the caller did not key is sent once and never retried.
// Keys the caller asked for (steps 1 to 3) are sent on any method. GET, HEAD,
// OPTIONS and TRACE never get an automatic key.
//
// A retried incoming request carries the same incoming key, so every key
// derived from it is the same too: the downstream service replays its first
// answer instead of acting twice.
//
// A key is 1 to 255 printable ASCII characters ([idemkey.ValidKey]); any
// other key from WithKey or the key generator fails the request with
// an error wrapping [idemkey.ErrKeyInvalid] before anything is sent. Keys are sent with
// [idemkey.FormatKey]: bare, or as a quoted string when they hold a comma, a
// double quote or a space at either end. The header name, the key grammar
// and the covered methods are the protocol's, from package idemkey.
//
// # What is retried
//
// A request is retried only while all of these hold: fewer than the maximum
// attempts have been made (default 4, the first included), or, after a 409
// with a Retry-After (the first request with the key still runs), the
// in-flight wait has not passed (default one minute from the first
// attempt, see [WithInFlightWait]; such answers do not spend attempts); the
// request's context is not done; the request body can be sent again; the
// retry policy (default [DefaultRetryPolicy]) says yes; and the wait before
// the next attempt ends before the context's deadline, or it is a
// Retry-After that can be cut short (below).
//
//	request                    retried on                               never retried on
//	keyed mutation             transport errors (connection refused or  400, 401, 403, 404, 422, other 4xx;
//	(POST, PUT, PATCH, DELETE  reset, EOF before a response, timeouts   500, 501 and other 5xx;
//	or any other unsafe        that are not the caller's context);      TLS certificate errors;
//	method with a key)         409, 429, 502, 503, 504                  any response with
//	                                                                    Idempotent-Replayed: true
//	unkeyed mutation           nothing: sent once                       everything
//	GET, HEAD, OPTIONS, TRACE  transport errors; 429, 502, 503, 504     409, other 4xx, 500, other 5xx;
//	                                                                    TLS certificate errors
//
// 500 is not retried: it usually reports a fault in the handler that would
// happen again, and the idemkey middleware does not keep 5xx answers (it
// releases the key), so a retry would run the handler a second time, with
// whatever it did before failing done twice. A caller whose servers keep 500
// answers, or who wants the retry anyway, can say so with [WithRetryPolicy].
// A replayed answer is the kept result of the first run: asking again only
// replays it again.
//
// # How long it waits
//
// Before attempt n+1 the transport waits a random time between zero and
// min(cap, base × 2^(n-1)) ("full jitter": base 100ms and cap 5s by default).
// When the response carries Retry-After (seconds or an HTTP date) the
// transport waits that long first and then the random time: at least the
// server's hint, and never in step with other clients told the same hint.
// An idemkey server's 409 hints when the first request with the key is
// likely done, at least one second, and for a first request that runs
// longer than usual a hint that grows with how long it has run (at most
// 10 s). Such 409s are retried for the in-flight wait, not a number of
// attempts: a server that died holding the key answers 409 until the
// claim's life ends (the route's deadline plus 5 s, 35 s by default), and
// the in-flight wait outlasts that. A Retry-After longer than the limit
// set with [WithRetryAfterLimit] (default one minute) is not waited for and
// the response goes back to the caller. The transport never sleeps past
// the request context's deadline. When a Retry-After would end at or after
// it (or after the in-flight wait), the transport waits what is left,
// less room for one more attempt (twice the longest attempt so far, at
// least 100 ms, before the deadline), and tries once more: the first
// request may well have answered by then. When a wait of its own choosing
// (backoff without a Retry-After) would end at or after the deadline, the
// last response (or error) goes back to the caller at once. When the
// context is cancelled during a wait, RoundTrip returns an error that
// matches the context's error with [errors.Is].
//
// Discarded responses are drained (up to 64 KiB) and closed so their
// connections can be reused. A request body is sent again with
// Request.GetBody; a body without GetBody is read into memory up to the
// buffer limit (default 1 MiB) first, and one longer than that is streamed
// once and never retried.
//
// [WithTrace] reports how many attempts were made, the key sent and whether
// the final answer was a replay; [Replayed] reads the last from a response.
package client
