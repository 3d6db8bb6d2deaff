package client

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/idemkey/idemkey"
)

// ErrInvalidKey is returned, wrapped, by RoundTrip when the key from WithKey
// or from the key generator is not 1 to 255 printable ASCII characters
// (0x20 to 0x7E) other than comma and double quote, with no space at either
// end: the bare form an idemkey server (and Stripe) accepts. Nothing is sent.
var ErrInvalidKey = errors.New("idemkey: client: invalid idempotency key")

type keyContextKey struct{}

type callNameContextKey struct{}

// WithKey returns a copy of ctx that makes the Transport send key on the
// requests made with it, on every attempt and on any method. A header
// already on the request wins over it. Use it when the key comes from
// elsewhere, for example from the caller's own caller or from a stored
// operation id. An empty key is the same as none.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContextKey{}, key)
}

// WithCallName returns a copy of ctx that names the outbound calls made with
// it. While serving a request that carries an incoming key (see
// idemkey.FromContext), the Transport sends the key derived from it with
// this name, idemkey.Key.Derive(name), on any method: the same on every
// retry of the incoming request, different for different names. Without an
// incoming key the name has no effect. An empty name is the same as none.
func WithCallName(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, callNameContextKey{}, name)
}

// autoKeyMethod reports whether method gets an automatic key.
func autoKeyMethod(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// readMethod reports whether method is safe: it changes nothing on the
// server and may be retried without a key.
func readMethod(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// chooseKey picks the key of the logical request req. It returns the key
// ("" for none) and whether the transport must set the header (false when
// the caller's own header is on the request).
func (t *Transport) chooseKey(req *http.Request, method string) (key string, set bool, err error) {
	if vs := req.Header.Values(t.header); len(vs) > 0 {
		return strings.TrimSpace(vs[0]), false, nil
	}
	ctx := req.Context()
	if k, _ := ctx.Value(keyContextKey{}).(string); k != "" {
		if !validKey(k) {
			return "", false, errorf("key from WithKey: %w", ErrInvalidKey)
		}
		return k, true, nil
	}
	in, hasIn := idemkey.FromContext(ctx)
	if hasIn {
		if name, _ := ctx.Value(callNameContextKey{}).(string); name != "" {
			return in.Derive(name), true, nil
		}
	}
	if !t.autoKey || !autoKeyMethod(method) {
		return "", false, nil
	}
	if hasIn {
		return in.Derive(endpointName(method, req)), true, nil
	}
	k := t.newKey()
	if !validKey(k) {
		return "", false, errorf("key from the key generator: %w", ErrInvalidKey)
	}
	return k, true, nil
}

// endpointName names a call that was not named by the caller:
// "METHOD host/path", host lower-cased, path escaped, without the query.
func endpointName(method string, req *http.Request) string {
	host := req.URL.Host
	if host == "" {
		host = req.Host
	}
	return method + " " + strings.ToLower(host) + req.URL.EscapedPath()
}

// validKey reports whether k is 1 to 255 printable ASCII characters other
// than comma and double quote, with no space at either end. A comma would
// read as two header values folded into one, a leading double quote as the
// quoted form.
func validKey(k string) bool {
	if k == "" || len(k) > 255 || k[0] == ' ' || k[len(k)-1] == ' ' {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < 0x20 || c > 0x7e || c == ',' || c == '"' {
			return false
		}
	}
	return true
}
