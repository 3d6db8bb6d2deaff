package memory

import (
	"crypto/sha256"
	"io"

	"github.com/idemkey/idemkey/store"
)

// digest is what the store keys its maps by: 32 bytes with no pointer in
// them, so the collector has nothing to mark in a map key.
type digest [sha256.Size]byte

// nameLen is the length of a name store.KeyName makes.
const nameLen = len(store.KeyPrefix) + 2 + 2*sha256.Size

// opaqueDomain starts what digestOf hashes for a name that store.KeyName did
// not make, so that no such name's digest is the digest inside a KeyName.
const opaqueDomain = "idemkey: memory: opaque key name\x00"

// digestOf returns the digest a key name is held under: for a name that
// store.KeyName makes, the SHA-256 it holds in hex; for any other name, a
// SHA-256 of the name. Two different names never share a digest (short of
// a SHA-256 collision).
func digestOf(name string) digest {
	if d, ok := parseName(name); ok {
		return d
	}
	var d digest
	h := sha256.New()
	io.WriteString(h, opaqueDomain)
	io.WriteString(h, name)
	h.Sum(d[:0])
	return d
}

// parseName returns the digest inside a name made by store.KeyName. It
// accepts only what KeyName writes (lower-case hex), so that no two names
// parse to one digest.
func parseName(name string) (d digest, ok bool) {
	const start = len(store.KeyPrefix) + 1
	if len(name) != nameLen || name[:len(store.KeyPrefix)] != store.KeyPrefix || name[start-1] != '{' || name[nameLen-1] != '}' {
		return d, false
	}
	hex := name[start : nameLen-1]
	for i := range d {
		hi, lo := unhex[hex[2*i]], unhex[hex[2*i+1]]
		if hi|lo > 0xf {
			return d, false
		}
		d[i] = hi<<4 | lo
	}
	return d, true
}

// unhex maps a lower-case hex digit to its value, and every other byte to
// 0xff.
var unhex = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for i, c := range "0123456789abcdef" {
		t[c] = byte(i)
	}
	return t
}()
