// Package grpctest is the service idemgrpc's tests call through the
// interceptor, with the helpers that build the interceptor, serve the
// service and dial it. idemgrpc's own tests and those of the module that
// runs them on real stores (idemgrpc/test, which idemgrpc's go.mod does
// not require, so that no store driver reaches its users) share it.
package grpctest

import (
	"context"
	"crypto/rand"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/idemkey/idemkey/idemgrpc"
	"github.com/idemkey/idemkey/idemgrpc/internal/testpb"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// Payments is the service under test: every method counts its runs and
// answers what Fn says (when nil, a payment named after the run).
type Payments struct {
	testpb.UnimplementedPaymentsServer
	Runs atomic.Int64
	Fn   func(ctx context.Context, req any) (*testpb.Payment, error)
}

func (p *Payments) answer(ctx context.Context, req any, amount int64) (*testpb.Payment, error) {
	n := p.Runs.Add(1)
	if p.Fn != nil {
		return p.Fn(ctx, req)
	}
	return &testpb.Payment{Id: "pay_" + strconv.FormatInt(n, 10), Amount: amount, Run: n}, nil
}

func (p *Payments) CreatePayment(ctx context.Context, r *testpb.CreatePaymentRequest) (*testpb.Payment, error) {
	return p.answer(ctx, r, r.GetAmount())
}

func (p *Payments) Transfer(ctx context.Context, r *testpb.TransferRequest) (*testpb.Payment, error) {
	return p.answer(ctx, r, r.GetAmount())
}

func (p *Payments) Charge(ctx context.Context, r *testpb.ChargeRequest) (*testpb.Payment, error) {
	return p.answer(ctx, r, r.GetAmount())
}

// RecoverPanics is the recovery interceptor a service puts outside
// idemgrpc's: a handler's panic becomes INTERNAL, so the test server
// survives it.
func RecoverPanics(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = status.Errorf(codes.Internal, "panic: %v", r)
		}
	}()
	return h(ctx, req)
}

// NewServer returns the interceptor over st, failing the test on a bad
// option.
func NewServer(t testing.TB, st store.Store, opts ...idemgrpc.Option) *idemgrpc.Server {
	t.Helper()
	s, err := idemgrpc.NewServer(st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// NewClient returns the client interceptor, failing the test on a bad
// option.
func NewClient(t testing.TB, opts ...idemgrpc.ClientOption) *idemgrpc.Client {
	t.Helper()
	c, err := idemgrpc.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// NewMemory returns a memory store, closed when the test ends.
func NewMemory(t testing.TB) store.Store {
	t.Helper()
	st, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// Serve serves svc through srv's interceptor (inside RecoverPanics) on
// lis until the test ends.
func Serve(t testing.TB, lis net.Listener, srv *idemgrpc.Server, svc testpb.PaymentsServer) {
	t.Helper()
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(RecoverPanics, srv.UnaryServerInterceptor()))
	testpb.RegisterPaymentsServer(gs, svc)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
}

// ServeTCP serves svc through srv on a loopback port and returns its
// address.
func ServeTCP(t testing.TB, srv *idemgrpc.Server, svc testpb.PaymentsServer) string {
	t.Helper()
	lis := Listen(t)
	Serve(t, lis, srv, svc)
	return lis.Addr().String()
}

// Listen listens on a free loopback port.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

// Dial returns a client of the server at addr, with dial options added,
// closed when the test ends.
func Dial(t testing.TB, addr string, dial ...grpc.DialOption) testpb.PaymentsClient {
	t.Helper()
	dial = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dial...)
	cc, err := grpc.NewClient(addr, dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return testpb.NewPaymentsClient(cc)
}

// NewKey returns a fresh random key.
func NewKey() string { return "k-" + rand.Text() }

// Timeout returns a context that ends after d, or when the test does.
func Timeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
