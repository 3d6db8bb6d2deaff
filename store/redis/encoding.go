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
// the format version, the low four the kind. The claim script tells an
// in-flight claim from a record by the kind alone (tag%16 == kindInFlight),
// so a later version keeps that rule.
//
// Version 1 layouts (integers big-endian, times in Unix nanoseconds, 0 for
// the zero time):
//
//	in flight: tag 0x11 | token length u8 | token | fingerprint [32] | created-at i64
//	record:    tag 0x12 | flags u8 | status u16 | fingerprint [32] |
//	           created-at i64 | completed-at i64 | header block length u32 |
//	           header block | body (every byte to the end)
//
// The header block holds the header names in sorted order, each as name
// length u16 | name | value count u16 | (value length u32 | value)*. Flag
// bit 0 marks a body that was omitted.
//
// The in-flight value opens with its owner: tag, token length and token.
// The scripts compare that prefix to the caller's, so one comparison checks
// both that the key is in flight and that the caller holds it.
const (
	kindInFlight = 0x1
	kindRecord   = 0x2

	tagInFlightV1 = 0x10 | kindInFlight
	tagRecordV1   = 0x10 | kindRecord

	flagBodyOmitted = 1 << 0

	// MaxTokenLen is the longest owner token the store accepts, in bytes.
	MaxTokenLen = 255

	inFlightFixed = 32 + 8                     // fingerprint, created-at after the token
	recordFixed   = 1 + 1 + 2 + 32 + 8 + 8 + 4 // up to the header block
)

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
	return appendOwner(b, token)
}

func appendOwner(b []byte, token string) []byte {
	b = append(b, tagInFlightV1, byte(len(token)))
	return append(b, token...)
}

func checkToken(token string) error {
	if len(token) == 0 || len(token) > MaxTokenLen {
		return fmt.Errorf("idemkey: redis: owner token of %d bytes, want 1 to %d", len(token), MaxTokenLen)
	}
	return nil
}

// encodeInFlight returns the value of a claim.
func encodeInFlight(token string, fp [32]byte, created time.Time) []byte {
	b := make([]byte, 0, 2+len(token)+inFlightFixed)
	b = appendOwner(b, token)
	b = append(b, fp[:]...)
	return binary.BigEndian.AppendUint64(b, uint64(unixNano(created)))
}

// inFlight is a decoded claim.
type inFlight struct {
	token       string
	fingerprint [32]byte
	created     time.Time
}

// decodeInFlight reads a claim's value.
func decodeInFlight(v string) (inFlight, error) {
	var f inFlight
	if len(v) < 2 || v[0] != tagInFlightV1 {
		return f, unreadable(v)
	}
	n := int(v[1])
	if len(v) != 2+n+inFlightFixed {
		return f, fmt.Errorf("%w: claim of %d bytes", ErrUnreadable, len(v))
	}
	f.token = v[2 : 2+n]
	rest := v[2+n:]
	copy(f.fingerprint[:], rest[:32])
	f.created = fromUnixNano(int64(be64(rest[32:])))
	return f, nil
}

// encodeRecord returns the value of a kept response.
func encodeRecord(rec *store.Record) ([]byte, error) {
	if rec.Status < 0 || rec.Status > 0xffff {
		return nil, fmt.Errorf("idemkey: redis: status %d out of range", rec.Status)
	}
	names := make([]string, 0, len(rec.Header))
	size := recordFixed + len(rec.Body)
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
	b := make([]byte, recordFixed, size)
	b[0] = tagRecordV1
	if rec.BodyOmitted {
		b[1] = flagBodyOmitted
	}
	binary.BigEndian.PutUint16(b[2:], uint16(rec.Status))
	copy(b[4:36], rec.Fingerprint[:])
	binary.BigEndian.PutUint64(b[36:], uint64(unixNano(rec.CreatedAt)))
	binary.BigEndian.PutUint64(b[44:], uint64(unixNano(rec.CompletedAt)))
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
	hlen := len(b) - recordFixed
	if uint64(hlen) > 0xffffffff {
		return nil, errors.New("idemkey: redis: headers too large to keep")
	}
	binary.BigEndian.PutUint32(b[52:], uint32(hlen))
	return append(b, rec.Body...), nil
}

// decodeRecord reads a kept response. Header names and values share the
// memory of v; the body is a copy.
func decodeRecord(v string) (*store.Record, error) {
	if len(v) == 0 || v[0] != tagRecordV1 {
		return nil, unreadable(v)
	}
	if len(v) < recordFixed {
		return nil, fmt.Errorf("%w: record of %d bytes", ErrUnreadable, len(v))
	}
	flags := v[1]
	if flags&^flagBodyOmitted != 0 {
		return nil, fmt.Errorf("%w: record flags %#x", ErrUnreadable, flags)
	}
	rec := &store.Record{
		Status:      int(be16(v[2:])),
		BodyOmitted: flags&flagBodyOmitted != 0,
		CreatedAt:   fromUnixNano(int64(be64(v[36:]))),
		CompletedAt: fromUnixNano(int64(be64(v[44:]))),
	}
	copy(rec.Fingerprint[:], v[4:36])
	hlen := uint64(be32(v[52:]))
	if hlen > uint64(len(v)-recordFixed) {
		return nil, fmt.Errorf("%w: header block overruns the record", ErrUnreadable)
	}
	h := v[recordFixed : recordFixed+int(hlen)]
	body := v[recordFixed+int(hlen):]
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
