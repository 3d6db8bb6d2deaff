package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"io"
	"log/slog"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkey/idemkey/examples/grpc-app/paymentspb"
	"github.com/idemkey/idemkey/idemgrpc"
	"github.com/idemkey/idemkey/store/mysql"
)

// start runs the service with env on a free port and returns a client of
// it, stopped when the test ends.
func start(t *testing.T, env map[string]string) paymentspb.PaymentsClient {
	t.Helper()
	env["ADDR"] = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, func(k string) string { return env[k] }, slog.New(slog.NewTextHandler(io.Discard, nil)), func(a string) { addr <- a })
	}()
	var a string
	select {
	case a = <-addr:
	case err := <-done:
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	cc, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return paymentspb.NewPaymentsClient(cc)
}

// session is the README's session: a payment, its retry (replayed), the
// same key in metadata (replayed), another amount under the key
// (refused), a call without a key (refused), a refused payment and its
// repeat (the refusal replayed), Bob's payment under the same key name,
// and one payment listed.
func session(t *testing.T, c paymentspb.PaymentsClient) {
	base, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ctx := metadata.AppendToOutgoingContext(base, "authorization", "Bearer alice")
	key := "k-" + rand.Text()
	req := &paymentspb.CreatePaymentRequest{RequestId: key, Amount: 10, Currency: "EUR"}
	first, err := c.CreatePayment(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if first.GetUser() != "alice" {
		t.Errorf("payment of %q", first.GetUser())
	}
	var h metadata.MD
	again, err := c.CreatePayment(ctx, req, grpc.Header(&h))
	if err != nil || !proto.Equal(first, again) || len(h.Get(idemgrpc.MetadataReplayed)) != 1 {
		t.Fatalf("retry: %v %v, header %v", again, err, h)
	}
	byMetadata := metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
	if p, err := c.CreatePayment(byMetadata, &paymentspb.CreatePaymentRequest{Amount: 10, Currency: "EUR"}); err != nil || !proto.Equal(first, p) {
		t.Fatalf("key in metadata: %v %v", p, err)
	}
	if _, err := c.CreatePayment(ctx, &paymentspb.CreatePaymentRequest{RequestId: key, Amount: 11, Currency: "EUR"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("another amount under the key: %v", err)
	}
	if _, err := c.CreatePayment(ctx, &paymentspb.CreatePaymentRequest{Amount: 10, Currency: "EUR"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no key: %v", err)
	}
	// The caller's own error is kept: the first call is refused, and its
	// repeat gets the refusal again, marked as replayed.
	refused := &paymentspb.CreatePaymentRequest{RequestId: "k-" + rand.Text(), Amount: -1, Currency: "EUR"}
	var rh metadata.MD
	_, err = c.CreatePayment(ctx, refused, grpc.Header(&rh))
	if status.Code(err) != codes.InvalidArgument || len(rh.Get(idemgrpc.MetadataReplayed)) != 0 {
		t.Fatalf("a refused payment: %v, header %v", err, rh)
	}
	first4xx := status.Convert(err).Message()
	rh = nil
	_, err = c.CreatePayment(ctx, refused, grpc.Header(&rh))
	if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != first4xx || len(rh.Get(idemgrpc.MetadataReplayed)) != 1 {
		t.Fatalf("its repeat: %v, header %v", err, rh)
	}
	// Bob's key of the same name is his own: his payment is another.
	bob := metadata.AppendToOutgoingContext(base, "authorization", "Bearer bob")
	if p, err := c.CreatePayment(bob, req); err != nil || p.GetUser() != "bob" || p.GetId() == first.GetId() {
		t.Fatalf("bob's payment under alice's key name: %v %v", p, err)
	}
	list, err := c.ListPayments(ctx, &paymentspb.ListPaymentsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range list.GetPayments() {
		if p.GetId() == first.GetId() {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("payment listed %d times", n)
	}
	if p, err := c.GetPayment(ctx, &paymentspb.GetPaymentRequest{Id: first.GetId()}); err != nil || !proto.Equal(p, first) {
		t.Fatalf("get: %v %v", p, err)
	}
}

func TestMemory(t *testing.T) { session(t, start(t, map[string]string{})) }

func TestRedis(t *testing.T) {
	u := os.Getenv("REDIS_URL")
	if u == "" {
		t.Skip("REDIS_URL not set")
	}
	session(t, start(t, map[string]string{"REDIS_URL": u}))
}

// TestPostgres runs the session on DATABASE_URL, in a schema of the
// test's own.
func TestPostgres(t *testing.T) {
	u := os.Getenv("DATABASE_URL")
	if u == "" {
		t.Skip("DATABASE_URL not set")
	}
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	// Closed after the schema is dropped (cleanups run last first), not
	// when the test function returns, before the drop would run.
	t.Cleanup(func() { admin.Close(context.Background()) })
	var b [6]byte
	rand.Read(b[:])
	schema := "grpcapp_test_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	q := pu.Query()
	q.Set("search_path", schema)
	pu.RawQuery = q.Encode()
	session(t, start(t, map[string]string{"DATABASE_URL": pu.String()}))
}

// TestMySQL runs the session on MYSQL_URL (a mysql:// URL, as DATABASE_URL
// takes it), in a database of the test's own.
func TestMySQL(t *testing.T) {
	u := os.Getenv("MYSQL_URL")
	if u == "" {
		t.Skip("MYSQL_URL not set")
	}
	dsn, err := mysql.DSN(u)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	// Closed after the database is dropped (cleanups run last first).
	t.Cleanup(func() { admin.Close() })
	var b [6]byte
	rand.Read(b[:])
	name := "grpcapp_test_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name)
	})
	mu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	mu.Path = "/" + name
	session(t, start(t, map[string]string{"DATABASE_URL": mu.String()}))
}
