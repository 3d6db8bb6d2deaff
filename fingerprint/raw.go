package fingerprint

import (
	"encoding/binary"
	"net/http"

	"github.com/idemkey/idemkey/internal/rawdigest"
)

func init() { rawdigest.Of = rawDigest }

// rawPrefix starts what rawDigest hashes, so that a raw digest is never
// taken for a fingerprint.
const rawPrefix = "idemkey raw digest v1\n"

// rawDigest returns a SHA-256 over everything Default reads of a request,
// as the request has it, without canonicalising anything: the method, the
// escaped path, the raw query, the first Content-Type header, every
// Content-Encoding header line, and the body, each length-prefixed.
//
// Equal raw digests imply equal Default fingerprints: both read the request
// through one function of this package, so a repeat whose raw digest equals
// that of a request already found to match a kept fingerprint matches it
// too, and its fingerprint (which canonicalises the body, at several times
// the cost) need not be computed. The converse does not hold: requests that
// differ only in key order or whitespace have different raw digests and one
// fingerprint.
//
// The middleware keeps a request's raw digest in its record
// (store.Record.RawDigest) and compares a repeat's with it before building
// the repeat's canonical form; its local replay cache does the same. A
// definition that changes takes a new prefix, so that a raw digest kept
// by an earlier release never equals one of today's: such a repeat is
// then compared by its fingerprint, as a record without a raw digest is.
func rawDigest(r *http.Request, body []byte) [32]byte {
	q := readRequest(r, All)
	s := getScratch()
	b := append(s.head[:0], rawPrefix...)
	for _, part := range [...]string{q.method, q.path, q.query, q.contentType} {
		b = binary.BigEndian.AppendUint64(b, uint64(len(part)))
		b = append(b, part...)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(len(q.contentEncoding)))
	for _, line := range q.contentEncoding {
		b = binary.BigEndian.AppendUint64(b, uint64(len(line)))
		b = append(b, line...)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(len(body)))
	s.h.Reset()
	s.h.Write(b)
	s.h.Write(body)
	s.head = b
	s.h.Sum(s.digest[:0])
	d := s.digest
	putScratch(s)
	return d
}
