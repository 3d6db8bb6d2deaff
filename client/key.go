package client

import (
	"context"
	"net/http"
	"strings"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/outkey"
)

// WithKey returns a copy of ctx that makes the Transport send key on the
// requests made with it, on every attempt and on any method (and
// idemgrpc's client interceptor on the calls made with it, the same as its
// own WithKey). A header
// already on the request wins over it. Use it when the key comes from
// elsewhere, for example from the caller's own caller or from a stored
// operation id. An empty key is the same as none.
//
// A key that is not 1 to idemkey.MaxKeyLength (255) printable ASCII
// characters, 0x20 to 0x7E (see idemkey.ValidKey), fails the request with
// an error wrapping idemkey.ErrKeyInvalid, and nothing is sent. A valid key
// is sent with idemkey.FormatKey: bare when the bare form carries it
// unchanged (as Stripe's clients send keys), otherwise as a quoted
// structured-field string (a key with a comma, a double quote, or a space
// at either end), which an idemkey server reads back as the same key.
func WithKey(ctx context.Context, key string) context.Context {
	return outkey.WithKey(ctx, key)
}

// WithCallName returns a copy of ctx that names the outbound calls made with
// it. While serving a request that carries an incoming key (see
// idemkey.FromContext), the Transport sends the key derived from it with
// this name, idemkey.Key.Derive(name), on any method: the same on every
// retry of the incoming request, different for different names. Without an
// incoming key the name has no effect. An empty name is the same as none.
// The name is idemgrpc.WithCallName's too: it names a gRPC call made with
// ctx alike.
func WithCallName(ctx context.Context, name string) context.Context {
	return outkey.WithCallName(ctx, name)
}

// chooseKey picks the key of the logical request req. It returns the key
// ("" for none) and whether the transport must set the header (false when
// the caller's own header is on the request). The caller's header is sent
// as it is; the key reported for it is the one it carries (unquoted), or
// its first value when it cannot be read, which the server will refuse.
func (t *Transport) chooseKey(req *http.Request, method string) (key string, set bool, err error) {
	if vs := req.Header.Values(t.header); len(vs) > 0 {
		if k, err := idemkey.ParseKey(vs); err == nil {
			return k, false, nil
		}
		return strings.TrimSpace(vs[0]), false, nil
	}
	if k, ok := t.redirectedKey(req, method); ok {
		return k, true, nil
	}
	ctx := req.Context()
	if k, err := outkey.Asked(ctx); err != nil || k != "" {
		if err != nil {
			return "", false, errorf("%w", err)
		}
		return k, true, nil
	}
	if !t.autoKey || !idemkey.Mutation(method) {
		return "", false, nil
	}
	if in, hasIn := idemkey.FromContext(ctx); hasIn {
		return in.Derive(endpointName(method, req)), true, nil
	}
	k := t.newKey()
	if !idemkey.ValidKey(k) {
		return "", false, errorf("key from the key generator: %w", idemkey.ErrKeyInvalid)
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

// redirectedKey returns the key the transport sent with the request that
// req follows when req is http.Client following a 307 or 308 redirect: the
// same logical request sent again (same method, same body) to another
// URL, which must keep its key. A 301, 302 or 303 that changes the method
// starts a new request, which gets its own key (or none, as a GET).
func (t *Transport) redirectedKey(req *http.Request, method string) (string, bool) {
	prev := req.Response
	if prev == nil || prev.Request == nil || methodOf(prev.Request) != method {
		return "", false
	}
	switch prev.StatusCode {
	case http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
	default:
		return "", false
	}
	k, err := idemkey.ParseKey(prev.Request.Header.Values(t.header))
	if err != nil {
		return "", false
	}
	return k, true
}
