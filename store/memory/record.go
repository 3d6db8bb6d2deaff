package memory

import (
	"encoding/binary"
	"net/http"
	"slices"
	"time"
	"unsafe"

	"github.com/idemkey/idemkey/store"
)

// A kept record is one byte slice, so that the garbage collector has one
// object to mark per record, with nothing inside it to follow, instead of
// the record, its header map, every name and value, the body and the token:
//
//	uvarint   token length, then the owner's token
//	uvarint   number of header names, then uvarint number of header values
//	varint    status
//	byte      flags (flagBodyOmitted, flagNoCreatedAt, flagNoCompletedAt,
//	          flagRawDigest)
//	32 bytes  the RawDigest, when flagRawDigest
//	varint    CreatedAt's Unix seconds, then uvarint its nanoseconds,
//	          unless flagNoCreatedAt; the same for CompletedAt
//	uvarint   length of the header section, then the section: per name,
//	          uvarint length, name, uvarint number of values, then per
//	          value uvarint length, value
//	          the body: the rest
//
// The fingerprint is in the entry, beside the slice.

const (
	flagBodyOmitted = 1 << iota
	flagNoCreatedAt
	flagNoCompletedAt
	flagRawDigest
)

// uvarintLen returns how many bytes binary.AppendUvarint writes for v.
func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// varintLen returns how many bytes binary.AppendVarint writes for v.
func varintLen(v int64) int {
	u := uint64(v) << 1
	if v < 0 {
		u = ^u
	}
	return uvarintLen(u)
}

func timeLen(t time.Time) int {
	if t.IsZero() {
		return 0
	}
	return varintLen(t.Unix()) + uvarintLen(uint64(t.Nanosecond()))
}

func appendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return b
	}
	b = binary.AppendVarint(b, t.Unix())
	return binary.AppendUvarint(b, uint64(t.Nanosecond()))
}

// headerLen returns the length of h's header section, and how many values
// it holds.
func headerLen(h http.Header) (n, values int) {
	for k, vs := range h {
		n += uvarintLen(uint64(len(k))) + len(k) + uvarintLen(uint64(len(vs)))
		for _, v := range vs {
			n += uvarintLen(uint64(len(v))) + len(v)
		}
		values += len(vs)
	}
	return n, values
}

// encode returns rec, kept under token, as one byte slice.
func encode(token string, rec *store.Record) []byte {
	hlen, values := headerLen(rec.Header)
	size := uvarintLen(uint64(len(token))) + len(token) +
		uvarintLen(uint64(len(rec.Header))) + uvarintLen(uint64(values)) +
		varintLen(int64(rec.Status)) + 1 + rawLen(rec) +
		timeLen(rec.CreatedAt) + timeLen(rec.CompletedAt) +
		uvarintLen(uint64(hlen)) + hlen +
		len(rec.Body)
	// slices.Grow rounds the capacity up to the allocation's size class,
	// so cap(b) is what the record takes on the heap.
	b := slices.Grow([]byte(nil), size)
	b = binary.AppendUvarint(b, uint64(len(token)))
	b = append(b, token...)
	b = binary.AppendUvarint(b, uint64(len(rec.Header)))
	b = binary.AppendUvarint(b, uint64(values))
	b = binary.AppendVarint(b, int64(rec.Status))
	var flags byte
	if rec.BodyOmitted {
		flags |= flagBodyOmitted
	}
	if rec.CreatedAt.IsZero() {
		flags |= flagNoCreatedAt
	}
	if rec.CompletedAt.IsZero() {
		flags |= flagNoCompletedAt
	}
	if rawLen(rec) > 0 {
		flags |= flagRawDigest
	}
	b = append(b, flags)
	if flags&flagRawDigest != 0 {
		b = append(b, rec.RawDigest[:]...)
	}
	b = appendTime(b, rec.CreatedAt)
	b = appendTime(b, rec.CompletedAt)
	b = binary.AppendUvarint(b, uint64(hlen))
	for k, vs := range rec.Header {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return append(b, rec.Body...)
}

// rawLen returns how many bytes rec's RawDigest takes encoded: none when
// it is zero (not kept).
func rawLen(rec *store.Record) int {
	if rec.RawDigest == ([32]byte{}) {
		return 0
	}
	return len(rec.RawDigest)
}

// reader reads the fields of an encoded record in order. The record was
// made by encode, so it is never malformed.
type reader struct {
	b []byte
	i int
}

func (r *reader) uvarint() int {
	if b := r.b[r.i]; b < 0x80 { // most lengths and counts are short
		r.i++
		return int(b)
	}
	v, n := binary.Uvarint(r.b[r.i:])
	r.i += n
	return int(v)
}

func (r *reader) varint() int64 {
	v, n := binary.Varint(r.b[r.i:])
	r.i += n
	return v
}

func (r *reader) time(absent bool) time.Time {
	if absent {
		return time.Time{}
	}
	sec := r.varint()
	return time.Unix(sec, int64(r.uvarint()))
}

// tokenOf returns the owner's token of an encoded record, as a slice of it.
func tokenOf(b []byte) []byte {
	r := reader{b: b}
	n := r.uvarint()
	return b[r.i : r.i+n]
}

// smallRecord is a decoded record and the array of its header's values in
// one allocation, for the usual header of a few values.
type smallRecord struct {
	rec    store.Record
	values [4]string
}

// decode returns the record that b encodes, with fingerprint fp. The
// record and its header are new; the body is a slice of b, clipped.
func decode(b []byte, fp [32]byte) *store.Record {
	r := reader{b: b}
	r.i += r.uvarint() // the token
	names, values := r.uvarint(), r.uvarint()
	var rec *store.Record
	var all []string
	if values <= len(smallRecord{}.values) {
		sr := new(smallRecord)
		rec, all = &sr.rec, sr.values[:values]
	} else {
		rec, all = new(store.Record), make([]string, values)
	}
	rec.Status = int(r.varint())
	rec.Fingerprint = fp
	flags := b[r.i]
	r.i++
	rec.BodyOmitted = flags&flagBodyOmitted != 0
	if flags&flagRawDigest != 0 {
		r.i += copy(rec.RawDigest[:], b[r.i:])
	}
	rec.CreatedAt = r.time(flags&flagNoCreatedAt != 0)
	rec.CompletedAt = r.time(flags&flagNoCompletedAt != 0)
	hlen := r.uvarint()
	if names > 0 {
		rec.Header = decodeHeader(b[r.i:r.i+hlen], names, all)
	}
	r.i += hlen
	if r.i < len(b) {
		rec.Body = b[r.i:len(b):len(b)]
	}
	return rec
}

// decodeHeader returns the header of the given number of names that the
// header section b encodes, with its values in all. Every name and value is
// a substring of b itself, read as a string without a copy: b is part of a
// kept record's bytes, which nothing writes to once encode made them (the
// store replaces an entry's slice, never changes it, and the Body a decoded
// record shares is clipped to the body, after the header section), so the
// strings never change, as Go's strings must not. Every value slice is a
// clipped part of all.
func decodeHeader(b []byte, names int, all []string) http.Header {
	s := unsafe.String(unsafe.SliceData(b), len(b))
	r := reader{b: b}
	h := make(http.Header, names)
	for range names {
		n := r.uvarint()
		k := s[r.i : r.i+n]
		r.i += n
		count := r.uvarint()
		vs := all[:count:count]
		all = all[count:]
		for j := range vs {
			n := r.uvarint()
			vs[j] = s[r.i : r.i+n]
			r.i += n
		}
		h[k] = vs
	}
	return h
}
