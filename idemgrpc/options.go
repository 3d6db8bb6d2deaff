package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/idemkey/idemkey/internal/keylife"
	"github.com/idemkey/idemkey/internal/neverkept"
	"github.com/idemkey/idemkey/internal/option"
	"github.com/idemkey/idemkey/scope"
)

// Defaults. Each option's doc comment says which one it replaces. They are
// those of package middleware, so that a service with an HTTP and a gRPC
// front door gives its keys the same lives on both.
const (
	DefaultDeadline  = keylife.DefaultDeadline  // 30 seconds
	DefaultRetention = keylife.DefaultRetention // 24 hours

	// ClaimMargin is added to a call's deadline to give a claim's life: a
	// call that never finishes lets go of its key this long after its
	// deadline. 5 seconds.
	ClaimMargin = keylife.ClaimMargin

	// MetadataKey is the metadata entry that carries the key, lower-case
	// as gRPC metadata names are.
	MetadataKey = "idempotency-key"

	// MetadataReplayed is the header entry a replayed answer carries, with
	// the value "true".
	MetadataReplayed = "idempotent-replayed"
)

// Mode says whether a method takes a key.
type Mode uint8

// The modes of a method.
const (
	// Off: the method passes straight through and touches no store, key
	// or not (a read, or a method idempotent by itself).
	Off Mode = iota + 1
	// Optional: a call with a key runs once per key; a call without one
	// runs with no idempotency at all (on a transactional store, in a
	// transaction of its own, so the handler's code is the same).
	Optional
	// Required: a call without a key is refused with INVALID_ARGUMENT.
	Required
)

var modeNames = [...]string{"invalid", "off", "optional", "required"}

// String returns the mode's name: "off", "optional" or "required".
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return modeNames[0]
}

// Method is the configuration of one method, as Server.Method reads it
// back (for documentation, or a check at start-up).
type Method struct {
	Mode Mode
	// Deadline bounds the handler's context when the call's own deadline
	// is later or absent; the claim lives the shorter of the two plus
	// ClaimMargin.
	Deadline time.Duration
}

// KeyFunc reads a call's key from its request message, for a service whose
// messages carry the key in a field other than request_id or
// idempotency_key. It returns the key ("" for none) and the name of the
// message's top-level field that carried it ("" when none did), which the
// fingerprint leaves out, so that the same request sent with its key in
// metadata instead has the same fingerprint. It must not change req.
type KeyFunc func(ctx context.Context, fullMethod string, req proto.Message) (key, field string)

// ScopeFunc names the caller's scope (the namespace its keys live in) from
// the call's context. It must return a scope for every call:
// scope.Anonymous for a caller who is not signed in.
type ScopeFunc func(ctx context.Context) string

// Principal is the default ScopeFunc: the caller id the service's
// authentication interceptor stored with scope.NewContext (through
// scope.Of, so no caller's id aliases the anonymous scope), or
// scope.Anonymous.
func Principal(ctx context.Context) string {
	if p, ok := scope.FromContext(ctx); ok {
		return scope.Of(p)
	}
	return scope.Anonymous
}

// An Option configures a Server. NewServer applies options in order (a
// later option of a kind overrides an earlier one, except WithMethod,
// which sets one method each time, and WithObserver, which adds), fills
// in the defaults of what no option set, and returns an error naming
// every invalid value and nil option. No option panics.
type Option func(*config) error

type config struct {
	keylife.Lives // the deadline, retention and store timeout
	defaultMode   Mode
	methods       map[string]Method
	keyFields     []string
	keyFunc       KeyFunc
	scope         ScopeFunc
	keep          func(codes.Code) bool
	keepMetadata  func(name string) bool
	observers     []Observer
	maxResponse   int
}

// DefaultKeyFields are the request fields a key is read from, when the
// request message has one of them as a top-level string field: AIP-155's
// request_id and AEP-155's idempotency_key.
var DefaultKeyFields = []string{"request_id", "idempotency_key"}

// DefaultMaxResponse is the largest response message, marshalled, that is
// kept for replay: 4 MiB, grpc-go's default limit on a received message;
// see WithMaxResponse.
const DefaultMaxResponse = 4 << 20

// WithDefault sets the mode of methods that WithMethod does not name.
// Default: Optional, so a call that carries a key runs once per key and
// one that carries none runs as it would without the interceptor.
func WithDefault(m Mode) Option {
	return func(c *config) error {
		if m < Off || m > Required {
			return fmt.Errorf("WithDefault(%d): not a mode", m)
		}
		c.defaultMode = m
		return nil
	}
}

// WithDeadline sets the deadline of methods that do not set their own
// (WithMethod with a positive deadline). Default: DefaultDeadline (30 s).
func WithDeadline(d time.Duration) Option {
	return func(c *config) error {
		return c.SetDeadline(d)
	}
}

// WithMethod sets the mode of one method, by its full name
// ("/package.Service/Method", as grpc.UnaryServerInfo.FullMethod gives
// it), and its deadline: 0 for WithDeadline's.
func WithMethod(fullMethod string, m Mode, deadline time.Duration) Option {
	return func(c *config) error {
		if !validMethodName(fullMethod) {
			return fmt.Errorf("WithMethod(%q): not a full method name (/package.Service/Method)", fullMethod)
		}
		if m < Off || m > Required {
			return fmt.Errorf("WithMethod(%q, %d): not a mode", fullMethod, m)
		}
		if deadline < 0 {
			return fmt.Errorf("WithMethod(%q, %v): the deadline must not be negative", fullMethod, deadline)
		}
		if c.methods == nil {
			c.methods = make(map[string]Method)
		}
		c.methods[fullMethod] = Method{Mode: m, Deadline: deadline}
		return nil
	}
}

func validMethodName(s string) bool {
	if !strings.HasPrefix(s, "/") {
		return false
	}
	svc, name, ok := strings.Cut(s[1:], "/")
	return ok && svc != "" && name != "" && !strings.Contains(name, "/")
}

// WithKeyFields sets the names of the top-level string fields a key is
// read from, in the order tried. Default: DefaultKeyFields. No names reads
// the key from metadata alone.
func WithKeyFields(names ...string) Option {
	return func(c *config) error {
		for _, n := range names {
			if n == "" {
				return errors.New("WithKeyFields: an empty field name")
			}
		}
		c.keyFields = append([]string{}, names...)
		return nil
	}
}

// WithKeyFunc reads the key from the request message with f instead of
// from the fields of WithKeyFields. Default: none.
func WithKeyFunc(f KeyFunc) Option {
	return func(c *config) error {
		if f == nil {
			return errors.New("WithKeyFunc(nil): the function must not be nil")
		}
		c.keyFunc = f
		return nil
	}
}

// WithScope sets how the caller's scope is found. Default: Principal.
// Never derive a scope from spoofable input (a peer address, metadata
// that no authentication checked); see package scope. A call for which f
// returns "" is refused with INTERNAL, as a misconfiguration.
func WithScope(f ScopeFunc) Option {
	return func(c *config) error {
		if f == nil {
			return errors.New("WithScope(nil): the function must not be nil")
		}
		c.scope = f
		return nil
	}
}

// WithRetention sets how long a kept answer is replayed. Default:
// DefaultRetention (24 hours).
func WithRetention(d time.Duration) Option {
	return func(c *config) error {
		return c.SetRetention(d)
	}
}

// WithStoreTimeout bounds each store call (claim, keep, release) by d, on
// top of the store's own budget; a claim that runs out of time answers
// UNAVAILABLE. Default: 0, the store's own budget alone.
func WithStoreTimeout(d time.Duration) Option {
	return func(c *config) error {
		return c.SetStoreTimeout(d)
	}
}

// WithKeep sets which status codes of a handler's answer are kept and
// replayed; the others release the key, so that a retry runs again.
// Default: DefaultKeep.
func WithKeep(f func(codes.Code) bool) Option {
	return func(c *config) error {
		if f == nil {
			return errors.New("WithKeep(nil): the function must not be nil")
		}
		c.keep = f
		return nil
	}
}

// WithKeepMetadata sets which header and trailer entries of an answer, by
// lower-case name, are kept and replayed. Default: DefaultKeepMetadata.
// Entries gRPC reserves (grpc-*, pseudo-headers) and idemkey's own are
// never kept, whatever f says.
func WithKeepMetadata(f func(name string) bool) Option {
	return func(c *config) error {
		if f == nil {
			return errors.New("WithKeepMetadata(nil): the function must not be nil")
		}
		c.keepMetadata = f
		return nil
	}
}

// WithMaxResponse sets the largest marshalled response message kept for
// replay, in bytes. A larger answer is sent as it is and its key is kept
// with the message omitted: a repeat is answered FAILED_PRECONDITION with
// an ErrorInfo whose reason is IDEMPOTENT_RESPONSE_OMITTED (the call ran
// and succeeded; its answer cannot be sent again), and the handler never
// runs again. Default (and 0): DefaultMaxResponse.
func WithMaxResponse(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("WithMaxResponse(%d): the limit must not be negative", n)
		}
		c.maxResponse = n
		return nil
	}
}

// WithObserver adds an observer of every decision. Default: none, and
// then store errors and lost ownership are logged to slog.Default at Warn.
func WithObserver(o Observer) Option {
	return func(c *config) error {
		if o == nil {
			return errors.New("WithObserver(nil): the observer must not be nil")
		}
		c.observers = append(c.observers, o)
		return nil
	}
}

// DefaultKeep keeps OK and the caller's errors, which a retry would get
// again (INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
// FAILED_PRECONDITION, OUT_OF_RANGE, UNAUTHENTICATED), and releases every
// other code: the transient and the server's own (UNAVAILABLE, INTERNAL,
// UNKNOWN, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, CANCELED,
// UNIMPLEMENTED, DATA_LOSS).
func DefaultKeep(c codes.Code) bool {
	switch c {
	case codes.OK, codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unauthenticated:
		return true
	}
	return false
}

// neverKeptMetadata lists the entries DefaultKeepMetadata refuses by
// their whole name, and neverKeptPrefixes by the start of it: the per-call
// and trace-context headers both front doors refuse (package neverkept).
var (
	neverKeptMetadata = func() map[string]bool {
		m := map[string]bool{}
		for _, n := range neverkept.Names() {
			m[n] = true
		}
		return m
	}()
	neverKeptPrefixes = neverkept.Prefixes()
)

// DefaultKeepMetadata reports whether a header or trailer entry, by
// lower-case name, is kept: everything except per-call values (date,
// set-cookie, x-request-id, server-timing) and trace context (traceparent,
// tracestate, traceresponse, baggage, B3 in both forms, Jaeger's
// uber-trace-id, AWS X-Ray, Google Cloud, grpc-trace-bin, Sentry): the
// entries package middleware's DefaultKeepHeader refuses as HTTP headers.
func DefaultKeepMetadata(name string) bool {
	if neverKeptMetadata[name] {
		return false
	}
	for _, p := range neverKeptPrefixes {
		if strings.HasPrefix(name, p) {
			return false
		}
	}
	return true
}

// reservedMetadata reports the entries that are never kept: gRPC's own
// (grpc-*, pseudo-headers, content-type, te, user-agent) and idemkey's.
func reservedMetadata(name string) bool {
	switch name {
	case "content-type", "te", "user-agent", MetadataReplayed, MetadataKey:
		return true
	}
	return strings.HasPrefix(name, "grpc-") || strings.HasPrefix(name, ":")
}

func newConfig(opts []Option) (*config, error) {
	c := &config{}
	if err := option.Apply("idemkey: idemgrpc", c, opts); err != nil {
		return nil, err
	}
	if c.defaultMode == 0 {
		c.defaultMode = Optional
	}
	c.Fill()
	if c.keyFields == nil {
		c.keyFields = DefaultKeyFields
	}
	if c.scope == nil {
		c.scope = Principal
	}
	if c.keep == nil {
		c.keep = DefaultKeep
	}
	if c.keepMetadata == nil {
		c.keepMetadata = DefaultKeepMetadata
	}
	if c.maxResponse == 0 {
		c.maxResponse = DefaultMaxResponse
	}
	return c, nil
}

// method returns the configuration of fullMethod.
func (c *config) method(fullMethod string) Method {
	m, ok := c.methods[fullMethod]
	if !ok {
		m.Mode = c.defaultMode
	}
	if m.Deadline == 0 {
		m.Deadline = c.Deadline
	}
	return m
}
