package postgres

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
)

// ErrUnreadable reports a row this version cannot read: a header block in
// a format it does not know (written by a later version), or damaged. It
// does not wrap store.ErrUnavailable: the database answered, and a retry
// finds the same row until it expires. The handler must not run for such a
// key, since the row may hold a kept response.
var ErrUnreadable = errors.New("idemkey: postgres: stored record in an unknown format")

// The header column holds a kept response's headers as one block: a
// version byte (headerV1), then, for each name in sorted order,
//
//	name length u16 | name | value count u16 | (value length u32 | value)*
//
// with integers big-endian. A response without headers has a NULL column.
const headerV1 = 0x01

// encodeHeader returns h as a header block, or nil when h is empty.
func encodeHeader(h http.Header) ([]byte, error) {
	if len(h) == 0 {
		return nil, nil
	}
	names := make([]string, 0, len(h))
	size := 1
	for name, vals := range h {
		if len(name) > 0xffff || len(vals) > 0xffff {
			return nil, fmt.Errorf("idemkey: postgres: header %.40q too large to keep", name)
		}
		names = append(names, name)
		size += 2 + len(name) + 2
		for _, v := range vals {
			if uint64(len(v)) > 0xffffffff {
				return nil, fmt.Errorf("idemkey: postgres: header %.40q too large to keep", name)
			}
			size += 4 + len(v)
		}
	}
	slices.Sort(names)
	b := make([]byte, 0, size)
	b = append(b, headerV1)
	for _, name := range names {
		vals := h[name]
		b = binary.BigEndian.AppendUint16(b, uint16(len(name)))
		b = append(b, name...)
		b = binary.BigEndian.AppendUint16(b, uint16(len(vals)))
		for _, v := range vals {
			b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
			b = append(b, v...)
		}
	}
	return b, nil
}

// decodeHeader reads a header block; nil or empty is no header.
func decodeHeader(b []byte) (http.Header, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if b[0] != headerV1 {
		return nil, fmt.Errorf("%w: header block version %#x", ErrUnreadable, b[0])
	}
	r := reader{b: b[1:]}
	// Count first, so that every value of the header shares one array.
	nNames, nVals := 0, 0
	for !r.done() {
		if r.skip(int(r.u16())); r.err {
			break
		}
		n := int(r.u16())
		for range n {
			r.skip(int(r.u32()))
		}
		nNames++
		nVals += n
		if r.err {
			break
		}
	}
	if r.err {
		return nil, fmt.Errorf("%w: header block of %d bytes is cut short", ErrUnreadable, len(b))
	}
	h := make(http.Header, nNames)
	vals := make([]string, nVals)
	r = reader{b: b[1:]}
	prev := ""
	for !r.done() {
		name := string(r.bytes(int(r.u16())))
		if name == "" || name <= prev {
			// The encoder writes names sorted, each once: anything else
			// was not written by it.
			return nil, fmt.Errorf("%w: header name %.40q empty, repeated or out of order", ErrUnreadable, name)
		}
		prev = name
		n := int(r.u16())
		vs := vals[:n:n]
		vals = vals[n:]
		for i := range vs {
			vs[i] = string(r.bytes(int(r.u32())))
		}
		h[name] = vs
	}
	return h, nil
}

// reader reads a header block; err is set, and reads return zero values,
// once a read runs past the end.
type reader struct {
	b   []byte
	err bool
}

func (r *reader) done() bool { return len(r.b) == 0 || r.err }

func (r *reader) bytes(n int) []byte {
	if r.err || n > len(r.b) {
		r.err = true
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) skip(n int) { r.bytes(n) }

func (r *reader) u16() uint16 {
	v := r.bytes(2)
	if v == nil {
		return 0
	}
	return binary.BigEndian.Uint16(v)
}

func (r *reader) u32() uint32 {
	v := r.bytes(4)
	if v == nil {
		return 0
	}
	return binary.BigEndian.Uint32(v)
}
