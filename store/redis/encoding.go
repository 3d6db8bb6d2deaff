package redis

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/idemkey/idemkey/store"
)

// The stored value of a key starts with one tag byte: the high four bits are
// the format version, the low four the kind (1 in flight, 2 record). The
// store tells a claim from a record by the kind alone, so every version
// keeps that rule. Integers are big-endian, times Unix nanoseconds (0 for
// the zero time).
//
//	in flight, v2: tag 0x21 | token length u8 | token | fingerprint [32] |
//	               created-at i64 | expires-at i64 | 'w', when a repeat waits
//	record, v2:    tag 0x22 | token length u8 | token | flags u8 | status u16 |
//	               fingerprint [32] | raw digest [32], when flag bit 1 |
//	               created-at i64 | completed-at i64 |
//	               header block length u32 | header block | body (every byte to the end)
//
// and, read but no longer written:
//
//	in flight, v1: tag 0x11 | token length u8 | token | fingerprint [32] | created-at i64
//	record, v1:    tag 0x12 | flags u8 | status u16 | fingerprint [32] |
//	               created-at i64 | completed-at i64 | header block length u32 |
//	               header block | body
//
// The header block holds the header names in sorted order, each as name
// length u16 | name | value count u16 | (value length u32 | value)*. Flag
// bit 0 marks a body that was omitted; flag bit 1 a record that keeps the
// digest of its request's raw bytes (store.Record.RawDigest), which then
// follows the fingerprint. A record without one (a zero RawDigest) is
// written without the flag and the 32 bytes, as before the flag existed,
// so that instances of an earlier release read it; they refuse a record
// with the flag as ErrUnreadable.
//
// Both kinds open with their owner: tag, token length and token. The scripts
// compare that prefix to the caller's, so one comparison checks both what
// the key holds and that the caller holds it: complete keeps a record only
// over the caller's claim, and recognises the caller's own record (kept by
// a first call whose reply was lost) as done.
//
// A repeat that waits for a claim (Wait) marks it with one byte at its end
// (mark.lua), so that the complete and release scripts publish the claim's
// end on the wake channel only when someone waits for it. Releases before
// the mark read a marked claim as ErrUnreadable.
//
// A claim carries its own expiry (the claimer's clock; extend rewrites it
// with SETRANGE), so that the claim, a plain SET ... NX GET, learns how long
// another request's claim has left from the value alone, with no PTTL.
const (
	kindInFlight = 0x1
	kindRecord   = 0x2

	tagInFlightV1 = 0x10 | kindInFlight
	tagRecordV1   = 0x10 | kindRecord
	tagInFlightV2 = 0x20 | kindInFlight
	tagRecordV2   = 0x20 | kindRecord

	waitMark = 'w' // the byte a waiter appends to a version 2 claim

	flagBodyOmitted = 1 << 0
	flagRawDigest   = 1 << 1

	inFlightFixed   = 32 + 8 + 8             // fingerprint, created-at, expires-at after the owner
	inFlightV1Fixed = 32 + 8                 // fingerprint, created-at after the owner
	expiresOffset   = 32 + 8                 // of expires-at, after the owner
	recordFixed     = 1 + 2 + 32 + 8 + 8 + 4 // flags up to the header block, after the owner, without a raw digest
)

// MaxTokenLen is the longest owner token the store accepts, in bytes.
const MaxTokenLen = 255

// ErrUnreadable reports a stored value this version cannot read: written by
// a later version of the format, or damaged. It does not wrap
// store.ErrUnavailable: the backend answered, and a retry finds the same
// value until it expires. The handler must not run for such a key, since
// the value may be a kept response.
var ErrUnreadable = errors.New("idemkey: redis: stored value in an unknown format")

// ownerPrefix returns the bytes an in-flight value held by token starts
// with.
func ownerPrefix(token string) []byte {
	b := make([]byte, 0, 2+len(token))
	return appendOwner(b, tagInFlightV2, token)
}

func appendOwner(b []byte, tag byte, token string) []byte {
	b = append(b, tag, byte(len(token)))
	return append(b, token...)
}

// cutOwner splits the owner (tag, token length, token) off the front of v
// and returns the token.
func cutOwner(v string) (token, rest string, ok bool) {
	if len(v) < 2 || len(v)-2 < int(v[1]) {
		return "", v, false
	}
	n := 2 + int(v[1])
	return v[2:n], v[n:], true
}

func checkToken(token string) error {
	if len(token) == 0 || len(token) > MaxTokenLen {
		return fmt.Errorf("idemkey: redis: owner token of %d bytes, want 1 to %d", len(token), MaxTokenLen)
	}
	return nil
}

// encodeInFlight returns the value of a claim, in the current format
// (version 2).
func encodeInFlight(token string, fp [32]byte, created, expires time.Time) []byte {
	b := make([]byte, 0, 2+len(token)+inFlightFixed)
	b = appendOwner(b, tagInFlightV2, token)
	b = append(b, fp[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(unixNano(created)))
	return appendTime(b, expires)
}

func appendTime(b []byte, t time.Time) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(unixNano(t)))
}

// inFlight is a decoded claim.
type inFlight struct {
	token       string
	fingerprint [32]byte
	created     time.Time
	// expires is when the claim's life ends, on the claimer's clock; zero
	// for a version 1 claim, which does not say.
	expires time.Time
}

// decodeInFlight reads a claim's value, of either version.
func decodeInFlight(v string) (inFlight, error) {
	var f inFlight
	var fixed int
	switch {
	case len(v) == 0:
		return f, unreadable(v)
	case v[0] == tagInFlightV2:
		fixed = inFlightFixed
	case v[0] == tagInFlightV1:
		fixed = inFlightV1Fixed
	default:
		return f, unreadable(v)
	}
	token, rest, ok := cutOwner(v)
	if ok && fixed == inFlightFixed && len(rest) == fixed+1 && rest[fixed] == waitMark {
		rest = rest[:fixed] // marked by a waiter (mark.lua)
	}
	if !ok || len(rest) != fixed {
		return f, fmt.Errorf("%w: claim of %d bytes", ErrUnreadable, len(v))
	}
	f.token = token
	copy(f.fingerprint[:], rest[:32])
	f.created = fromUnixNano(int64(be64(rest[32:])))
	if fixed == inFlightFixed {
		f.expires = fromUnixNano(int64(be64(rest[expiresOffset:])))
	}
	return f, nil
}

// encodeRecord returns the value of a response kept under token, in the
// current format (version 2).
func encodeRecord(rec *store.Record, token string) ([]byte, error) {
	if rec.Status < 0 || rec.Status > 0xffff {
		return nil, fmt.Errorf("idemkey: redis: status %d out of range", rec.Status)
	}
	names := make([]string, 0, len(rec.Header))
	head := 2 + len(token) + recordFixed
	raw := rec.RawDigest != [32]byte{}
	if raw {
		head += len(rec.RawDigest)
	}
	size := head + len(rec.Body)
	for name, vals := range rec.Header {
		if len(name) > 0xffff || len(vals) > 0xffff {
			return nil, fmt.Errorf("idemkey: redis: header %.40q too large to keep", name)
		}
		names = append(names, name)
		size += 2 + len(name) + 2
		for _, v := range vals {
			size += 4 + len(v)
		}
	}
	slices.Sort(names)
	b := make([]byte, 0, size)
	b = appendOwner(b, tagRecordV2, token)
	var flags byte
	if rec.BodyOmitted {
		flags |= flagBodyOmitted
	}
	if raw {
		flags |= flagRawDigest
	}
	b = append(b, flags)
	b = binary.BigEndian.AppendUint16(b, uint16(rec.Status))
	b = append(b, rec.Fingerprint[:]...)
	if raw {
		b = append(b, rec.RawDigest[:]...)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(unixNano(rec.CreatedAt)))
	b = binary.BigEndian.AppendUint64(b, uint64(unixNano(rec.CompletedAt)))
	b = append(b, 0, 0, 0, 0) // header block length, set below
	for _, name := range names {
		vals := rec.Header[name]
		b = binary.BigEndian.AppendUint16(b, uint16(len(name)))
		b = append(b, name...)
		b = binary.BigEndian.AppendUint16(b, uint16(len(vals)))
		for _, v := range vals {
			b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
			b = append(b, v...)
		}
	}
	hlen := len(b) - head
	if uint64(hlen) > 0xffffffff {
		return nil, errors.New("idemkey: redis: headers too large to keep")
	}
	binary.BigEndian.PutUint32(b[head-4:], uint32(hlen))
	return append(b, rec.Body...), nil
}

// decodeRecord reads a kept response, of either version, and returns the
// token it was kept under ("" for version 1, which did not keep it). Header
// names and values share the memory of v; the body is a copy.
func decodeRecord(v string) (rec *store.Record, token string, err error) {
	var rest string
	switch {
	case len(v) == 0:
		return nil, "", unreadable(v)
	case v[0] == tagRecordV2:
		var ok bool
		if token, rest, ok = cutOwner(v); !ok {
			return nil, "", fmt.Errorf("%w: record of %d bytes", ErrUnreadable, len(v))
		}
	case v[0] == tagRecordV1:
		rest = v[1:]
	default:
		return nil, "", unreadable(v)
	}
	rec, err = decodeRecordFields(rest)
	if err != nil {
		return nil, "", err
	}
	return rec, token, nil
}

// decodeRecordFields reads a record from its flags to the end: the part
// every version shares.
func decodeRecordFields(v string) (*store.Record, error) {
	if len(v) < recordFixed {
		return nil, fmt.Errorf("%w: record cut short", ErrUnreadable)
	}
	flags := v[0]
	if flags&^(flagBodyOmitted|flagRawDigest) != 0 {
		return nil, fmt.Errorf("%w: record flags %#x", ErrUnreadable, flags)
	}
	rec := &store.Record{
		Status:      int(be16(v[1:])),
		BodyOmitted: flags&flagBodyOmitted != 0,
	}
	copy(rec.Fingerprint[:], v[3:35])
	o := 35 // created-at
	if flags&flagRawDigest != 0 {
		if len(v) < recordFixed+len(rec.RawDigest) {
			return nil, fmt.Errorf("%w: record cut short", ErrUnreadable)
		}
		o += copy(rec.RawDigest[:], v[o:])
	}
	rec.CreatedAt = fromUnixNano(int64(be64(v[o:])))
	rec.CompletedAt = fromUnixNano(int64(be64(v[o+8:])))
	fixed := o + 20 // the header block
	hlen := uint64(be32(v[o+16:]))
	if hlen > uint64(len(v)-fixed) {
		return nil, fmt.Errorf("%w: header block overruns the record", ErrUnreadable)
	}
	h := v[fixed : fixed+int(hlen)]
	body := v[fixed+int(hlen):]
	if len(h) > 0 {
		rec.Header = make(http.Header)
	}
	for len(h) > 0 {
		var name string
		var ok bool
		if name, h, ok = cut16(h); !ok || len(h) < 2 {
			return nil, fmt.Errorf("%w: header block cut short", ErrUnreadable)
		}
		n := int(be16(h))
		h = h[2:]
		if n > len(h)/4 { // every value takes at least 4 bytes
			return nil, fmt.Errorf("%w: header block cut short", ErrUnreadable)
		}
		vals := make([]string, n)
		for i := range vals {
			if vals[i], h, ok = cut32(h); !ok {
				return nil, fmt.Errorf("%w: header block cut short", ErrUnreadable)
			}
		}
		rec.Header[name] = vals
	}
	if len(body) > 0 {
		rec.Body = []byte(body)
	}
	return rec, nil
}

func unreadable(v string) error {
	if len(v) == 0 {
		return fmt.Errorf("%w: empty value", ErrUnreadable)
	}
	return fmt.Errorf("%w: tag %#02x", ErrUnreadable, v[0])
}

// cut16 splits a u16-length-prefixed string off the front of s.
func cut16(s string) (field, rest string, ok bool) {
	if len(s) < 2 {
		return "", s, false
	}
	n := int(be16(s))
	if len(s)-2 < n {
		return "", s, false
	}
	return s[2 : 2+n], s[2+n:], true
}

// cut32 splits a u32-length-prefixed string off the front of s.
func cut32(s string) (field, rest string, ok bool) {
	if len(s) < 4 {
		return "", s, false
	}
	n := uint64(be32(s))
	if uint64(len(s)-4) < n {
		return "", s, false
	}
	return s[4 : 4+n], s[4+n:], true
}

func be16(s string) uint16 { return uint16(s[0])<<8 | uint16(s[1]) }

func be32(s string) uint32 {
	return uint32(s[0])<<24 | uint32(s[1])<<16 | uint32(s[2])<<8 | uint32(s[3])
}

func be64(s string) uint64 { return uint64(be32(s))<<32 | uint64(be32(s[4:])) }

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
