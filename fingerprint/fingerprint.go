// Package fingerprint computes canonical fingerprints of HTTP requests: the
// digest the idempotency middleware keeps with a key, so that a repeat of
// the key with a different request is told apart from a retry of the same
// one.
//
// The rule a fingerprint holds: two requests a handler could tell apart
// never share a fingerprint, and differences no handler can observe (the
// order of object members, of query parameters or of form pairs with
// different names, insignificant whitespace, the spelling of a string
// escape, the case of a media type) never make two requests differ. Where
// the two pull against each other the first wins: a fingerprint may differ
// for requests a handler would treat alike, never the other way round. So
// JSON members whose names a case-insensitive decoder could take for one
// another ("id" and "ID", or a name and its duplicate) keep their relative
// order (see CanonicalJSON), and a form body keeps its escapes as sent.
//
// # What a fingerprint covers
//
// A fingerprint is SHA-256 over the prefix "idemkey fingerprint v1\n"
// followed by the selected fields in this order, each written as a tag byte,
// its length as a big-endian uint64, and its bytes, so that no two different
// sequences of fields hash the same bytes:
//
//   - Method ('M'): the request method exactly as sent (methods are
//     case-sensitive).
//   - Path ('P'): the escaped path, r.URL.EscapedPath(), as it is: /a%2Fb
//     and /a/b differ, and so do /a and /a/.
//   - Query: the raw query (r.URL.RawQuery) read the way a form body is,
//     escapes kept as sent, without its empty segments (a leading, trailing
//     or doubled '&', which no decoder tells from their absence: a=1& and
//     &a=1 are a=1, a=1&&b=2 is a=1&b=2): two queries share it only when
//     they have the same non-empty '&'-separated segments, byte for byte,
//     in the same order among the segments whose names url.ParseQuery
//     decodes alike. So b=2&a=1
//     and a=1&b=2 are the same, but a=%20 and a=+, a=%41 and a=A, and
//     a=1%26b=2 and a=1&b=2 differ (a handler may read RawQuery), and so do
//     a=1&a=2 and a=2&a=1. A plain query, whose every segment is non-empty,
//     holds a '=' and has no '%', '+' or ';' (and the empty query), is
//     written under the tag 'Q': its pairs sorted by name, the values of
//     one name kept in their order, each name and value length-prefixed,
//     as every query was before. Any other query that url.ParseQuery reads
//     is written under the tag 'S' as a form body is under 'U' (below): the
//     number of '&', then the non-empty segments as sent, length-prefixed,
//     sorted stably by decoded name. A query url.ParseQuery rejects (a ';',
//     a malformed escape) is covered as its raw bytes under the tag 'q'.
//     Until this release every query url.ParseQuery read was written under
//     'Q' decoded, so a fingerprint kept then of a query that was not
//     plain can equal today's of its decoded spelling; and until this one
//     a query's empty segments counted, so a record kept then of a query
//     with one (a=1&) is not found equal to today's repeat of it.
//   - MediaType ('T'): the Content-Type header parsed by RFC 9110: the
//     length-prefixed type/subtype in lower case, then its parameters sorted
//     by name as for Query (names in lower case; quoted values without their
//     quotes, backslash escapes kept as written; the charset value in lower
//     case). Parameters are kept, not dropped: a charset changes what the
//     body's bytes say, a multipart boundary where it splits. A header that
//     does not parse is covered as its raw value under the tag 't', and its
//     body as raw bytes. A missing header is the empty media type.
//   - Content encoding ('E'), part of MediaType, written only when the
//     request has a Content-Encoding header, so that the fingerprints of
//     requests without one are what they were before it was covered: each
//     header line in order, length-prefixed, holding the line's
//     comma-separated codings in order, each length-prefixed without the
//     spaces and tabs around it. Nothing else is normalised, because
//     handlers tell more apart than RFC 9110 does: request decompressors
//     commonly test Header.Get("Content-Encoding") == "gzip", so "GZIP"
//     differs from "gzip", a second header line (which Get does not see)
//     from the same codings on one line, and "gzip," from "gzip". A request
//     with a Content-Encoding has its body covered as raw bytes (tag 'B'),
//     whatever its media type: the media type describes the decoded body,
//     not the bytes as sent.
//   - Body, read by its media type, as one of the next three.
//   - A JSON body (application/json and every +json type): the
//     CanonicalJSON form (tag 'J'); a body that is not valid JSON, or nests
//     deeper than MaxDepth, is covered as its raw bytes under the tag 'j',
//     so it never collides with a valid one.
//   - A form body (application/x-www-form-urlencoded, tag 'U'): the number of '&' in the
//     body as a big-endian uint64, then each non-empty '&'-separated
//     segment exactly as sent, length-prefixed, sorted stably by its name as
//     url.ParseQuery decodes it. Escapes are never decoded, so a+b, a%20b
//     and "a b" stay three bodies (a handler may read the bytes another way
//     than the label says), and segments whose names decode alike (a=1,
//     %61=2) keep their order. Empty segments carry nothing for
//     url.ParseQuery but count against its limit on parameters, hence the
//     count. A form body is covered as its raw bytes under the tag 'f'
//     instead when url.ParseQuery rejects it (a ';', a malformed escape) or
//     when reordering its segments could change what a handler decodes
//     from it: a segment that starts (after JSON whitespace) with what
//     starts a JSON value ('{', '[', '"', '-', a digit, or true, false,
//     null: json.Decoder reads the first value and ignores the rest), a '<'
//     anywhere (encoding/xml reads the first element wherever it is), or a
//     control byte (a form encoder escapes them all). The tag 'F' of
//     earlier releases, which decoded escapes, is never written again.
//   - Any other body: its raw bytes (tag 'B').
//
// An empty body is an empty field, except an empty form, which is its count
// of zero '&'.
//
// The host, the headers other than Content-Type and Content-Encoding, and
// the Idempotency-Key itself are not covered. Fingerprints are kept in the
// store, so this layout is part of the stored format: it changes only with
// the version in the prefix, or by a field or tag that earlier releases
// never wrote, so that no kept fingerprint can equal a new one of a
// different request.
//
// A body's media type and content encoding decide how it is read even when
// MediaType is not selected; the tags keep bodies read different ways apart.
//
// The middleware's local replay cache also hashes the same parts of a
// request without canonicalising them, for a cheap test that a repeat is
// byte for byte a request already seen (see raw.go).
package fingerprint

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"strings"
	"sync"
)

// Func computes the fingerprint of a request whose body has been read in
// full into body. It must not read r.Body, and must be safe for concurrent
// use.
type Func func(r *http.Request, body []byte) [32]byte

// Field selects what a fingerprint covers. Combine fields with '|'.
type Field uint8

// The fields a fingerprint can cover; the package documentation describes
// how each is written.
const (
	// Method is the request method.
	Method Field = 1 << iota
	// Path is the escaped path, r.URL.EscapedPath().
	Path
	// Query is the canonical query: its segments as sent, sorted by name,
	// each name's values in their order.
	Query
	// MediaType is the representation metadata: the canonical
	// Content-Type (type/subtype and parameters) and, when the request has
	// one, the Content-Encoding. Both say what the body's bytes mean, so
	// they are selected together, as the charset is with the media type.
	MediaType
	// Body is the canonical body: JSON and form bodies canonicalised, any
	// other body as its raw bytes.
	Body

	// All is every field; Default covers All.
	All = Method | Path | Query | MediaType | Body
)

var fieldNames = [...]string{"Method", "Path", "Query", "MediaType", "Body"}

// String returns the names of the fields in f joined by '|', such as
// "Method|Path"; "0" for none, and a hex number for bits that name no field.
func (f Field) String() string {
	if f == 0 {
		return "0"
	}
	var b strings.Builder
	for i, name := range fieldNames {
		if f&(1<<i) != 0 {
			if b.Len() > 0 {
				b.WriteByte('|')
			}
			b.WriteString(name)
		}
	}
	if rest := f &^ All; rest != 0 {
		if b.Len() > 0 {
			b.WriteByte('|')
		}
		fmt.Fprintf(&b, "%#x", uint8(rest))
	}
	return b.String()
}

// New returns a Func whose fingerprints cover the selected fields. For
// example New(Method|Path) ignores the query, the media type and the body.
// It returns an error when fields is 0 or has bits that name no field.
func New(fields Field) (Func, error) {
	if fields == 0 {
		return nil, errors.New("idemkey: fingerprint: New: no fields selected")
	}
	if fields&^All != 0 {
		return nil, fmt.Errorf("idemkey: fingerprint: New: unknown fields %#x", uint8(fields&^All))
	}
	return newFunc(fields), nil
}

func newFunc(fields Field) Func {
	return func(r *http.Request, body []byte) [32]byte {
		return sum(fields, readRequest(r, fields), body)
	}
}

// Default covers every field, as New(All) does. It reads the first
// Content-Type header, as net/http does, and every Content-Encoding header.
var Default Func = newFunc(All)

// Sum returns the fingerprint Default computes, from the parts of a request:
// its method, its escaped path (r.URL.EscapedPath()), its raw query
// (r.URL.RawQuery, without '?'), its Content-Type header value ("" when
// there is none), its body, and the values of its Content-Encoding header
// lines in order (none when it has none).
func Sum(method, escapedPath, rawQuery, contentType string, body []byte, contentEncoding ...string) [32]byte {
	return sum(All, request{method, escapedPath, rawQuery, contentType, contentEncoding}, body)
}

// request is everything of a request, other than its body, that a
// fingerprint reads. readRequest is the one place that takes it from an
// http.Request, for every Func of New and for rawDigest.
type request struct {
	method, path, query, contentType string
	contentEncoding                  []string
}

// readRequest reads what the selected fields need of r: the media type and
// the content encoding decide how a body is read, so Body needs them too.
func readRequest(r *http.Request, fields Field) request {
	q := request{method: r.Method}
	if fields&Path != 0 {
		q.path = r.URL.EscapedPath()
	}
	if fields&Query != 0 {
		q.query = r.URL.RawQuery
	}
	if fields&(MediaType|Body) != 0 {
		// Header.Get and Header.Values, for names already canonical: the
		// map read directly, without canonicalising the name each time.
		if v := r.Header["Content-Type"]; len(v) > 0 {
			q.contentType = v[0]
		}
		q.contentEncoding = r.Header["Content-Encoding"]
	}
	return q
}

// prefix starts every hashed input; its version changes whenever the layout
// does.
const prefix = "idemkey fingerprint v1\n"

// Field tags. A lower-case tag marks raw bytes kept because the canonical
// reading failed or would not be safe.
const (
	tagMethod        = 'M'
	tagPath          = 'P'
	tagQuery         = 'Q'
	tagQuerySegments = 'S'
	tagRawQuery      = 'q'
	tagMediaType     = 'T'
	tagRawMediaType  = 't'
	tagEncoding      = 'E'
	tagJSON          = 'J'
	tagRawJSON       = 'j'
	tagForm          = 'U'
	tagRawForm       = 'f'
	tagBody          = 'B'
	// 'F' was the tag of form bodies read with their escapes decoded, which
	// gave bodies a handler tells apart one fingerprint. It is never written
	// again, so no fingerprint kept from that reading can equal one of
	// today's.
)

func appendField[S string | []byte](dst []byte, tag byte, data S) []byte {
	return append(appendFieldHeader(dst, tag, len(data)), data...)
}

func sum(fields Field, q request, body []byte) [32]byte {
	s := getScratch()
	d := s.sum(fields, &q, body)
	putScratch(s)
	return d
}

// scratch holds the buffers of one fingerprint, reused through a pool so
// that a fingerprint in steady state allocates nothing.
type scratch struct {
	h      hash.Hash
	digest [sha256.Size]byte
	head   []byte // everything hashed before the body's bytes
	field  []byte // one canonical field being built
	chunk  []byte // canonical JSON on its way to h
	pairs  pairs
	json   canonJSON
}

var scratchPool = sync.Pool{New: func() any { return &scratch{h: sha256.New()} }}

func getScratch() *scratch { return scratchPool.Get().(*scratch) }

// maxRetained bounds the buffers a pooled scratch keeps, so that one large
// body does not pin its size in memory: 1 MiB each, the middleware's default
// body limit.
const maxRetained = 1 << 20

func putScratch(s *scratch) {
	s.json.src = nil
	for _, b := range []*[]byte{&s.head, &s.field, &s.pairs.buf, &s.json.out, &s.json.fold, &s.chunk} {
		if cap(*b) > maxRetained {
			*b = nil
		}
	}
	if cap(s.json.objs) > maxRetained/32 {
		s.json.objs = nil
	}
	if cap(s.json.sorted) > maxRetained/32 {
		s.json.sorted = nil
	}
	if cap(s.json.mem) > maxRetained/32 {
		s.json.mem = nil
	}
	if cap(s.pairs.list) > maxRetained/32 {
		s.pairs.list = nil
	}
	if cap(s.pairs.segs) > maxRetained/32 {
		s.pairs.segs = nil
	}
	scratchPool.Put(s)
}

func (s *scratch) sum(fields Field, q *request, body []byte) [32]byte {
	b := append(s.head[:0], prefix...)
	if fields&Method != 0 {
		b = appendField(b, tagMethod, q.method)
	}
	if fields&Path != 0 {
		b = appendField(b, tagPath, q.path)
	}
	if fields&Query != 0 {
		query := withoutEmptySegments(q.query)
		switch {
		case plainQuery(query):
			parseQuery(&s.pairs, query)
			s.field = s.pairs.appendSorted(s.field[:0])
			b = appendField(b, tagQuery, s.field)
		case parseQuerySegments(&s.pairs, query):
			s.field = appendSegments(&s.pairs, s.field[:0], query)
			b = appendField(b, tagQuerySegments, s.field)
		default:
			b = appendField(b, tagRawQuery, query)
		}
	}
	kind := rawBody
	if fields&(MediaType|Body) != 0 {
		f, k, ok := parseMediaType(s.field[:0], &s.pairs, q.contentType)
		s.field = f
		kind = k
		if fields&MediaType != 0 {
			if ok {
				b = appendField(b, tagMediaType, f)
			} else {
				b = appendField(b, tagRawMediaType, q.contentType)
			}
			if len(q.contentEncoding) > 0 {
				s.field = appendEncoding(s.field[:0], q.contentEncoding)
				b = appendField(b, tagEncoding, s.field)
			}
		}
		if len(q.contentEncoding) > 0 {
			// The media type says what the body is once decoded; its bytes
			// as sent are read as they are.
			kind = rawBody
		}
	}

	s.h.Reset()
	if fields&Body == 0 {
		s.h.Write(b)
		s.head = b
	} else {
		s.head = s.writeBody(b, kind, body)
	}
	s.h.Sum(s.digest[:0])
	return s.digest
}

// writeBody writes head, then the body field, to s.h, and returns head for
// reuse.
func (s *scratch) writeBody(head []byte, kind bodyKind, body []byte) []byte {
	tag, data := byte(tagBody), body
	switch kind {
	case jsonBody:
		tag = tagRawJSON
		if out, err := s.json.canonicalise(body); err == nil {
			head = appendFieldHeader(head, tagJSON, len(out))
			s.h.Write(head)
			if !s.json.reorder {
				s.h.Write(out)
				return head
			}
			// Reordered members go straight from out to the hash.
			s.json.h = s.h
			s.chunk = s.json.emit(s.chunk[:0], 0, len(out), 0)
			s.json.h = nil
			s.h.Write(s.chunk)
			return head
		}
	case formBody:
		tag = tagRawForm
		if parseForm(&s.pairs, body) {
			s.field = s.pairs.appendForm(s.field[:0], body)
			tag, data = tagForm, s.field
		}
	}
	head = appendFieldHeader(head, tag, len(data))
	s.h.Write(head)
	s.h.Write(data)
	return head
}

func appendFieldHeader(dst []byte, tag byte, n int) []byte {
	dst = append(dst, tag)
	return binary.BigEndian.AppendUint64(dst, uint64(n))
}

// appendEncoding appends the canonical Content-Encoding field: each header
// line in order, length-prefixed, holding the line's comma-separated
// elements in order, each without the spaces and tabs around it and
// length-prefixed. Empty elements are kept, and so is the case of each
// coding and the split into lines (see the package documentation).
func appendEncoding(dst []byte, lines []string) []byte {
	for _, line := range lines {
		at := len(dst)
		dst = binary.BigEndian.AppendUint64(dst, 0)
		for {
			elem, rest, more := strings.Cut(line, ",")
			elem = strings.Trim(elem, " \t")
			dst = binary.BigEndian.AppendUint64(dst, uint64(len(elem)))
			dst = append(dst, elem...)
			if !more {
				break
			}
			line = rest
		}
		binary.BigEndian.PutUint64(dst[at:], uint64(len(dst)-at-8))
	}
	return dst
}
