package memory

import (
	"crypto/sha256"
	"encoding/binary"
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
	if len(name) != nameLen || name[:start] != store.KeyPrefix+"{" || name[nameLen-1] != '}' {
		return d, false
	}
	hex := name[start : nameLen-1]
	valid := uint64(lanes80)
	for i := range len(d) / 4 {
		v, ok := unhex8(load64(hex[8*i:]))
		valid &= ok
		binary.LittleEndian.PutUint32(d[4*i:], v)
	}
	return d, valid == lanes80
}

// Every byte of a uint64 holding the value.
const (
	lanes01 = 0x0101010101010101
	lanes80 = 0x80 * lanes01
)

// load64 returns the first 8 bytes of s, the first the lowest.
func load64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// unhex8 decodes the 8 hex digits in x (the first the lowest byte) into 4
// bytes (the first the lowest). valid has the top bit of each of x's bytes
// set when that byte is a lower-case hex digit, and clear otherwise. Each
// byte of x is worked on at once, in its own 8 bits; a byte of 0x80 or more
// marks itself invalid first, so the carries it may spill into its
// neighbours do not matter.
func unhex8(x uint64) (v uint32, valid uint64) {
	ascii := ^x & lanes80
	// The top bit of (b + 0x80 - lo) is set when b >= lo, for b < 0x80.
	digit := (x + (0x80-'0')*lanes01) &^ (x + (0x80-'9'-1)*lanes01)
	lower := (x + (0x80-'a')*lanes01) &^ (x + (0x80-'f'-1)*lanes01)
	valid = (digit | lower) & ascii
	// '0'-'9' are 0x30-0x39 and 'a'-'f' 0x61-0x66: the low four bits,
	// plus 9 when bit 6 is set.
	n := x&(0x0f*lanes01) + (x>>6&lanes01)*9
	// Pair the digits, the first of each pair the high half of its byte,
	// then gather the four bytes.
	n = (n<<4 | n>>8) & 0x00ff00ff00ff00ff
	n = (n | n>>8) & 0x0000ffff0000ffff
	n = n | n>>16
	return uint32(n), valid
}
