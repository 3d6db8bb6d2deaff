package payments

import (
	"net/http"
	"strings"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/scope"
)

// Auth is the demo authentication: "Authorization: Bearer <user>" signs the
// caller in as <user>, with no password, and a request without the header
// is anonymous. It stores the user with scope.NewContext, which is where
// the idempotency middleware's default scope reads it, so every user's keys
// live apart. Any other Authorization header gets 401 unauthorized: a user
// name must be 1 to 64 letters, digits, '-', '.', '_' or '~', and not
// "anonymous", the scope of callers who are not signed in.
//
// A real service verifies a token here and stores the id it proves. The
// idempotency middleware must come after this: the scope needs the caller.
func Auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, ok := r.Header["Authorization"]
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		user, ok := bearer(h)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="payments"`)
			writeProblem(w, r, http.StatusUnauthorized, CodeUnauthorized,
				`Send "Authorization: Bearer <user>" with a user name of 1 to 64 letters, digits, '-', '.', '_' or '~', or no Authorization header at all.`)
			return
		}
		next.ServeHTTP(w, r.WithContext(scope.NewContext(r.Context(), user)))
	})
}

// bearer returns the user named by a single "Bearer <user>" header.
func bearer(h []string) (string, bool) {
	if len(h) != 1 {
		return "", false
	}
	scheme, token, ok := strings.Cut(strings.TrimSpace(h[0]), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	if token == "" || len(token) > 64 || token == scope.Anonymous {
		return "", false
	}
	for i := 0; i < len(token); i++ {
		c := token[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '.', c == '_', c == '~':
		default:
			return "", false
		}
	}
	return token, true
}

// user returns the signed-in caller of r, or scope.Anonymous.
func user(r *http.Request) string {
	if u, ok := scope.FromContext(r.Context()); ok {
		return u
	}
	return scope.Anonymous
}

// RequestID gives every response an X-Request-Id: the request's own when it
// is 1 to 200 visible ASCII characters, else a new UUID. It only sets a
// header, so the writer the handlers see keeps all its interfaces. A replay
// carries the repeat's id, never the first request's: the idempotency
// middleware does not keep X-Request-Id.
func RequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(idemkey.HeaderRequestID)
		if !visibleASCII(id, 200) {
			id = uuid.NewString()
		}
		w.Header().Set(idemkey.HeaderRequestID, id)
		next.ServeHTTP(w, r)
	})
}

func visibleASCII(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
