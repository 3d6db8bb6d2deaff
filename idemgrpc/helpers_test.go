package idemgrpc_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/idemkey/idemkey/idemgrpc"
	"github.com/idemkey/idemkey/idemgrpc/internal/grpctest"
	"github.com/idemkey/idemkey/idemgrpc/internal/testpb"
	"github.com/idemkey/idemkey/store"
)

// The service under test and the helpers both this package's tests and
// the store tests' module (idemgrpc/test) use, from internal/grpctest,
// under the names these tests use.
type payments = grpctest.Payments

var (
	newServer = grpctest.NewServer
	newClient = grpctest.NewClient
	newMemory = grpctest.NewMemory
	serveOn   = grpctest.Serve
	serveTCP  = grpctest.ServeTCP
	tcpListen = grpctest.Listen
	dialTCP   = grpctest.Dial
	newKey    = grpctest.NewKey
	timeout   = grpctest.Timeout
)

// Full method names of the test service.
const (
	mCreate   = "/idemgrpc.test.v1.Payments/CreatePayment"
	mTransfer = "/idemgrpc.test.v1.Payments/Transfer"
	mCharge   = "/idemgrpc.test.v1.Payments/Charge"
)

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

// withKey returns ctx with key in the outgoing metadata.
func withKey(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
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
