// Package gateway is the piece in front of a fleet: an [http.RoundTripper]
// over a list of upstream instances that all keep their idempotency records
// in one store, for [httputil.ReverseProxy] or on its own. It fails a keyed
// mutation over to another instance after a lost reply, and never sends an
// unkeyed one twice.
//
//	gw, err := gateway.New([]string{"http://10.0.0.7:8080", "http://10.0.0.8:8080"})
//	if err != nil { ... }
//	http.ListenAndServe(":8090", gw.ReverseProxy())
//
// A keyed mutation is safe not only to send again but to send to a
// different instance: every instance shares the record, so whichever one
// the retry reaches answers with the first result (or 409 while the first
// still runs). Most lost replies happen here, where an instance dies
// mid-request, a deploy drains it, or a connection resets; the gateway
// turns them into a replay instead of an error.
//
// # What is failed over
//
// An attempt either gets a response, or fails before a connection to its
// upstream was made (nothing was sent), or fails after (the request may
// have reached the upstream and run):
//
//	request                      fails, nothing sent       fails, maybe sent               response (any status)
//	                             (refused, no route,       (reset, EOF before the
//	                             DNS, dial timeout,        response, the transport's
//	                             TLS handshake)            ResponseHeaderTimeout)
//	keyed mutation               next upstream             next upstream, same key         passed through
//	                                                       and body                        (409 and 5xx too)
//	unkeyed mutation, or any     next upstream             502 upstream_reply_lost,        passed through
//	other unsafe method                                    not sent again
//	read: GET, HEAD, OPTIONS,    next upstream             next upstream                   passed through
//	TRACE
//
// A keyed mutation is a POST, PUT, PATCH or DELETE ([idemkey.Mutation])
// whose key header ([idemkey.Header] unless [WithHeader]) holds one valid
// key ([idemkey.ParseKey]); [WithCovered] narrows or widens which
// requests count, for fleets where some routes are not behind the
// middleware. A request with a malformed key is unkeyed: the middleware
// refuses it without running anything.
//
// How often and where: each upstream gets at most one attempt per request,
// and a request makes at most [WithMaxAttempts] attempts (default 3), with
// no wait between them and none once the request's context is done (its
// deadline bounds the attempts). The first attempt goes to the next
// healthy upstream in round-robin order, later ones to the healthy ones
// after it, then to those cooling off, the one back soonest first. An
// upstream whose attempt failed without a response cools off for
// [WithCoolOff] (default 10 s): while others are healthy it gets no
// traffic; any response ends its cool-off. A request whose context ends
// does not count against its upstream.
//
// The request body is held in memory so it can be sent again, up to
// [WithMaxRequestBody] (default 1 MiB). A request with a longer body gets one
// attempt, whatever its method and key: the body is streamed and cannot be
// sent again. (A keyed request that long is refused by the middleware's
// default body limit anyway.)
//
// Once an upstream's response headers arrive, the response is the
// request's: a body cut off after that reaches the client cut off (the
// client's retry with the same key gets the replay).
//
// When no attempt got a response the gateway answers itself, with
// problem+json (RFC 9457) like the middleware's: 502 upstream_reply_lost
// when a request that may not be sent twice may have reached an upstream;
// 504 upstream_timeout when the request's deadline passed; 503
// upstream_unavailable with Retry-After: 1 otherwise (every upstream
// refused or failed). RoundTrip returns an error instead only when the
// request's context was cancelled or its body could not be read.
//
// # Nothing sent, or maybe sent
//
// An attempt counts as sent once net/http has a connection for it, which
// it reports through the httptrace GotConn hook before writing a byte of
// the request: an error before that (connection refused, an unresolvable
// name, a dial timeout, a failed TLS handshake) sent nothing, and any
// request may try the next upstream. This is why the transport is an
// *http.Transport ([WithTransport]). The rule leans one way only: an
// attempt whose reused connection broke before the request was written
// also counts as sent, so an unkeyed mutation gets 502 where it could in
// fact have gone elsewhere; never the other way round.
//
// net/http's Transport resends some requests by itself, within one
// attempt, on a new connection when a kept-alive one breaks under them:
// reads, and any request with an Idempotency-Key or X-Idempotency-Key
// header, whatever its value, that has no body or has GetBody. A keyed
// request is safe to resend so. A mutation the gateway counts as unkeyed
// but that carries such a header (a route outside [WithCovered],
// another header name, an invalid key) is sent on a connection of its own,
// never kept alive, and without GetBody, so that it reaches its upstream
// at most once. A keyed request may reach one upstream more than once in
// one attempt this way, always with the same key and body.
//
// # The same rule as the client, and where it differs
//
// After an attempt that may have been sent, the gateway decides with
// [client.Resendable] and [client.RetryableError], the rule
// [client.Transport] applies between its own attempts: reads and keyed
// requests may be sent again, after any transport error but TLS
// certificate and record errors. They differ where the two sit:
//
//   - The client resends to the same URL after a backoff and the server's
//     Retry-After; the gateway resends at once, to another upstream, at
//     most once to each. It never sleeps: holding a request is the
//     client's business, which knows its own deadline.
//   - The client also retries responses (409 after Retry-After, 429, 502,
//     503, 504); the gateway passes every response through. A 409 means
//     the first request with the key is running on some instance, and
//     every instance shares its record, so another would answer 409 too;
//     and retrying at both layers would multiply the attempts (4 × 3).
//   - The client counts as keyed any request it sends a key with, because
//     its caller chose to key it; the gateway did not choose, and counts
//     only the methods the middleware covers by default (or what
//     [WithCovered] says): a keyed request the upstream does not
//     honour would run twice.
//   - When nothing was sent, the gateway tries the next upstream even for
//     an unkeyed mutation: it knows, from its own transport, that nothing
//     left. The client sends an unkeyed mutation once in every case.
//
// # Problems
//
// The gateway's own answers use the middleware's problem shape (type,
// title, status, detail, code, with [idemkey.ProblemTypePrefix]) without
// importing the middleware: the codes are [CodeReplyLost],
// [CodeUnavailable] and [CodeTimeout], and, from [Gateway.ReverseProxy]'s
// error handler, [idemkey.CodeBodyUnreadable] and [idemkey.CodeRequestTooLarge].
package gateway
