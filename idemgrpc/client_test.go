package idemgrpc_test

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/idemgrpc"
	"github.com/idemkey/idemkey/idemgrpc/internal/testpb"
	"github.com/idemkey/idemkey/internal/outkey"
)

// keysSeen is a handler that records the key each run got from metadata,
// and fails with UNAVAILABLE (released) until its failures are spent.
type keysSeen struct {
	mu       sync.Mutex
	keys     []string
	failures atomic.Int64
}

func (k *keysSeen) handler(svc *payments) func(ctx context.Context, req any) (*testpb.Payment, error) {
	return func(ctx context.Context, _ any) (*testpb.Payment, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		k.mu.Lock()
		k.keys = append(k.keys, md.Get(idemgrpc.MetadataKey)...)
		k.mu.Unlock()
		if k.failures.Add(-1) >= 0 {
			return nil, status.Error(codes.Unavailable, "bank down")
		}
		return &testpb.Payment{Id: "pay", Run: svc.Runs.Load()}, nil
	}
}

func (k *keysSeen) one(t testing.TB, runs int) string {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.keys) != runs {
		t.Fatalf("%d runs carried a key, want %d: %q", len(k.keys), runs, k.keys)
	}
	for _, key := range k.keys {
		if key != k.keys[0] || key == "" {
			t.Fatalf("keys %q: want one key on every attempt", k.keys)
		}
	}
	return k.keys[0]
}

// TestClientOneKeyAcrossRetries: the interceptor's own retries resend the
// one key it gave the logical call.
func TestClientOneKeyAcrossRetries(t *testing.T) {
	svc, seen := &payments{}, &keysSeen{}
	svc.Fn = seen.handler(svc)
	seen.failures.Store(2)
	cl := newClient(t, idemgrpc.WithBackoff(time.Millisecond, 10*time.Millisecond))
	c := bufconnClient(t, newServer(t, newMemory(t)), svc, grpc.WithUnaryInterceptor(cl.UnaryClientInterceptor()))
	p, err := c.Charge(timeout(t, 10*time.Second), &testpb.ChargeRequest{Amount: 1})
	if err != nil || p.GetRun() != 3 {
		t.Fatalf("%v %v", p, err)
	}
	seen.one(t, 3)

	// A second logical call gets a key of its own.
	svc.Runs.Store(0)
	if _, err := c.Charge(timeout(t, 10*time.Second), &testpb.ChargeRequest{Amount: 1}); err != nil {
		t.Fatal(err)
	}
	seen.mu.Lock()
	distinct := seen.keys[3] != seen.keys[0]
	seen.mu.Unlock()
	if !distinct {
		t.Fatal("two logical calls share a key")
	}
}

// TestClientServiceConfigRetry: grpc-go's own retries (a service config's
// retryPolicy) resend the key the interceptor put into the metadata once.
func TestClientServiceConfigRetry(t *testing.T) {
	svc, seen := &payments{}, &keysSeen{}
	svc.Fn = seen.handler(svc)
	seen.failures.Store(2)
	cl := newClient(t, idemgrpc.WithMaxAttempts(1))
	const config = `{"methodConfig": [{"name": [{"service": "idemgrpc.test.v1.Payments"}],
		"retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.01s", "maxBackoff": "0.05s",
		"backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`
	c := bufconnClient(t, newServer(t, newMemory(t)), svc,
		grpc.WithUnaryInterceptor(cl.UnaryClientInterceptor()), grpc.WithDefaultServiceConfig(config))
	p, err := c.Charge(timeout(t, 10*time.Second), &testpb.ChargeRequest{Amount: 1})
	if err != nil || p.GetRun() != 3 {
		t.Fatalf("%v %v", p, err)
	}
	seen.one(t, 3)
}

// TestClientWaitsOutInFlight: a repeat that finds its key in flight waits
// the server's RetryInfo and gets the first run's answer, within its
// deadline; with a deadline shorter than the wait it gets ABORTED at once.
func TestClientWaitsOutInFlight(t *testing.T) {
	started, finish := make(chan struct{}), make(chan struct{})
	svc := &payments{}
	svc.Fn = func(context.Context, any) (*testpb.Payment, error) {
		close(started)
		<-finish
		return &testpb.Payment{Id: "slow", Run: svc.Runs.Load()}, nil
	}
	cl := newClient(t)
	c := bufconnClient(t, newServer(t, newMemory(t)), svc, grpc.WithUnaryInterceptor(cl.UnaryClientInterceptor()))
	ctx := idemgrpc.WithKey(timeout(t, 20*time.Second), newKey())
	go c.Charge(ctx, &testpb.ChargeRequest{Amount: 1})
	<-started

	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if _, err := c.Charge(short, &testpb.ChargeRequest{Amount: 1}); status.Code(err) != codes.Aborted {
		t.Fatalf("repeat with a short deadline: %v", err)
	}
	if d := time.Since(t0); d > 250*time.Millisecond {
		t.Errorf("a wait that outlasts the deadline took %v before giving up", d)
	}

	time.AfterFunc(200*time.Millisecond, func() { close(finish) })
	var h metadata.MD
	p, err := c.Charge(ctx, &testpb.ChargeRequest{Amount: 1}, grpc.Header(&h))
	if err != nil || p.GetId() != "slow" || p.GetRun() != 1 || len(h.Get(idemgrpc.MetadataReplayed)) != 1 {
		t.Fatalf("repeat: %v %v, header %v", p, err, h)
	}
	if n := svc.Runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

// TestClientKeys: keys derived from the call being served (by call name,
// or by method), WithKey's, the caller's own metadata and the request's
// key field; no key (and no retry) for a method not covered.
func TestClientKeys(t *testing.T) {
	svc, seen := &payments{}, &keysSeen{}
	svc.Fn = seen.handler(svc)
	cl := newClient(t, idemgrpc.WithClientMethods(func(m string) bool { return m != mTransfer }))
	c := bufconnClient(t, newServer(t, newMemory(t)), svc, grpc.WithUnaryInterceptor(cl.UnaryClientInterceptor()))
	base := timeout(t, 10*time.Second)
	in := idemkey.Key{Scope: "alice", Value: "incoming-1"}
	served := idemkey.NewContext(base, in)
	last := func() string {
		seen.mu.Lock()
		defer seen.mu.Unlock()
		if len(seen.keys) == 0 {
			return ""
		}
		k := seen.keys[len(seen.keys)-1]
		seen.keys = seen.keys[:0]
		return k
	}
	cases := []struct {
		name string
		ctx  context.Context
		want string
	}{
		{"derived by method", served, in.Derive("grpc " + mCharge)},
		{"derived by name", idemgrpc.WithCallName(served, "bank.charge"), in.Derive("bank.charge")},
		{"WithKey", idemgrpc.WithKey(served, "given-1"), "given-1"},
		{"own metadata", withKey(idemgrpc.WithKey(served, "given-1"), "own-1"), "own-1"},
		// One call site names a downstream call for HTTP and gRPC alike:
		// client.WithCallName and client.WithKey are these (client's
		// TestKeyContextShared).
		{"derived by outkey.WithCallName", outkey.WithCallName(served, "bank.refund"), in.Derive("bank.refund")},
		{"outkey.WithKey", outkey.WithKey(served, "given-2"), "given-2"},
	}
	for _, tc := range cases {
		if _, err := c.Charge(tc.ctx, &testpb.ChargeRequest{Amount: 1}); err != nil {
			t.Fatal(err)
		}
		if got := last(); got != tc.want {
			t.Errorf("%s: key %q, want %q", tc.name, got, tc.want)
		}
	}
	if in.Derive("grpc "+mCharge) == in.Derive("bank.charge") {
		t.Fatal("derivations collide")
	}

	// The request's field carries the key: no metadata is added, and
	// the server reads the field.
	k := newKey()
	for range 2 {
		if _, err := c.CreatePayment(base, &testpb.CreatePaymentRequest{RequestId: k}); err != nil {
			t.Fatal(err)
		}
	}
	if got := last(); got != "" {
		t.Errorf("key field set, yet metadata key %q sent", got)
	}

	// Not covered, no key: sent once, not retried.
	seen.failures.Store(1)
	before := svc.Runs.Load()
	if _, err := c.Transfer(base, &testpb.TransferRequest{Amount: 1}); status.Code(err) != codes.Unavailable {
		t.Fatalf("uncovered: %v", err)
	}
	if n := svc.Runs.Load() - before; n != 1 {
		t.Fatalf("a call without a key ran %d times", n)
	}
	if _, err := c.Charge(idemgrpc.WithKey(base, "bad\x01key"), &testpb.ChargeRequest{}); err == nil {
		t.Fatal("an invalid WithKey key was sent")
	}
}

// cutProxy is a TCP proxy on loopback whose connections to clients can be
// cut while the server's side is untouched: what the server sends then is
// lost.
type cutProxy struct {
	lis   net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newCutProxy(t testing.TB, target string) *cutProxy {
	t.Helper()
	p := &cutProxy{lis: tcpListen(t)}
	go func() {
		for {
			in, err := p.lis.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in)
			p.mu.Unlock()
			go func() { io.Copy(out, in); out.Close() }()
			go func() { io.Copy(in, out); in.Close() }()
		}
	}()
	t.Cleanup(func() { p.lis.Close(); p.cut() })
	return p
}

func (p *cutProxy) addr() string { return p.lis.Addr().String() }

// cut closes every client connection made so far.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestLostReplyReplayed: the first run's reply is lost (the connection to
// the client is cut while the handler finishes); the client interceptor
// retries with the same key and gets the kept answer, and the handler ran
// once.
func TestLostReplyReplayed(t *testing.T) {
	svc := &payments{}
	var proxy *cutProxy
	svc.Fn = func(context.Context, any) (*testpb.Payment, error) {
		n := svc.Runs.Load()
		if n == 1 {
			proxy.cut()
		}
		return &testpb.Payment{Id: "pay_lost", Run: n}, nil
	}
	proxy = newCutProxy(t, serveTCP(t, newServer(t, newMemory(t)), svc))
	cl := newClient(t, idemgrpc.WithMaxAttempts(10), idemgrpc.WithBackoff(20*time.Millisecond, 500*time.Millisecond))
	c := dialTCP(t, proxy.addr(), grpc.WithUnaryInterceptor(cl.UnaryClientInterceptor()))
	var h metadata.MD
	p, err := c.CreatePayment(timeout(t, 20*time.Second), &testpb.CreatePaymentRequest{Amount: 9}, grpc.Header(&h))
	if err != nil {
		t.Fatal(err)
	}
	if p.GetId() != "pay_lost" || p.GetRun() != 1 || len(h.Get(idemgrpc.MetadataReplayed)) != 1 {
		t.Fatalf("after the lost reply: %v, header %v", p, h)
	}
	if n := svc.Runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}
