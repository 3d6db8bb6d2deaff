package sqlcore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
)

// ErrHeaderBlock is the cause of a header block DecodeHeader cannot read:
// one in a format it does not know (written by a later version), or
// damaged. Each store wraps it in its own ErrUnreadable.
var ErrHeaderBlock = errors.New("header block in an unknown format")

// The header column holds a kept response's headers as one block: a
// version byte (headerV1), then, for each name in sorted order, its length
// and bytes, the number of its values, and each value's length and bytes,
// every number an unsigned varint. A response without headers has a NULL
// column.
const headerV1 = 0x01

// EncodeHeader returns h as a header block, or nil when h is empty.
func EncodeHeader(h http.Header) []byte {
	if len(h) == 0 {
		return nil
	}
	names := make([]string, 0, len(h))
	size := 1
	for name, vals := range h {
		names = append(names, name)
		size += 2*binary.MaxVarintLen32 + len(name)
		for _, v := range vals {
			size += binary.MaxVarintLen32 + len(v)
		}
	}
	slices.Sort(names)
	b := make([]byte, 0, size)
	b = append(b, headerV1)
	for _, name := range names {
		vals := h[name]
		b = binary.AppendUvarint(b, uint64(len(name)))
		b = append(b, name...)
		b = binary.AppendUvarint(b, uint64(len(vals)))
		for _, v := range vals {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return b
}

// DecodeHeader reads a header block; nil or empty is no header. An error
// wraps ErrHeaderBlock.
func DecodeHeader(b []byte) (http.Header, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if b[0] != headerV1 {
		return nil, fmt.Errorf("%w: version %#x", ErrHeaderBlock, b[0])
	}
	rest := b[1:]
	short := fmt.Errorf("%w: %d bytes, cut short", ErrHeaderBlock, len(b))
	// next reads a length and that many bytes.
	next := func() ([]byte, bool) {
		n, w := binary.Uvarint(rest)
		if w <= 0 || n > uint64(len(rest)-w) {
			return nil, false
		}
		v := rest[w : w+int(n)]
		rest = rest[w+int(n):]
		return v, true
	}
	h := http.Header{}
	prev := ""
	for len(rest) > 0 {
		nb, ok := next()
		if !ok {
			return nil, short
		}
		name := string(nb)
		if name == "" || name <= prev {
			// The encoder writes names sorted, each once: anything else
			// was not written by it.
			return nil, fmt.Errorf("%w: header name %.40q empty, repeated or out of order", ErrHeaderBlock, name)
		}
		prev = name
		n, w := binary.Uvarint(rest)
		if w <= 0 || n > uint64(len(rest)) {
			return nil, short
		}
		rest = rest[w:]
		vals := make([]string, 0, n)
		for range n {
			v, ok := next()
			if !ok {
				return nil, short
			}
			vals = append(vals, string(v))
		}
		h[name] = vals
	}
	return h, nil
}
