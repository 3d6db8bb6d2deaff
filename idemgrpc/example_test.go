package idemgrpc_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"

	"github.com/idemkey/idemkey/idemgrpc"
	"github.com/idemkey/idemkey/idemgrpc/internal/testpb"
	"github.com/idemkey/idemkey/store/memory"
)

// exampleService makes a payment per run.
type exampleService struct {
	testpb.UnimplementedPaymentsServer
	runs atomic.Int64
}

func (s *exampleService) CreatePayment(context.Context, *testpb.CreatePaymentRequest) (*testpb.Payment, error) {
	n := s.runs.Add(1)
	return &testpb.Payment{Id: fmt.Sprintf("pay_%d", n), Run: n}, nil
}

// The server interceptor on a method that requires a key, and the client
// interceptor that gives each logical call one: the same request sent
// twice runs once, and the second answer is the first, replayed.
func Example() {
	st, _ := memory.New()
	defer st.Close()
	idem, err := idemgrpc.NewServer(st,
		idemgrpc.WithMethod("/idemgrpc.test.v1.Payments/CreatePayment", idemgrpc.Required, 5*time.Second))
	if err != nil {
		panic(err)
	}
	svc := &exampleService{}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(idem.UnaryServerInterceptor()))
	testpb.RegisterPaymentsServer(gs, svc)
	lis := bufconn.Listen(1 << 20)
	go gs.Serve(lis)
	defer gs.Stop()

	cl, _ := idemgrpc.NewClient()
	cc, err := grpc.NewClient("passthrough:///payments",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithUnaryInterceptor(cl.UnaryClientInterceptor()))
	if err != nil {
		panic(err)
	}
	defer cc.Close()
	c := testpb.NewPaymentsClient(cc)

	ctx := idemgrpc.WithKey(context.Background(), "order-1234")
	for range 2 {
		var h metadata.MD
		p, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{Amount: 10}, grpc.Header(&h))
		fmt.Println(p.GetId(), err, h.Get(idemgrpc.MetadataReplayed))
	}
	fmt.Println("runs:", svc.runs.Load())
	// Output:
	// pay_1 <nil> []
	// pay_1 <nil> [true]
	// runs: 1
}
