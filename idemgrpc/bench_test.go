package idemgrpc_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"

	"github.com/idemkey/idemkey/idemgrpc"
	"github.com/idemkey/idemkey/idemgrpc/internal/testpb"
)

// benchRequest is a payment request of about 1 KiB, as HTTP's benchmarks
// post 1 KiB of JSON: its labels are one of about 1 KiB, or (many) 16 of
// about 60 bytes. protobuf-go marshals maps through reflection, so the
// second costs the deterministic marshal of the fingerprint much more.
func benchRequest(key string, many bool) *testpb.CreatePaymentRequest {
	if !many {
		return &testpb.CreatePaymentRequest{RequestId: key, Amount: 4200, Currency: "eur", Labels: map[string]string{"memo": oneKiB}}
	}
	labels := make(map[string]string, 16)
	for i := range 16 {
		labels["label-"+strconv.Itoa(i)] = "value-of-the-label-number-" + strconv.Itoa(i) + "-padded-to-sixty-bytes"
	}
	return &testpb.CreatePaymentRequest{RequestId: key, Amount: 4200, Currency: "eur", Labels: labels}
}

var oneKiB = strings.Repeat("x", 1000)

// BenchmarkUnary is a unary call over bufconn: bare (no interceptor), and
// through the interceptor on the memory store as a first run (a new key
// each call: claim, run, keep) and as a replay (one key).
func BenchmarkUnary(b *testing.B) {
	svc := &payments{}
	run := func(b *testing.B, c testpb.PaymentsClient, key func(i int64) string) {
		b.ReportAllocs()
		var n atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				if _, err := c.CreatePayment(ctx, benchRequest(key(n.Add(1)), false)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	b.Run("bare", func(b *testing.B) {
		srv := newServer(b, newMemory(b), idemgrpc.WithDefault(idemgrpc.Off))
		run(b, bufconnClient(b, srv, svc), func(int64) string { return "" })
	})
	b.Run("first-run", func(b *testing.B) {
		c := bufconnClient(b, newServer(b, newMemory(b)), svc)
		prefix := newKey()
		run(b, c, func(i int64) string { return prefix + strconv.FormatInt(i, 10) })
	})
	b.Run("replay", func(b *testing.B) {
		c := bufconnClient(b, newServer(b, newMemory(b)), svc)
		k := newKey()
		run(b, c, func(int64) string { return k })
	})
}

// BenchmarkInterceptor is the interceptor alone, called directly with a
// handler that answers at once, on the memory store: its cost without
// the transport's.
func BenchmarkInterceptor(b *testing.B) {
	info := &grpc.UnaryServerInfo{FullMethod: mCreate}
	answer := &testpb.Payment{Id: "pay_1", Amount: 4200}
	handler := func(context.Context, any) (any, error) { return answer, nil }
	for _, labels := range []string{"1-label", "16-labels"} {
		many := labels == "16-labels"
		for _, name := range []string{"first-run", "replay"} {
			b.Run(labels+"/"+name, func(b *testing.B) {
				intercept := newServer(b, newMemory(b)).UnaryServerInterceptor()
				prefix := newKey()
				b.ReportAllocs()
				ctx := context.Background()
				for i := 0; b.Loop(); i++ {
					key := prefix
					if name == "first-run" {
						key += strconv.Itoa(i)
					}
					if _, err := intercept(ctx, benchRequest(key, many), info, handler); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		b.Run(labels+"/bare", func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			for b.Loop() {
				if _, err := handler(ctx, benchRequest("k", many)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
