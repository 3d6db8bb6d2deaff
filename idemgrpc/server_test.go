package idemgrpc_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/idemgrpc"
	"github.com/idemkey/idemkey/idemgrpc/internal/testpb"
	"github.com/idemkey/idemkey/internal/neverkept"
	"github.com/idemkey/idemkey/scope"
	"github.com/idemkey/idemkey/store"
)

// TestReplayKeepsMessageAndMetadata: the repeat of a call gets the first
// run's message, the headers and trailers that may be replayed, and
// idempotent-replayed: true, and the handler runs once. Per-call entries
// (x-request-id, traces) are not replayed.
func TestReplayKeepsMessageAndMetadata(t *testing.T) {
	svc := &payments{}
	svc.Fn = func(ctx context.Context, _ any) (*testpb.Payment, error) {
		grpc.SetHeader(ctx, metadata.Pairs("x-payment", "first", "x-request-id", "req-1", "traceparent", "00-1-2-01", "x-sig-bin", "\x00\xff"))
		grpc.SetTrailer(ctx, metadata.Pairs("x-ledger", "posted"))
		return &testpb.Payment{Id: "pay_1", Amount: 10, Run: svc.Runs.Load()}, nil
	}
	c := bufconnClient(t, newServer(t, newMemory(t)), svc)
	ctx := timeout(t, 10*time.Second)
	req := &testpb.CreatePaymentRequest{RequestId: newKey(), Amount: 10, Labels: map[string]string{"a": "1", "b": "2", "c": "3"}}

	var h1, t1 metadata.MD
	first, err := c.CreatePayment(ctx, req, grpc.Header(&h1), grpc.Trailer(&t1))
	if err != nil {
		t.Fatal(err)
	}
	if got := h1.Get(idemgrpc.MetadataReplayed); len(got) != 0 {
		t.Errorf("first run says replayed: %v", got)
	}
	var h2, t2 metadata.MD
	again, err := c.CreatePayment(ctx, req, grpc.Header(&h2), grpc.Trailer(&t2))
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(first, again) {
		t.Errorf("replay %v, want %v", again, first)
	}
	if n := svc.Runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	if got := h2.Get(idemgrpc.MetadataReplayed); len(got) != 1 || got[0] != "true" {
		t.Errorf("replay header %s = %v, want true", idemgrpc.MetadataReplayed, got)
	}
	if got := h2.Get("x-payment"); len(got) != 1 || got[0] != "first" {
		t.Errorf("replayed x-payment = %v", got)
	}
	if got := h2.Get("x-sig-bin"); len(got) != 1 || got[0] != "\x00\xff" {
		t.Errorf("replayed x-sig-bin = %q", got)
	}
	for _, name := range []string{"x-request-id", "traceparent"} {
		if got := h2.Get(name); len(got) != 0 {
			t.Errorf("replayed %s = %v, a per-call entry", name, got)
		}
	}
	if got := t2.Get("x-ledger"); len(got) != 1 || got[0] != "posted" {
		t.Errorf("replayed trailer x-ledger = %v", got)
	}
}

// TestDefaultKeepMetadataRefusesTraceHeaders: every per-call and trace
// entry DefaultKeepMetadata's doc names is refused, the single-header B3
// form (b3) among them, and so is every header of package neverkept, which
// package middleware's DefaultKeepHeader refuses as HTTP headers; entries
// that merely resemble one are kept.
func TestDefaultKeepMetadataRefusesTraceHeaders(t *testing.T) {
	refused := []string{"date", "set-cookie", "x-request-id", "server-timing",
		"traceparent", "tracestate", "traceresponse", "baggage", "b3", "x-b3-traceid", "x-b3-sampled", "uber-trace-id",
		"x-amzn-trace-id", "x-cloud-trace-context", "grpc-trace-bin", "sentry-trace"}
	refused = append(refused, neverkept.Names()...)
	for _, p := range neverkept.Prefixes() {
		refused = append(refused, p+"anything")
	}
	for _, name := range refused {
		if idemgrpc.DefaultKeepMetadata(name) {
			t.Errorf("%s is kept", name)
		}
	}
	for _, name := range []string{"x-payment", "location", "etag", "b3-custom", "sentry-release", "grpc-trace"} {
		if !idemgrpc.DefaultKeepMetadata(name) {
			t.Errorf("%s is refused", name)
		}
	}
}

// TestKeptAndReleasedCodes: the caller's errors are kept and replayed
// with their code, message and details; transient and server errors
// release the key, so the retry runs again.
func TestKeptAndReleasedCodes(t *testing.T) {
	kept := []codes.Code{codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unauthenticated}
	released := []codes.Code{codes.Unavailable, codes.Internal, codes.Unknown, codes.DeadlineExceeded,
		codes.ResourceExhausted, codes.Aborted, codes.Canceled}
	var code codes.Code
	svc := &payments{}
	svc.Fn = func(context.Context, any) (*testpb.Payment, error) {
		st, _ := status.New(code, "amount over the limit").WithDetails(&errdetails.BadRequest{
			FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "amount", Description: "too large"}}})
		return nil, st.Err()
	}
	c := bufconnClient(t, newServer(t, newMemory(t)), svc)
	ctx := timeout(t, 20*time.Second)
	for _, tc := range append(kept, released...) {
		code = tc
		svc.Runs.Store(0)
		req := &testpb.CreatePaymentRequest{RequestId: newKey(), Amount: 5}
		_, err1 := c.CreatePayment(ctx, req)
		var h metadata.MD
		_, err2 := c.CreatePayment(ctx, req, grpc.Header(&h))
		s1, s2 := status.Convert(err1), status.Convert(err2)
		if s1.Code() != tc || s2.Code() != tc {
			t.Errorf("%v: answers %v then %v", tc, s1.Code(), s2.Code())
			continue
		}
		if idemgrpc.DefaultKeep(tc) {
			if n := svc.Runs.Load(); n != 1 {
				t.Errorf("%v is kept, yet the handler ran %d times", tc, n)
			}
			if !proto.Equal(s1.Proto(), s2.Proto()) {
				t.Errorf("%v: replayed status %v, want %v", tc, s2.Proto(), s1.Proto())
			}
			if len(h.Get(idemgrpc.MetadataReplayed)) != 1 {
				t.Errorf("%v: replay without %s", tc, idemgrpc.MetadataReplayed)
			}
		} else if n := svc.Runs.Load(); n != 2 {
			t.Errorf("%v is released, yet the handler ran %d times", tc, n)
		}
	}
	for _, c := range kept {
		if !idemgrpc.DefaultKeep(c) {
			t.Errorf("DefaultKeep(%v) = false", c)
		}
	}
	for _, c := range append(released, codes.Unimplemented, codes.DataLoss) {
		if idemgrpc.DefaultKeep(c) {
			t.Errorf("DefaultKeep(%v) = true", c)
		}
	}
}

// TestPanicReleasesAndRepanics: a handler's panic releases the key and
// goes on to the recovery interceptor outside; the retry runs again.
func TestPanicReleasesAndRepanics(t *testing.T) {
	svc := &payments{}
	svc.Fn = func(context.Context, any) (*testpb.Payment, error) {
		if svc.Runs.Load() == 1 {
			panic("boom")
		}
		return &testpb.Payment{Id: "ok"}, nil
	}
	c := bufconnClient(t, newServer(t, newMemory(t)), svc)
	ctx := timeout(t, 10*time.Second)
	req := &testpb.CreatePaymentRequest{RequestId: newKey()}
	_, err := c.CreatePayment(ctx, req)
	if st := status.Convert(err); st.Code() != codes.Internal || st.Message() != "panic: boom" {
		t.Fatalf("panicking call: %v, want the recovery interceptor's INTERNAL", err)
	}
	p, err := c.CreatePayment(ctx, req)
	if err != nil || p.GetId() != "ok" || svc.Runs.Load() != 2 {
		t.Fatalf("retry after a panic: %v %v, runs %d", p, err, svc.Runs.Load())
	}
}

// TestInFlightAndReused: a repeat while the first call runs gets ABORTED
// with a RetryInfo of at least a second; a different request under the
// key gets FAILED_PRECONDITION with reason IDEMPOTENCY_KEY_REUSED, while
// in flight and once kept.
func TestInFlightAndReused(t *testing.T) {
	started, finish := make(chan struct{}), make(chan struct{})
	svc := &payments{}
	svc.Fn = func(context.Context, any) (*testpb.Payment, error) {
		close(started)
		<-finish
		return &testpb.Payment{Id: "slow"}, nil
	}
	c := bufconnClient(t, newServer(t, newMemory(t)), svc)
	ctx := timeout(t, 10*time.Second)
	key := newKey()
	req := &testpb.CreatePaymentRequest{RequestId: key, Amount: 1}
	done := make(chan error, 1)
	go func() { _, err := c.CreatePayment(ctx, req); done <- err }()
	<-started

	_, err := c.CreatePayment(ctx, req)
	st := status.Convert(err)
	if st.Code() != codes.Aborted || reasonOf(err) != idemgrpc.ReasonInFlight {
		t.Fatalf("in flight: %v", err)
	}
	var delay time.Duration
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			delay = ri.GetRetryDelay().AsDuration()
		}
	}
	if delay < time.Second || delay > 10*time.Second {
		t.Errorf("RetryInfo delay %v, want 1 s to 10 s", delay)
	}
	other := &testpb.CreatePaymentRequest{RequestId: key, Amount: 2}
	if _, err := c.CreatePayment(ctx, other); status.Code(err) != codes.FailedPrecondition || reasonOf(err) != idemgrpc.ReasonKeyReused {
		t.Errorf("reused while in flight: %v", err)
	}
	close(finish)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreatePayment(ctx, other); status.Code(err) != codes.FailedPrecondition || reasonOf(err) != idemgrpc.ReasonKeyReused {
		t.Errorf("reused once kept: %v", err)
	}
	if n := svc.Runs.Load(); n != 1 {
		t.Errorf("handler ran %d times", n)
	}
}

// TestKeyMissingInvalidAndModes: a required method without a key, a bad
// key, and two different keys in metadata and the field are
// INVALID_ARGUMENT before any store call; optional and off methods run
// plainly.
func TestKeyMissingInvalidAndModes(t *testing.T) {
	svc := &payments{}
	claims := &recording{Store: newMemory(t), claims: make(chan store.Claim, 100)}
	srv := newServer(t, claims,
		idemgrpc.WithMethod(mCreate, idemgrpc.Required, 0),
		idemgrpc.WithMethod(mCharge, idemgrpc.Off, 0))
	c := bufconnClient(t, srv, svc)
	ctx := timeout(t, 10*time.Second)

	cases := []struct {
		name   string
		ctx    context.Context
		req    *testpb.CreatePaymentRequest
		reason string
	}{
		{"missing", ctx, &testpb.CreatePaymentRequest{}, idemgrpc.ReasonKeyMissing},
		{"too long", withKey(ctx, strings.Repeat("a", 256)), &testpb.CreatePaymentRequest{}, idemgrpc.ReasonKeyInvalid},
		{"field too long", ctx, &testpb.CreatePaymentRequest{RequestId: strings.Repeat("a", 256)}, idemgrpc.ReasonKeyInvalid},
		{"field not ASCII", ctx, &testpb.CreatePaymentRequest{RequestId: "clé"}, idemgrpc.ReasonKeyInvalid},
		{"two entries", metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, "a", idemgrpc.MetadataKey, "b"), &testpb.CreatePaymentRequest{}, idemgrpc.ReasonKeyInvalid},
		{"metadata and field differ", withKey(ctx, "a"), &testpb.CreatePaymentRequest{RequestId: "b"}, idemgrpc.ReasonKeyInvalid},
	}
	for _, tc := range cases {
		_, err := c.CreatePayment(tc.ctx, tc.req)
		if status.Code(err) != codes.InvalidArgument || reasonOf(err) != tc.reason {
			t.Errorf("%s: %v, want INVALID_ARGUMENT %s", tc.name, err, tc.reason)
		}
	}
	if n := svc.Runs.Load(); n != 0 {
		t.Errorf("handler ran %d times for refused calls", n)
	}
	if n := len(claims.claims); n != 0 {
		t.Errorf("%d claims for refused calls", n)
	}

	// Optional (the default) without a key: runs each time, no claim.
	for range 2 {
		if _, err := c.Transfer(ctx, &testpb.TransferRequest{Amount: 1}); err != nil {
			t.Fatal(err)
		}
	}
	// Off with a key: runs each time, no claim.
	k := newKey()
	for range 2 {
		if _, err := c.Charge(withKey(ctx, k), &testpb.ChargeRequest{Amount: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if n := svc.Runs.Load(); n != 4 {
		t.Errorf("optional and off methods ran %d times, want 4", n)
	}
	if n := len(claims.claims); n != 0 {
		t.Errorf("%d claims for optional calls without a key and an off method", n)
	}
	if m := srv.Method(mCharge); m.Mode != idemgrpc.Off || m.Deadline != idemgrpc.DefaultDeadline {
		t.Errorf("Method(%s) = %+v", mCharge, m)
	}
	if m := srv.Method(mTransfer); m.Mode != idemgrpc.Optional {
		t.Errorf("default mode %v, want optional", m.Mode)
	}
}

// TestStoreDown: a store that cannot be reached answers UNAVAILABLE with
// a RetryInfo, and the handler does not run.
func TestStoreDown(t *testing.T) {
	svc := &payments{}
	c := bufconnClient(t, newServer(t, down{}), svc)
	_, err := c.CreatePayment(timeout(t, 5*time.Second), &testpb.CreatePaymentRequest{RequestId: newKey()})
	if status.Code(err) != codes.Unavailable || reasonOf(err) != idemgrpc.ReasonStoreUnavailable {
		t.Fatalf("store down: %v", err)
	}
	if n := svc.Runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times with the store down", n)
	}
}

// TestKeyFromFieldOrMetadata: the same request with its key in the
// AIP-155 request_id field, or in metadata with the field empty, is one
// request: the second replays the first. The same holds for AEP-155's
// idempotency_key. The handler sees its request as sent (the field is
// cleared only in the fingerprint's copy) and the key in its context.
func TestKeyFromFieldOrMetadata(t *testing.T) {
	svc := &payments{}
	var seen []string
	var mu sync.Mutex
	svc.Fn = func(ctx context.Context, req any) (*testpb.Payment, error) {
		k, _ := idemkey.FromContext(ctx)
		mu.Lock()
		seen = append(seen, k.Value+"|"+fieldOf(req))
		mu.Unlock()
		return &testpb.Payment{Id: "pay", Run: svc.Runs.Load()}, nil
	}
	c := bufconnClient(t, newServer(t, newMemory(t)), svc)
	ctx := timeout(t, 10*time.Second)

	k1 := newKey()
	if _, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: k1, Amount: 7}); err != nil {
		t.Fatal(err)
	}
	var h metadata.MD
	if _, err := c.CreatePayment(withKey(ctx, k1), &testpb.CreatePaymentRequest{Amount: 7}, grpc.Header(&h)); err != nil || len(h.Get(idemgrpc.MetadataReplayed)) != 1 {
		t.Fatalf("key in metadata after the field: %v, header %v", err, h)
	}
	if _, err := c.CreatePayment(withKey(ctx, k1), &testpb.CreatePaymentRequest{RequestId: k1, Amount: 7}); err != nil {
		t.Fatal(err)
	}

	k2 := newKey()
	if _, err := c.Transfer(withKey(ctx, k2), &testpb.TransferRequest{Amount: 3, To: "bob"}); err != nil {
		t.Fatal(err)
	}
	h = nil
	if _, err := c.Transfer(ctx, &testpb.TransferRequest{IdempotencyKey: k2, Amount: 3, To: "bob"}, grpc.Header(&h)); err != nil || len(h.Get(idemgrpc.MetadataReplayed)) != 1 {
		t.Fatalf("key in the field after metadata: %v, header %v", err, h)
	}
	if _, err := c.Transfer(ctx, &testpb.TransferRequest{IdempotencyKey: k2, Amount: 4, To: "bob"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("another amount under the key: %v", err)
	}
	if n := svc.Runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
	want := []string{k1 + "|" + k1, k2 + "|"}
	if len(seen) != 2 || seen[0] != want[0] || seen[1] != want[1] {
		t.Fatalf("handler saw %q, want %q", seen, want)
	}
}

func fieldOf(req any) string {
	switch r := req.(type) {
	case *testpb.CreatePaymentRequest:
		return r.GetRequestId()
	case *testpb.TransferRequest:
		return r.GetIdempotencyKey()
	}
	return ""
}

// TestKeyFunc: a service's own key function reads the key, and the field
// it names is left out of the fingerprint.
func TestKeyFunc(t *testing.T) {
	svc := &payments{}
	srv := newServer(t, newMemory(t), idemgrpc.WithKeyFunc(func(_ context.Context, _ string, req proto.Message) (string, string) {
		if r, ok := req.(*testpb.ChargeRequest); ok {
			return r.GetNote(), "note"
		}
		return "", ""
	}))
	c := bufconnClient(t, srv, svc)
	ctx := timeout(t, 10*time.Second)
	k := newKey()
	for range 2 {
		if _, err := c.Charge(ctx, &testpb.ChargeRequest{Amount: 1, Note: k}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Charge(withKey(ctx, k), &testpb.ChargeRequest{Amount: 1}); err != nil {
		t.Fatal(err)
	}
	if n := svc.Runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// TestDeadlines: the handler's context ends at the shorter of the call's
// deadline and the method's, and the claim lives that plus ClaimMargin.
func TestDeadlines(t *testing.T) {
	var left time.Duration
	svc := &payments{}
	svc.Fn = func(ctx context.Context, _ any) (*testpb.Payment, error) {
		d, _ := ctx.Deadline()
		left = time.Until(d)
		return &testpb.Payment{}, nil
	}
	rec := &recording{Store: newMemory(t), claims: make(chan store.Claim, 10)}
	c := bufconnClient(t, newServer(t, rec, idemgrpc.WithMethod(mCreate, idemgrpc.Optional, 3*time.Second)), svc)

	// The call's deadline is the shorter.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: newKey()}); err != nil {
		t.Fatal(err)
	}
	cl := <-rec.claims
	if left > time.Second || left < 500*time.Millisecond {
		t.Errorf("handler's deadline in %v, want the call's (1 s)", left)
	}
	if cl.TTL > time.Second+idemgrpc.ClaimMargin || cl.TTL < 500*time.Millisecond+idemgrpc.ClaimMargin {
		t.Errorf("claim TTL %v, want about 1 s + %v", cl.TTL, idemgrpc.ClaimMargin)
	}
	// The method's deadline is the shorter.
	if _, err := c.CreatePayment(timeout(t, time.Minute), &testpb.CreatePaymentRequest{RequestId: newKey()}); err != nil {
		t.Fatal(err)
	}
	cl = <-rec.claims
	if left > 3*time.Second || left < 2*time.Second {
		t.Errorf("handler's deadline in %v, want the method's (3 s)", left)
	}
	if cl.TTL != 3*time.Second+idemgrpc.ClaimMargin {
		t.Errorf("claim TTL %v, want 3 s + %v", cl.TTL, idemgrpc.ClaimMargin)
	}
}

// TestScope: keys live in the caller's scope: the same key from two
// principals runs twice; from one, once.
func TestScope(t *testing.T) {
	svc := &payments{}
	srv := newServer(t, newMemory(t))
	auth := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if u := md.Get("x-user"); len(u) == 1 {
			ctx = scope.NewContext(ctx, u[0])
		}
		return h(ctx, req)
	}
	lis := tcpListen(t)
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(auth, srv.UnaryServerInterceptor()))
	testpb.RegisterPaymentsServer(gs, svc)
	go gs.Serve(lis)
	defer gs.Stop()
	c := dialTCP(t, lis.Addr().String())
	ctx := timeout(t, 10*time.Second)
	k := newKey()
	for _, u := range []string{"alice", "bob", "alice", "anonymous"} {
		uctx := metadata.AppendToOutgoingContext(ctx, "x-user", u)
		if _, err := c.CreatePayment(uctx, &testpb.CreatePaymentRequest{RequestId: k}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: k}); err != nil {
		t.Fatal(err)
	}
	// alice, bob, a principal named "anonymous", and the anonymous caller.
	if n := svc.Runs.Load(); n != 4 {
		t.Fatalf("handler ran %d times, want 4", n)
	}
}

// TestOptions: bad options are reported by NewServer and NewClient.
func TestOptions(t *testing.T) {
	if _, err := idemgrpc.NewServer(nil); err == nil {
		t.Error("nil store accepted")
	}
	_, err := idemgrpc.NewServer(newMemory(t), nil, idemgrpc.WithMethod("Create", idemgrpc.Required, 0),
		idemgrpc.WithDeadline(-1), idemgrpc.WithDefault(0))
	if err == nil {
		t.Fatal("bad options accepted")
	}
	for _, want := range []string{"option 1 is nil", "WithMethod(\"Create\")", "WithDeadline(-1ns)", "WithDefault(0)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if _, err := idemgrpc.NewClient(idemgrpc.WithMaxAttempts(0), idemgrpc.WithBackoff(2, 1)); err == nil {
		t.Error("bad client options accepted")
	}
}

// extending is a store that records the extensions of claims.
type extending struct {
	store.Store
	mu   sync.Mutex
	ttls []time.Duration
}

func (e *extending) Extend(ctx context.Context, key, token string, ttl time.Duration) error {
	e.mu.Lock()
	e.ttls = append(e.ttls, ttl)
	e.mu.Unlock()
	return e.Store.(store.Extender).Extend(ctx, key, token, ttl)
}

func (e *extending) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.ttls)
}

// TestHeartbeat: on a store.Extender, a handler that runs past a third of
// its claim's life (and the heartbeat's scan, a second) has its claim
// extended to the claim's full life, and the extensions stop when it
// returns.
func TestHeartbeat(t *testing.T) {
	ext := &extending{Store: newMemory(t)}
	svc := &payments{}
	svc.Fn = func(context.Context, any) (*testpb.Payment, error) {
		time.Sleep(3300 * time.Millisecond)
		return &testpb.Payment{}, nil
	}
	// Deadline 1 s: the claim lives 6 s, extended every 2 s, looked at
	// every second.
	c := bufconnClient(t, newServer(t, ext, idemgrpc.WithMethod(mCreate, idemgrpc.Required, time.Second)), svc)
	if _, err := c.CreatePayment(timeout(t, 10*time.Second), &testpb.CreatePaymentRequest{RequestId: newKey()}); err != nil {
		t.Fatal(err)
	}
	if n := ext.count(); n != 1 {
		t.Fatalf("%d extensions of a claim held 3.3 s, want 1", n)
	}
	ext.mu.Lock()
	ttl := ext.ttls[0]
	ext.mu.Unlock()
	if ttl != time.Second+idemgrpc.ClaimMargin {
		t.Errorf("extended to %v, want %v", ttl, time.Second+idemgrpc.ClaimMargin)
	}
	time.Sleep(2100 * time.Millisecond)
	if n := ext.count(); n != 1 {
		t.Fatalf("%d extensions after the handler returned", n)
	}
}

// TestEvents: every decision reaches the observer, with the method and
// the key's digest, never the key.
func TestEvents(t *testing.T) {
	var mu sync.Mutex
	var got []idemgrpc.Event
	obs := func(_ context.Context, e idemgrpc.Event) { mu.Lock(); got = append(got, e); mu.Unlock() }
	svc := &payments{}
	c := bufconnClient(t, newServer(t, newMemory(t), idemgrpc.WithObserver(obs), idemgrpc.WithMethod(mTransfer, idemgrpc.Required, 0)), svc)
	ctx := timeout(t, 10*time.Second)
	k := newKey()
	c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: k, Amount: 1})
	c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: k, Amount: 1})
	c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: k, Amount: 2})
	c.Transfer(ctx, &testpb.TransferRequest{})
	mu.Lock()
	defer mu.Unlock()
	want := []idemgrpc.EventKind{idemgrpc.EventFirstAttempt, idemgrpc.EventKept, idemgrpc.EventReplay, idemgrpc.EventKeyReused, idemgrpc.EventKeyMissing}
	if len(got) != len(want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	for i, e := range got {
		if e.Kind != want[i] {
			t.Errorf("event %d: %v, want %v", i, e.Kind, want[i])
		}
		if i < 4 && (e.Method != mCreate || len(e.KeyDigest) != 64 || strings.Contains(e.KeyDigest, k)) {
			t.Errorf("event %d: method %q, digest %q", i, e.Method, e.KeyDigest)
		}
	}
	if got[1].Code != codes.OK || got[1].Kind.String() != "kept" {
		t.Errorf("kept event: %+v", got[1])
	}
}

// completedWith is a store whose every claim finds a kept record: rec,
// under the claim's own fingerprint.
type completedWith struct {
	store.Store
	rec store.Record
}

func (c *completedWith) Claim(_ context.Context, _ string, cl store.Claim) (store.Result, error) {
	rec := c.rec
	rec.Fingerprint = cl.Fingerprint
	return store.Result{State: store.Completed, Fingerprint: cl.Fingerprint, Record: &rec}, nil
}

// TestUnreplayableRecords: a kept record this binary cannot replay (a
// response type it does not know, or not idemgrpc's) answers INTERNAL,
// and one whose message was over the limit FAILED_PRECONDITION
// IDEMPOTENT_RESPONSE_OMITTED; neither runs the handler.
func TestUnreplayableRecords(t *testing.T) {
	svc := &payments{}
	ctx := timeout(t, 10*time.Second)
	for _, rec := range []store.Record{
		{Status: 200, Header: map[string][]string{"Idemgrpc-Type": {"no.such.Message"}}},
		{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{}`)},
	} {
		c := bufconnClient(t, newServer(t, &completedWith{Store: newMemory(t), rec: rec}), svc)
		if _, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: newKey()}); status.Code(err) != codes.Internal {
			t.Errorf("record %v: %v, want INTERNAL", rec.Header, err)
		}
	}
	if n := svc.Runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times", n)
	}

	c := bufconnClient(t, newServer(t, newMemory(t), idemgrpc.WithMaxResponse(4)), svc)
	req := &testpb.CreatePaymentRequest{RequestId: newKey(), Amount: 1234567}
	if p, err := c.CreatePayment(ctx, req); err != nil || p.GetRun() != 1 {
		t.Fatalf("first run over the limit: %v %v", p, err)
	}
	var h metadata.MD
	_, err := c.CreatePayment(ctx, req, grpc.Header(&h))
	if status.Code(err) != codes.FailedPrecondition || reasonOf(err) != idemgrpc.ReasonResponseOmitted || len(h.Get(idemgrpc.MetadataReplayed)) != 1 {
		t.Fatalf("repeat of an omitted answer: %v, header %v", err, h)
	}
	if n := svc.Runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}
