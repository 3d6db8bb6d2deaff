package sqlcore

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// LockIDs returns the 64-bit lock ids of a claim (PostgreSQL's advisory
// locks): the key's, and the key's with the request's fingerprint. Both
// are an FNV-1a hash of the table and the key (then the fingerprint), so
// that two stores on different tables never share them; computed in
// place, without allocating.
func LockIDs(table, key string, fp [32]byte) (int64, int64) {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(table); i++ {
		h = (h ^ uint64(table[i])) * prime
	}
	h *= prime // the 0 byte between table and key
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * prime
	}
	l1 := h
	for _, b := range fp {
		h = (h ^ uint64(b)) * prime
	}
	return int64(l1), int64(h)
}

// LockName is a named lock's name (MySQL's): "idemkey:" and 56 hex digits
// of a SHA-256 over the length-prefixed parts, 64 characters, MySQL's
// limit. Named locks are the server's, shared by every database on it, so
// the parts should start with the database and the table.
func LockName(parts ...[]byte) string {
	h := sha256.New()
	var n [4]byte
	for _, p := range parts {
		binary.BigEndian.PutUint32(n[:], uint32(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	return "idemkey:" + hex.EncodeToString(h.Sum(nil)[:28])
}
