package idemgrpc_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/idemkey/idemkey/idemgrpc"
	"github.com/idemkey/idemkey/idemgrpc/internal/testpb"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// payments is the service under test: every method counts its runs and
// answers what fn says (by default a payment named after the run).
type payments struct {
	testpb.UnimplementedPaymentsServer
	runs atomic.Int64
	fn   func(ctx context.Context, req any) (*testpb.Payment, error)
}

func (p *payments) answer(ctx context.Context, req any, amount int64) (*testpb.Payment, error) {
	n := p.runs.Add(1)
	if p.fn != nil {
		return p.fn(ctx, req)
	}
	return &testpb.Payment{Id: "pay_" + strconv.FormatInt(n, 10), Amount: amount, Run: n}, nil
}

func (p *payments) CreatePayment(ctx context.Context, r *testpb.CreatePaymentRequest) (*testpb.Payment, error) {
	return p.answer(ctx, r, r.GetAmount())
}

func (p *payments) Transfer(ctx context.Context, r *testpb.TransferRequest) (*testpb.Payment, error) {
	return p.answer(ctx, r, r.GetAmount())
}

func (p *payments) Charge(ctx context.Context, r *testpb.ChargeRequest) (*testpb.Payment, error) {
	return p.answer(ctx, r, r.GetAmount())
}

// Full method names of the test service.
const (
	mCreate   = "/idemgrpc.test.v1.Payments/CreatePayment"
	mTransfer = "/idemgrpc.test.v1.Payments/Transfer"
	mCharge   = "/idemgrpc.test.v1.Payments/Charge"
)

// recoverPanics is the recovery interceptor a service puts outside
// idemgrpc's: a handler's panic becomes INTERNAL, so the test server
// survives it.
func recoverPanics(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = status.Errorf(codes.Internal, "panic: %v", r)
		}
	}()
	return h(ctx, req)
}

// newServer returns the interceptor over st, failing the test on a bad
// option.
func newServer(t testing.TB, st store.Store, opts ...idemgrpc.Option) *idemgrpc.Server {
	t.Helper()
	s, err := idemgrpc.NewServer(st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newMemory(t testing.TB) store.Store {
	t.Helper()
	st, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// serveOn serves svc through srv's interceptor (inside a recovery
// interceptor) on lis until the test ends.
func serveOn(t testing.TB, lis net.Listener, srv *idemgrpc.Server, svc testpb.PaymentsServer) {
	t.Helper()
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(recoverPanics, srv.UnaryServerInterceptor()))
	testpb.RegisterPaymentsServer(gs, svc)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
}

// bufconnClient serves svc through srv on an in-memory connection and
// returns a client of it, with dial options added.
func bufconnClient(t testing.TB, srv *idemgrpc.Server, svc testpb.PaymentsServer, dial ...grpc.DialOption) testpb.PaymentsClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	serveOn(t, lis, srv, svc)
	dial = append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
	}, dial...)
	cc, err := grpc.NewClient("passthrough:///bufconn", dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return testpb.NewPaymentsClient(cc)
}

// tcpListen listens on a free loopback port.
func tcpListen(t testing.TB) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

// dialTCP returns a client of the server at addr.
func dialTCP(t testing.TB, addr string, dial ...grpc.DialOption) testpb.PaymentsClient {
	t.Helper()
	dial = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dial...)
	cc, err := grpc.NewClient(addr, dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return testpb.NewPaymentsClient(cc)
}

// newKey returns a fresh random key.
func newKey() string { return "k-" + rand.Text() }

// withKey returns ctx with key in the outgoing metadata.
func withKey(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
}

func timeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// reasonOf returns the reason of err's ErrorInfo detail, or "".
func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(interface{ GetReason() string }); ok {
			return ei.GetReason()
		}
	}
	return ""
}

// down is a store whose backend is gone: every call fails.
type down struct{}

var errDown = fmt.Errorf("%w: connection refused", store.ErrUnreachable)

func (down) Claim(context.Context, string, store.Claim) (store.Result, error) {
	return store.Result{}, errDown
}
func (down) Complete(context.Context, string, string, *store.Record, time.Duration) error {
	return errDown
}
func (down) Release(context.Context, string, string) error { return errDown }

// recording is a store that records the claims made through it.
type recording struct {
	store.Store
	claims chan store.Claim
}

func (r *recording) Claim(ctx context.Context, key string, c store.Claim) (store.Result, error) {
	select {
	case r.claims <- c:
	default:
	}
	return r.Store.Claim(ctx, key, c)
}
