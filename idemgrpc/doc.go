// Package idemgrpc gives unary gRPC calls the promise package middleware
// gives HTTP mutations: a call retried with the same idempotency key runs
// its handler once, and every repeat gets the first run's answer. It runs
// the same flow over the same stores (store.Store, and a store.TxStore's
// transaction), so one service can serve HTTP and gRPC from one store.
//
// # Server
//
// NewServer(store, opts...) builds the interceptor;
// Server.UnaryServerInterceptor is a grpc.UnaryServerInterceptor that
// composes with grpc.ChainUnaryInterceptor. Put it after the interceptor
// that authenticates the caller (the scope needs the principal, put in
// the context with scope.NewContext) and after those that validate or
// limit requests; put recovery, logging and tracing interceptors outside
// it. Each method, by full name, is Required, Optional or Off
// (WithMethod; WithDefault for the rest, Optional unless set).
//
// The key comes from the idempotency-key metadata entry, read and
// validated as the HTTP Idempotency-Key header is (idemkey.ParseKey: 1 to
// 255 printable ASCII characters, one entry), or from the request
// message: a top-level string field named request_id (AIP-155) or
// idempotency_key (AEP-155) (WithKeyFields), or what a function the
// service gives reads (WithKeyFunc). When both carry a key they must be
// the same key. The scope is the caller's, as on HTTP (Principal, or
// WithScope).
//
// The fingerprint is a SHA-256 over the full method name and the request
// message as the server decoded it, marshalled deterministically
// (proto.MarshalOptions{Deterministic: true}), so that clients in
// different languages that send the same message agree. When the key was
// read from the message, its field's records are dropped from the top
// level of that encoding before it is hashed, which leaves the encoding of
// the message with the field cleared; the message is neither copied nor
// changed (the handler gets the request as it came). So the same request
// with its key in metadata is the same request.
//
// # The answers
//
//	situation                                  answer
//	a kept answer, same request                the kept response message, or the kept status
//	                                           (code, message, details); the kept headers and
//	                                           trailers; header idempotent-replayed: true
//	in flight, same request                    ABORTED, ErrorInfo IDEMPOTENCY_KEY_IN_FLIGHT and a
//	                                           RetryInfo: the Retry-After hint of package
//	                                           middleware (recent first runs of the method), in
//	                                           whole seconds, at least 1
//	a different request under the key          FAILED_PRECONDITION, ErrorInfo IDEMPOTENCY_KEY_REUSED
//	  (in flight or kept)
//	no key on a Required method                INVALID_ARGUMENT, ErrorInfo IDEMPOTENCY_KEY_MISSING
//	a malformed key, two metadata entries,     INVALID_ARGUMENT, ErrorInfo IDEMPOTENCY_KEY_INVALID
//	  or metadata and field disagree
//	the store unavailable or full              UNAVAILABLE, ErrorInfo IDEMPOTENCY_STORE_UNAVAILABLE,
//	                                           RetryInfo 1 s; the handler does not run
//	a failed commit of a transactional store   UNAVAILABLE, never the handler's answer
//	a kept answer that cannot be read          INTERNAL; the handler does not run
//	  (a message type this binary lacks)
//	a kept answer whose message was over       FAILED_PRECONDITION, ErrorInfo
//	  WithMaxResponse                          IDEMPOTENT_RESPONSE_OMITTED
//
// ErrorInfo details carry the domain ErrorDomain. Every refusal is made
// before the handler runs; none echoes the key or the message.
//
// When the handler returns, its answer is kept or released by its code
// (WithKeep; DefaultKeep):
//
//	kept (replayed to every repeat)     OK, INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS,
//	                                    PERMISSION_DENIED, FAILED_PRECONDITION, OUT_OF_RANGE,
//	                                    UNAUTHENTICATED
//	released (a retry runs again)       UNAVAILABLE, INTERNAL, UNKNOWN, DEADLINE_EXCEEDED,
//	                                    RESOURCE_EXHAUSTED, ABORTED, CANCELED, UNIMPLEMENTED,
//	                                    DATA_LOSS, an error that is not a status, and panics
//	                                    (released, then re-raised)
//
// The answer is kept before the interceptor returns it, so a client that
// has seen it can never be told the call is in flight. Keeping and
// releasing use a context detached from the call's cancellation: a client
// that hangs up does not stop the answer from being kept. A keep that
// fails on a plain store leaves the claim to lapse (a repeat within its
// life gets ABORTED, after it the handler may run again), as on HTTP.
// Headers and trailers the handler sets (grpc.SetHeader, grpc.SendHeader,
// grpc.SetTrailer) are kept, less gRPC's own entries and per-call ones
// (WithKeepMetadata; DefaultKeepMetadata).
//
// # Deadlines
//
// The handler's context ends at the shorter of the call's deadline and the
// method's (WithMethod, WithDeadline; 30 s by default), and the claim lives
// that plus ClaimMargin. On a store.Extender the claim is extended every
// third of its life while the handler runs.
//
// # Transactions
//
// On a store.TxStore (store/postgres, store/mysql) the handler runs in the
// transaction the claim opened: postgres.Tx(ctx), postgres.SQLTx(ctx) and
// mysql.Tx(ctx) give it to gRPC handlers exactly as to HTTP ones, and the
// kept answer commits with the handler's writes. A released code or a
// panic rolls them back. A call without a key on an Optional method runs
// in a transaction of its own, committed unless its code is released.
//
// # How an answer is kept
//
// A kept answer is a store.Record: Body holds the response message
// marshalled, Header its type's full name (the replay unmarshals into
// that type, found in the protobuf registry), the status of a non-OK
// answer as a marshalled google.rpc.Status, and the kept header and
// trailer entries, all under names beginning Idemgrpc-. Status holds the
// HTTP status the code maps to (OK 200, INVALID_ARGUMENT 400, NOT_FOUND
// 404 and so on), so a transactional store treats a kept caller's error
// as a kept HTTP 4xx: its writes are undone unless the store was built to
// commit them (postgres.WithClientErrorWrites).
//
// # Streaming
//
// Streaming methods are not covered: the package has no stream
// interceptor. A replay must give the client what the first run gave, but
// a stream's answer is many messages, interleaved with the client's own in
// a bidirectional stream; what the server sent depends on what the client
// sent and when, and a retried stream may send different messages. There
// is no one answer to keep. Make the mutation a unary method (a stream
// can carry an operation's progress, keyed by the operation's id), or
// give each message of a client stream its own key and apply it through a
// unary call or the store and flow of this package by hand.
//
// # Client
//
// NewClient builds the client interceptor; Client.UnaryClientInterceptor
// is a grpc.UnaryClientInterceptor. It gives each logical call one key
// (the caller's own metadata entry, the request's key field, WithKey's,
// one derived from the key of the call or request being served, as
// package client does for HTTP, or a new one) and puts it into the
// outgoing metadata once, so that grpc-go's service-config retries and
// transparent retries resend the same key. It retries keyed calls itself
// on UNAVAILABLE and ABORTED, waiting the RetryInfo delay when the answer
// has one and backing off with jitter when not, within the call's
// deadline.
package idemgrpc
