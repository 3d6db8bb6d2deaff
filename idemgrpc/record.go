package idemgrpc

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemkey/idemkey/store"
)

// A kept answer is a store.Record, so that every store keeps gRPC answers
// as it keeps HTTP ones:
//
//   - Status is the HTTP status that the gRPC code maps to (OK 200,
//     INVALID_ARGUMENT, FAILED_PRECONDITION and OUT_OF_RANGE 400,
//     UNAUTHENTICATED 401, PERMISSION_DENIED 403, NOT_FOUND 404,
//     ALREADY_EXISTS 409, anything else 500), so that a transactional
//     store treats the answer as it treats that HTTP answer (a kept 4xx
//     undoes the handler's writes unless the store was told otherwise).
//     The replay does not read it.
//   - Body is the response message, marshalled, for OK; empty otherwise.
//   - Header holds the rest, under names no HTTP record uses:
//     Idemgrpc-Type, the full name of the response message's type (OK);
//     Idemgrpc-Status, the google.rpc.Status (code, message, details)
//     marshalled and base64-encoded (any other code);
//     Idemgrpc-H-<name> and Idemgrpc-T-<name>, the header and trailer
//     entries kept, values of binary (-bin) entries base64-encoded.
const (
	recType    = "Idemgrpc-Type"
	recStatus  = "Idemgrpc-Status"
	recHeader  = "Idemgrpc-H-"
	recTrailer = "Idemgrpc-T-"
)

var b64 = base64.StdEncoding

// httpStatus is the HTTP status a kept record of code carries.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists:
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

// answer is what a handler answered, or what is replayed.
type answer struct {
	resp    any
	st      *status.Status
	header  metadata.MD
	trailer metadata.MD
}

// record makes the record of a, keeping the metadata keep accepts. A
// response message over max bytes is left out (BodyOmitted). It fails
// when the response is not a protobuf message.
func record(a *answer, keep func(string) bool, max int) (*store.Record, error) {
	rec := &store.Record{Status: httpStatus(a.st.Code()), Header: make(http.Header, 2+len(a.header)+len(a.trailer))}
	if a.st.Code() == codes.OK {
		m, ok := a.resp.(proto.Message)
		if !ok || m == nil || !m.ProtoReflect().IsValid() {
			return nil, fmt.Errorf("idemkey: idemgrpc: the response is %T, not a protobuf message", a.resp)
		}
		b, err := proto.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("idemkey: idemgrpc: marshal the response: %w", err)
		}
		if len(b) > max {
			rec.BodyOmitted = true
		} else {
			rec.Body = b
		}
		rec.Header[recType] = []string{string(m.ProtoReflect().Descriptor().FullName())}
	} else {
		b, err := proto.Marshal(a.st.Proto())
		if err != nil {
			return nil, fmt.Errorf("idemkey: idemgrpc: marshal the status: %w", err)
		}
		rec.Header[recStatus] = []string{b64.EncodeToString(b)}
	}
	putMetadata(rec.Header, recHeader, a.header, keep)
	putMetadata(rec.Header, recTrailer, a.trailer, keep)
	return rec, nil
}

func putMetadata(h http.Header, prefix string, md metadata.MD, keep func(string) bool) {
	for name, vals := range md {
		name = strings.ToLower(name)
		if len(vals) == 0 || reservedMetadata(name) || !keep(name) {
			continue
		}
		out := make([]string, len(vals))
		for i, v := range vals {
			if strings.HasSuffix(name, "-bin") {
				v = b64.EncodeToString([]byte(v))
			}
			out[i] = v
		}
		h[prefix+name] = append(h[prefix+name], out...)
	}
}

// errUnreadable: a record this package cannot replay (not written by it,
// or of a message type this binary does not know). The handler must not
// run: the record may hold an answer.
var errUnreadable = errors.New("idemkey: idemgrpc: kept record cannot be replayed")

// errOmitted: the record's response message was over the limit and not
// kept.
var errOmitted = errors.New("idemkey: idemgrpc: kept response omitted")

// replayOf reads the answer a record keeps.
func replayOf(rec *store.Record) (*answer, error) {
	a := &answer{header: metadata.MD{}, trailer: metadata.MD{}}
	for name, vals := range rec.Header {
		var md metadata.MD
		var n string
		switch {
		case strings.HasPrefix(name, recHeader):
			md, n = a.header, name[len(recHeader):]
		case strings.HasPrefix(name, recTrailer):
			md, n = a.trailer, name[len(recTrailer):]
		default:
			continue
		}
		for _, v := range vals {
			if strings.HasSuffix(n, "-bin") {
				b, err := b64.DecodeString(v)
				if err != nil {
					return nil, fmt.Errorf("%w: metadata %q: %v", errUnreadable, n, err)
				}
				v = string(b)
			}
			md[n] = append(md[n], v)
		}
	}
	if s := rec.Header[recStatus]; len(s) == 1 {
		b, err := b64.DecodeString(s[0])
		if err != nil {
			return nil, fmt.Errorf("%w: status: %v", errUnreadable, err)
		}
		var p spb.Status
		if err := proto.Unmarshal(b, &p); err != nil {
			return nil, fmt.Errorf("%w: status: %v", errUnreadable, err)
		}
		a.st = status.FromProto(&p)
		return a, nil
	}
	t := rec.Header[recType]
	if len(t) != 1 {
		return nil, fmt.Errorf("%w: no answer in the record", errUnreadable)
	}
	if rec.BodyOmitted {
		return a, errOmitted
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(t[0]))
	if err != nil {
		return nil, fmt.Errorf("%w: response type %q: %v", errUnreadable, t[0], err)
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(rec.Body, m); err != nil {
		return nil, fmt.Errorf("%w: response: %v", errUnreadable, err)
	}
	a.resp, a.st = m, status.New(codes.OK, "")
	return a, nil
}
