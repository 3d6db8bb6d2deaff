package idemgrpc

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/heartbeat"
	"github.com/idemkey/idemkey/internal/storecall"
	"github.com/idemkey/idemkey/store"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo details the
// interceptor's own refusals carry.
const ErrorDomain = "idemkey"

// The reasons of the google.rpc.ErrorInfo details the interceptor's own
// refusals carry.
const (
	ReasonKeyMissing       = "IDEMPOTENCY_KEY_MISSING"
	ReasonKeyInvalid       = "IDEMPOTENCY_KEY_INVALID"
	ReasonKeyReused        = "IDEMPOTENCY_KEY_REUSED"
	ReasonInFlight         = "IDEMPOTENCY_KEY_IN_FLIGHT"
	ReasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	ReasonResponseOmitted  = "IDEMPOTENT_RESPONSE_OMITTED"
)

// Server is the unary server interceptor over one store. Build it with
// NewServer; it is safe for concurrent use.
type Server struct {
	store     store.Store
	tx        store.TxStore  // store, when it runs handlers in a transaction
	ext       store.Extender // store, when it can extend a live claim (and is not tx)
	cfg       *config
	fields    *keyFields
	runs      sync.Map             // full method -> *retryhint.RunTimes
	beats     heartbeat.Beats      // claims on ext held while their handlers run
	abandoned *storecall.Abandoned // bounds background releases of claims whose reply was lost
}

// maxAbandoned bounds the background releases under way at once.
const maxAbandoned = 64

// NewServer returns the interceptor over s, configured by opts. A
// store.TxStore's handlers run in its transaction (the kept answer
// commits with their writes); a store.Extender's claims are extended
// while their handlers run.
func NewServer(s store.Store, opts ...Option) (*Server, error) {
	if s == nil {
		return nil, errors.New("idemkey: idemgrpc: NewServer: nil store")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	srv := &Server{store: s, cfg: cfg, fields: newKeyFields(cfg.keyFields), abandoned: storecall.NewAbandoned(maxAbandoned)}
	if tx, ok := s.(store.TxStore); ok {
		srv.tx = tx
	} else if ext, ok := s.(store.Extender); ok {
		srv.ext = ext
		srv.beats.Ext = ext
	}
	return srv, nil
}

// Method returns the configuration of a method, by full name: its mode
// and its deadline, defaults filled in.
func (s *Server) Method(fullMethod string) Method { return s.cfg.method(fullMethod) }

// UnaryServerInterceptor returns the interceptor, for grpc.UnaryInterceptor
// or grpc.ChainUnaryInterceptor. Place it after the interceptors that
// authenticate the caller (the scope needs the principal) and after those
// that validate or limit requests, and inside those that log, trace or
// recover panics.
func (s *Server) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return s.intercept
}

func (s *Server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	m := s.cfg.method(info.FullMethod)
	if m.Mode == Off {
		return handler(ctx, req)
	}
	c := &call{s: s, method: info.FullMethod, ctx: ctx, req: req, handler: handler}
	key, field, err := s.keyOf(ctx, info.FullMethod, req)
	if err != nil {
		c.emit(Event{Kind: EventKeyInvalid})
		return nil, refusal(codes.InvalidArgument, "idempotency key invalid: want 1 to 255 printable ASCII characters, one key per call", ReasonKeyInvalid, 0)
	}
	if key == "" {
		if m.Mode == Required {
			c.emit(Event{Kind: EventKeyMissing})
			return nil, refusal(codes.InvalidArgument, "idempotency key missing: send it in the idempotency-key metadata entry or the request's key field", ReasonKeyMissing, 0)
		}
		return c.runKeyless()
	}
	sc := s.cfg.scope(ctx)
	if sc == "" {
		c.emit(Event{Kind: EventScopeMissing})
		return nil, status.Error(codes.Internal, "idempotency scope missing")
	}
	fp, err := fingerprint(info.FullMethod, req, field)
	if err != nil {
		return nil, status.Error(codes.Internal, "idempotency fingerprint: the request is not a protobuf message")
	}
	d := m.Deadline
	if cd, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(cd))
	}
	if d <= 0 {
		return nil, status.Error(codes.DeadlineExceeded, "deadline exceeded before the call started")
	}
	c.key = idemkey.Key{Scope: sc, Value: key}
	c.skey = store.KeyName(sc, key)
	c.digest = store.DigestOf(c.skey)
	c.deadline = d
	c.claim = store.Claim{Token: rand.Text(), Fingerprint: fp, TTL: d + ClaimMargin}
	return c.decide()
}

// keyOf reads the call's key: from the idempotency-key metadata entry,
// validated as the HTTP header is, and from the request message's key
// field. When both carry one they must agree. It returns the key ("" for
// none), the field that carried it (nil when none did) and
// idemkey.ErrKeyInvalid for a bad key.
func (s *Server) keyOf(ctx context.Context, method string, req any) (string, protoreflect.FieldDescriptor, error) {
	var mdKey string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if vals := md.Get(MetadataKey); len(vals) > 0 {
			k, err := idemkey.ParseKey(vals)
			if err != nil {
				return "", nil, idemkey.ErrKeyInvalid
			}
			mdKey = k
		}
	}
	var fieldKey string
	var field protoreflect.FieldDescriptor
	if s.cfg.keyFunc != nil {
		if pm, ok := req.(proto.Message); ok {
			var name string
			fieldKey, name = s.cfg.keyFunc(ctx, method, pm)
			if name != "" {
				field = pm.ProtoReflect().Descriptor().Fields().ByName(protoreflect.Name(name))
			}
		}
	} else {
		fieldKey, field = s.fields.read(req)
	}
	if fieldKey != "" && !idemkey.ValidKey(fieldKey) {
		return "", nil, idemkey.ErrKeyInvalid
	}
	switch {
	case mdKey != "" && fieldKey != "" && mdKey != fieldKey:
		return "", nil, idemkey.ErrKeyInvalid
	case fieldKey != "":
		return fieldKey, field, nil
	}
	return mdKey, nil, nil
}

// fingerprint is SHA-256 over the length-prefixed full method and the
// request message marshalled deterministically, with its key field (when
// the key came from one) left out: the field's records are dropped from
// the top level of the encoding, which is the encoding of the message
// with the field cleared, without a copy of the message. The handler's
// request is never changed.
func fingerprint(method string, req any, field protoreflect.FieldDescriptor) ([32]byte, error) {
	m, ok := req.(proto.Message)
	if !ok {
		return [32]byte{}, fmt.Errorf("idemkey: idemgrpc: the request is %T, not a protobuf message", req)
	}
	bp := fpBuffers.Get().(*[]byte)
	defer fpBuffers.Put(bp)
	b := append((*bp)[:0], "idemgrpc-v1"...)
	b = binary.BigEndian.AppendUint64(b, uint64(len(method)))
	b = append(b, method...)
	start := len(b)
	b, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend(b, m)
	if err != nil {
		return [32]byte{}, fmt.Errorf("idemkey: idemgrpc: marshal the request: %w", err)
	}
	if field != nil {
		b = append(b[:start], without(b[start:], field.Number())...)
	}
	*bp = b
	return sha256.Sum256(b), nil
}

// without returns enc, a message's encoding, with the top-level records
// of field n left out, compacted in place. An encoding it cannot read
// (which proto.Marshal never makes) is returned whole.
func without(enc []byte, n protowire.Number) []byte {
	found := false
	for rest := enc; len(rest) > 0; {
		num, typ, tl := protowire.ConsumeTag(rest)
		if tl < 0 {
			return enc
		}
		vl := protowire.ConsumeFieldValue(num, typ, rest[tl:])
		if vl < 0 {
			return enc
		}
		found = found || num == n
		rest = rest[tl+vl:]
	}
	if !found {
		return enc
	}
	out := enc[:0]
	for rest := enc; len(rest) > 0; {
		num, typ, tl := protowire.ConsumeTag(rest)
		l := tl + protowire.ConsumeFieldValue(num, typ, rest[tl:])
		if num != n {
			// out never passes rest: copy moves the record forward.
			out = append(out, rest[:l]...)
		}
		rest = rest[l:]
	}
	return out
}

// fpBuffers hold the bytes a fingerprint is taken over.
var fpBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// refusal is a status of the interceptor's own, with an ErrorInfo
// detail, and a RetryInfo detail when retry is positive.
func refusal(c codes.Code, msg, reason string, retry time.Duration) error {
	st := status.New(c, msg)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}}
	if retry > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	}
	// Details of well-known types, which always marshal.
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}
