package middleware

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"

	"github.com/google/uuid"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/store"
)

// Request ids and owner tokens: every response to a covered request with
// a key carries X-Request-Id (see the package documentation), and every
// claim a fresh owner token; a request that needs both gets them from one
// read of crypto/rand, in one string.

// setRequestID gives the response to r its request id (see requestID),
// unless it has one already. slot, when not nil, is where the value slice
// lives, so that setting it allocates nothing; fresh is as for requestID.
func (m *Middleware) setRequestID(w http.ResponseWriter, r *http.Request, slot *[1]string, fresh string) {
	h := w.Header()
	if len(h[idemkey.HeaderRequestID]) > 0 {
		return
	}
	id := m.requestID(w, r, fresh)
	if id == "" {
		return
	}
	if slot == nil {
		slot = new([1]string)
	}
	slot[0] = id
	h[idemkey.HeaderRequestID] = slot[:]
}

// requestID returns the id of the request a response answers: the one the
// service's request-id middleware already set on the response, else the
// request's own X-Request-Id when it is 1 to 200 visible ASCII characters,
// else a new random UUID (or "" under WithoutNewRequestID): fresh, when
// not "", which newToken made with the owner token.
func (m *Middleware) requestID(w http.ResponseWriter, r *http.Request, fresh string) string {
	if id := givenRequestID(w, r); id != "" || m.cfg.noNewRequestID {
		return id
	}
	if fresh != "" {
		return fresh
	}
	return newRequestID()
}

// givenRequestID returns the request id requestID takes from the response
// or the request, or "" when it would make one.
func givenRequestID(w http.ResponseWriter, r *http.Request) string {
	if v := w.Header()[idemkey.HeaderRequestID]; len(v) > 0 && v[0] != "" {
		return v[0]
	}
	if id := headerValue(r.Header, idemkey.HeaderRequestID); saneRequestID(id) {
		return id
	}
	return ""
}

// needsNewRequestID reports whether requestID, asked now, would make a new
// id.
func (m *Middleware) needsNewRequestID(w http.ResponseWriter, r *http.Request) bool {
	return !m.cfg.noNewRequestID && givenRequestID(w, r) == ""
}

func saneRequestID(id string) bool {
	if id == "" || len(id) > 200 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// newRequestID returns a random (version 4) UUID, as uuid.NewString does,
// in one allocation instead of two.
func newRequestID() string {
	var u uuid.UUID
	rand.Read(u[:])
	u[6] = (u[6] & 0x0f) | 0x40 // version 4
	u[8] = (u[8] & 0x3f) | 0x80 // variant 10
	return u.String()
}

// base32 is the alphabet of crypto/rand.Text, RFC 4648's.
const base32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"

// tokenLen is the length of an owner token: crypto/rand.Text's, 26
// characters of 5 random bits each.
const tokenLen = 26

// newToken returns a fresh owner token, written as crypto/rand.Text writes
// one, and, when withID, a new request id (a random version 4 UUID, as
// newRequestID makes). Both come from one read of crypto/rand and live in
// one string: a request that needs both pays for one allocation. (Not from
// a generator of the process's own: a process cloned with its memory, a
// virtual machine's snapshot restored twice, would repeat its tokens in
// every clone, and a claim that finds its own token runs as its owner; the
// kernel's generator is reseeded on restore.)
func newToken(withID bool) (token, id string) {
	var b [tokenLen + 36]byte
	s := string(appendToken(b[:0], withID))
	return s[:tokenLen], s[tokenLen:]
}

// names returns the store key name of the key in its scope (store.KeyName),
// a fresh owner token and, when withID, a new request id (as newToken
// makes them), in one string: one allocation for the three.
func names(scope, key string, withID bool) (skey, token, id string) {
	var b [store.KeyNameLen + tokenLen + 36]byte
	k := store.AppendKeyName(b[:0], scope, key)
	s := string(appendToken(k, withID))
	n := len(k)
	return s[:n], s[n : n+tokenLen], s[n+tokenLen:]
}

// appendToken appends a fresh owner token and, when withID, a new request
// id to dst, which must have room for both.
func appendToken(dst []byte, withID bool) []byte {
	var src [tokenLen + 16]byte
	if withID {
		rand.Read(src[:])
	} else {
		rand.Read(src[:tokenLen])
	}
	at := len(dst)
	dst = dst[:at+tokenLen]
	for i := range tokenLen {
		dst[at+i] = base32[src[i]%32]
	}
	if !withID {
		return dst
	}
	u := src[tokenLen:]
	u[6] = (u[6] & 0x0f) | 0x40 // version 4
	u[8] = (u[8] & 0x3f) | 0x80 // variant 10
	dst = dst[:at+tokenLen+36]
	x := dst[at+tokenLen:]
	hex.Encode(x[0:8], u[0:4])
	x[8] = '-'
	hex.Encode(x[9:13], u[4:6])
	x[13] = '-'
	hex.Encode(x[14:18], u[6:8])
	x[18] = '-'
	hex.Encode(x[19:23], u[8:10])
	x[23] = '-'
	hex.Encode(x[24:], u[10:])
	return dst
}
