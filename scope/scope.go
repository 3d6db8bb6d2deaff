// Package scope decides whose namespace an idempotency key lives in.
//
// Two callers who happen to send the same key must never see each other's
// responses, so every key is stored under the caller's scope: a signed-in
// caller's user id, or Anonymous on a route anyone may call.
//
// A scope must come from something the caller has proven, such as the
// principal an authentication middleware put into the request context.
// Never derive it from spoofable input. A client IP is shared by everyone
// behind one NAT or proxy (so strangers would share keys) and changes for a
// mobile client between a try and its retry (so the retry would run again);
// X-Forwarded-For is set by the client. An unauthenticated header such as
// X-User-Id lets anyone read another caller's kept responses by sending that
// caller's id with a guessed or leaked key.
package scope

import (
	"context"
	"net/http"
	"strings"
)

// Anonymous is the scope of a caller who is not signed in.
const Anonymous = "anonymous"

// Of returns the scope of the signed-in caller id. It is id itself, except
// for the ids that could be taken for another kind of scope: Anonymous,
// and (so that the mapping stays one to one) any id that starts with a NUL
// byte, which get a NUL byte put in front. So no caller, whatever their id,
// shares the namespace of callers who are not signed in, and two different
// ids never share one.
func Of(id string) string {
	if id == Anonymous || strings.HasPrefix(id, "\x00") {
		return "\x00" + id
	}
	return id
}

// Func returns the scope of a request: Anonymous, or Of the caller's id. It
// runs after authentication, so it can read the principal from the request
// context. A Func that returns a caller's id without Of lets a caller named
// "anonymous" into the namespace of callers who are not signed in. It must
// not return "": the middleware answers such a request 500 scope_missing
// and reports it (middleware.EventScopeMissing) rather than put the caller
// in another's namespace. Return Anonymous for a caller who is not signed
// in.
type Func func(r *http.Request) string

type principalKey struct{}

// NewContext returns a copy of ctx that carries the signed-in caller's id.
// An authentication middleware calls it once it has verified the caller.
func NewContext(ctx context.Context, principal string) context.Context {
	return context.WithValue(ctx, principalKey{}, principal)
}

// FromContext returns the caller's id stored by NewContext, and whether
// there was a non-empty one.
func FromContext(ctx context.Context) (string, bool) {
	p, ok := ctx.Value(principalKey{}).(string)
	return p, ok && p != ""
}

// Principal is the default Func: Of the caller's id stored in the request
// context by NewContext, or Anonymous when there is none.
func Principal(r *http.Request) string {
	if p, ok := FromContext(r.Context()); ok {
		return Of(p)
	}
	return Anonymous
}

// Static returns a Func that puts every request in the scope s; Static(Anonymous)
// suits a service where every route is open to anyone.
func Static(s string) Func {
	return func(*http.Request) string { return s }
}

// FromContextValue returns a Func that reads the caller's id from the
// context value stored under key by the service's own authentication
// middleware: Of that id, or Anonymous when the value is missing, not a
// string or empty.
func FromContextValue(key any) Func {
	return func(r *http.Request) string {
		if s, ok := r.Context().Value(key).(string); ok && s != "" {
			return Of(s)
		}
		return Anonymous
	}
}
