// Command grpc-app is the payment service of the HTTP examples over gRPC,
// protected by idemgrpc: a retried CreatePayment makes one payment, however
// often its reply is lost.
//
//	go run ./examples/grpc-app
//	grpcurl -plaintext -d '{"request_id":"k1","amount":10,"currency":"EUR"}' 127.0.0.1:9090 payments.v1.Payments/CreatePayment
//
// Without REDIS_URL or DATABASE_URL it keeps its keys in memory; with
// DATABASE_URL (postgres://, or mysql:// for MySQL and MariaDB) its
// payments and their kept answers commit together in that database, in the
// tables the HTTP examples use, so the two front doors share one store.
// See README.md beside this file.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/idemkey/idemkey/examples/grpc-app/paymentspb"
	"github.com/idemkey/idemkey/idemgrpc"
	"github.com/idemkey/idemkey/scope"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/postgres"
	idemredis "github.com/idemkey/idemkey/store/redis"
)

// DefaultAddr is where the service listens when ADDR is unset.
const DefaultAddr = "127.0.0.1:9090"

// PaymentDeadline bounds a CreatePayment's handler (and its claim lives 5
// seconds more), as POST /payments in the HTTP examples.
const PaymentDeadline = 5 * time.Second

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv, logger, nil); err != nil {
		logger.Error("grpc-app", "error", err)
		os.Exit(1)
	}
}

// run serves until ctx ends. ready, when not nil, is told the address
// once the service listens.
func run(ctx context.Context, getenv func(string) string, logger *slog.Logger, ready func(addr string)) error {
	addr := getenv("ADDR")
	if addr == "" {
		addr = DefaultAddr
	}
	var delay time.Duration
	if v := getenv("PAYMENT_DELAY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("PAYMENT_DELAY=%q: want a duration such as 3s", v)
		}
		delay = d
	}
	b, err := openBackend(ctx, getenv("DATABASE_URL"), getenv("REDIS_URL"), logger)
	if err != nil {
		return err
	}
	defer b.close()

	idem, err := idemgrpc.NewServer(b.store,
		idemgrpc.WithDefault(idemgrpc.Off),
		idemgrpc.WithMethod(paymentspb.Payments_CreatePayment_FullMethodName, idemgrpc.Required, PaymentDeadline),
		idemgrpc.WithObserver(idemgrpc.SlogObserver(logger)))
	if err != nil {
		return err
	}
	// Authentication first (the idempotency scope is the signed-in
	// user), then idempotency.
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(auth, idem.UnaryServerInterceptor()))
	paymentspb.RegisterPaymentsServer(gs, &service{book: b.book, delay: delay})
	reflection.Register(gs)

	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	logger.Info("grpc-app listening", "addr", lis.Addr().String(), "store", b.name)
	if ready != nil {
		ready(lis.Addr().String())
	}
	done := make(chan error, 1)
	go func() { done <- gs.Serve(lis) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		gs.GracefulStop()
		return nil
	}
}

// auth is the demo authentication of the HTTP examples, in metadata:
// "authorization: Bearer <user>" signs the caller in as <user>, with no
// password; a call without it is anonymous. A real service verifies a
// token here and stores the id it proves.
func auth(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get("authorization")
	if len(v) == 0 {
		return h(ctx, req)
	}
	scheme, user, ok := strings.Cut(strings.TrimSpace(v[0]), " ")
	user = strings.TrimSpace(user)
	if len(v) != 1 || !ok || !strings.EqualFold(scheme, "Bearer") || user == "" || len(user) > 64 || user == scope.Anonymous {
		return nil, status.Error(codes.Unauthenticated, `send "authorization: Bearer <user>", or no authorization at all`)
	}
	return h(scope.NewContext(ctx, user), req)
}

// service is the Payments service.
type service struct {
	paymentspb.UnimplementedPaymentsServer
	book  book
	delay time.Duration
}

func (s *service) CreatePayment(ctx context.Context, r *paymentspb.CreatePaymentRequest) (*paymentspb.Payment, error) {
	if r.GetAmount() <= 0 {
		return nil, status.Error(codes.InvalidArgument, "amount must be positive, in the currency's smallest unit")
	}
	if c := r.GetCurrency(); len(c) != 3 || strings.ToUpper(c) != c {
		return nil, status.Error(codes.InvalidArgument, `currency must be three upper-case letters, such as "EUR"`)
	}
	user := scope.Anonymous
	if u, ok := scope.FromContext(ctx); ok {
		user = u
	}
	p := &paymentspb.Payment{Id: "pay_" + strings.ToLower(rand.Text()[:16]), Amount: r.GetAmount(), Currency: r.GetCurrency(), User: user}
	if err := s.book.add(ctx, p); err != nil {
		// UNAVAILABLE is released: the retry with the same key runs again.
		return nil, status.Error(codes.Unavailable, "the payment could not be made; retry with the same request_id")
	}
	if s.delay > 0 {
		t := time.NewTimer(s.delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			// Past the deadline: the transaction rolls back (DEADLINE_EXCEEDED
			// is released), and in memory the payment is taken back.
			s.book.remove(p.GetId())
			return nil, status.Error(codes.DeadlineExceeded, "the payment took longer than its deadline and was undone")
		}
	}
	return p, nil
}

func (s *service) GetPayment(ctx context.Context, r *paymentspb.GetPaymentRequest) (*paymentspb.Payment, error) {
	p, err := s.book.get(ctx, r.GetId())
	switch {
	case err != nil:
		return nil, status.Error(codes.Unavailable, "the payments cannot be read now")
	case p == nil:
		return nil, status.Error(codes.NotFound, "no such payment")
	}
	return p, nil
}

func (s *service) ListPayments(ctx context.Context, _ *paymentspb.ListPaymentsRequest) (*paymentspb.ListPaymentsResponse, error) {
	ps, err := s.book.all(ctx)
	if err != nil {
		return nil, status.Error(codes.Unavailable, "the payments cannot be read now")
	}
	return &paymentspb.ListPaymentsResponse{Payments: ps}, nil
}

// book is where payments go: memory, or the payments table of the
// store's database.
type book interface {
	add(ctx context.Context, p *paymentspb.Payment) error
	remove(id string)
	get(ctx context.Context, id string) (*paymentspb.Payment, error)
	all(ctx context.Context) ([]*paymentspb.Payment, error)
}

type memoryBook struct {
	mu sync.Mutex
	ps []*paymentspb.Payment
}

func (m *memoryBook) add(_ context.Context, p *paymentspb.Payment) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ps = append(m.ps, p)
	return nil
}

func (m *memoryBook) remove(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, p := range m.ps {
		if p.GetId() == id {
			m.ps = append(m.ps[:i], m.ps[i+1:]...)
			return
		}
	}
}

func (m *memoryBook) get(_ context.Context, id string) (*paymentspb.Payment, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.ps {
		if p.GetId() == id {
			return p, nil
		}
	}
	return nil, nil
}

func (m *memoryBook) all(context.Context) ([]*paymentspb.Payment, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]*paymentspb.Payment{}, m.ps...), nil
}

// paymentsSchema is the payments table of the HTTP examples on
// PostgreSQL, created at start when it is missing.
const paymentsSchema = `CREATE TABLE IF NOT EXISTS payments (
    id         text PRIMARY KEY,
    amount     bigint NOT NULL CHECK (amount > 0),
    currency   text NOT NULL,
    user_name  text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
)`

// dbBook is the payments table on PostgreSQL, written through the call's
// transaction, which idemgrpc commits with the kept answer.
type dbBook struct{ pool *pgxpool.Pool }

func (d dbBook) add(ctx context.Context, p *paymentspb.Payment) error {
	tx := postgres.Tx(ctx)
	if tx == nil {
		return errors.New("no call transaction: CreatePayment needs idemgrpc on the PostgreSQL store")
	}
	_, err := tx.Exec(ctx, "INSERT INTO payments (id, amount, currency, user_name) VALUES ($1, $2, $3, $4)",
		p.GetId(), p.GetAmount(), p.GetCurrency(), p.GetUser())
	return err
}

func (dbBook) remove(string) {} // the transaction rolls back

func (d dbBook) get(ctx context.Context, id string) (*paymentspb.Payment, error) {
	ps, err := d.query(ctx, "SELECT id, amount, currency, user_name FROM payments WHERE id = $1", id)
	if err != nil || len(ps) == 0 {
		return nil, err
	}
	return ps[0], nil
}

func (d dbBook) all(ctx context.Context) ([]*paymentspb.Payment, error) {
	return d.query(ctx, "SELECT id, amount, currency, user_name FROM payments ORDER BY created_at, id")
}

func (d dbBook) query(ctx context.Context, sql string, args ...any) ([]*paymentspb.Payment, error) {
	rows, err := d.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (*paymentspb.Payment, error) {
		p := &paymentspb.Payment{}
		return p, r.Scan(&p.Id, &p.Amount, &p.Currency, &p.User)
	})
}

// backend is the store the service runs on, and its payments.
type backend struct {
	store store.Store
	name  string
	book  book
	close func()
}

// openBackend opens PostgreSQL, or MySQL or MariaDB, when databaseURL is
// set (a postgres:// or a mysql:// URL), Redis when redisURL is, and
// otherwise the in-memory store; not both.
func openBackend(ctx context.Context, databaseURL, redisURL string, logger *slog.Logger) (*backend, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	switch {
	case databaseURL != "" && redisURL != "":
		return nil, errors.New("set DATABASE_URL or REDIS_URL, not both")
	case strings.HasPrefix(databaseURL, "mysql://"):
		return openMySQL(ctx, databaseURL)
	case databaseURL != "":
		if !strings.HasPrefix(databaseURL, "postgres") {
			return nil, errors.New("DATABASE_URL: this example speaks PostgreSQL (postgres://) and MySQL or MariaDB (mysql://)")
		}
		pool, err := pgxpool.New(ctx, databaseURL)
		if err != nil {
			return nil, errors.New("DATABASE_URL is not a valid postgres:// URL")
		}
		err = pool.Ping(ctx)
		if err == nil {
			err = postgres.Migrate(ctx, pool)
		}
		if err == nil {
			_, err = pool.Exec(ctx, paymentsSchema)
		}
		var st *postgres.Store
		if err == nil {
			st, err = postgres.New(ctx, pool)
		}
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("setting up PostgreSQL: %w", err)
		}
		return &backend{store: st, name: "postgres", book: dbBook{pool}, close: func() { st.Close(); pool.Close() }}, nil
	case redisURL != "":
		opts, err := goredis.ParseURL(redisURL)
		if err != nil {
			return nil, errors.New("REDIS_URL is not a valid redis:// URL")
		}
		opts.ContextTimeoutEnabled = true
		if opts.PoolSize == 0 {
			opts.PoolSize = 128
		}
		c := goredis.NewClient(opts)
		st, err := idemredis.New(c)
		if err == nil {
			err = c.Ping(ctx).Err()
		}
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("connecting to Redis: %w", err)
		}
		return &backend{store: st, name: "redis", book: &memoryBook{}, close: func() { c.Close() }}, nil
	}
	logger.Info("keys live in this process only; set REDIS_URL or DATABASE_URL to share them between instances")
	st, err := memory.New()
	if err != nil {
		return nil, err
	}
	return &backend{store: st, name: "memory", book: &memoryBook{}, close: func() { st.Close() }}, nil
}
