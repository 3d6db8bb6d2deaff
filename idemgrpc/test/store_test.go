package test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemkey/idemkey/idemgrpc/internal/testpb"
	"github.com/idemkey/idemkey/internal/pgtest"
	"github.com/idemkey/idemkey/internal/proctest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
	redisstore "github.com/idemkey/idemkey/store/redis"
)

// redisURL is the shared Redis (REDIS_URL, else the one on 6379 of
// loopback).
func redisURL() string {
	if u := os.Getenv("REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

// databaseURL is the shared PostgreSQL (DATABASE_URL, else the one on
// 5432 of loopback).
func databaseURL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// newRedis returns a store on the shared Redis. Its keys are the
// fresh random keys of the test, under idemkey's own names: nothing else
// is touched.
func newRedis(t testing.TB) (store.Store, *goredis.Client) {
	t.Helper()
	opt, err := goredis.ParseURL(redisURL())
	if err != nil {
		t.Fatal(err)
	}
	opt.ContextTimeoutEnabled = true
	opt.PoolSize = 128
	c := goredis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		proctest.Unavailable(t, "no Redis at %s (set REDIS_URL): %v", opt.Addr, err)
	}
	st, err := redisstore.New(c, redisstore.WithCallTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return st, c
}

// pgEnv is a PostgreSQL store on a table of the test's own, and a
// payments table beside it that handlers write through the request's
// transaction.
type pgEnv struct {
	pool     *pgxpool.Pool
	st       *postgres.Store
	table    string // the store's
	payments string // the handlers'
}

func newPostgres(t testing.TB) *pgEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(databaseURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 80
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		proctest.Unavailable(t, "no PostgreSQL at DATABASE_URL or on 5432 of loopback: %v", err)
	}
	t.Cleanup(pool.Close)
	var b [6]byte
	rand.Read(b[:])
	e := &pgEnv{pool: pool, table: "idemgrpc_test_" + hex.EncodeToString(b[:])}
	e.payments = e.table + "_payments"
	if err := postgres.Migrate(ctx, pool, postgres.WithTable(e.table)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{e.payments}.Sanitize()+" (key text NOT NULL, amount bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pool.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{e.table}.Sanitize()+", "+pgx.Identifier{e.payments}.Sanitize()+
			"; DROP FUNCTION IF EXISTS "+pgx.Identifier{e.table + "_claim"}.Sanitize())
	})
	e.st = e.open(t, pool)
	return e
}

// open returns a store on e's table over pool.
func (e *pgEnv) open(t testing.TB, pool *pgxpool.Pool) *postgres.Store {
	t.Helper()
	st, err := postgres.New(context.Background(), pool, postgres.WithTable(e.table), postgres.WithSweepInterval(0),
		postgres.WithCallTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// pay is a handler's write: a payment row, in the call's transaction.
func pay(ctx context.Context, table, key string, amount int64) error {
	tx := postgres.Tx(ctx)
	if tx == nil {
		return errors.New("no transaction in the handler's context")
	}
	_, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{table}.Sanitize()+" (key, amount) VALUES ($1, $2)", key, amount)
	return err
}

func (e *pgEnv) rows(t testing.TB, key string) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{e.payments}.Sanitize()+" WHERE key = $1", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestOneKeyConcurrently: 64 concurrent calls with one key run the
// handler once, on every store; the others get ABORTED while it runs, and
// every call after it gets its answer. On the SQL stores the handler's
// write, made in the call's transaction, lands once.
func TestOneKeyConcurrently(t *testing.T) {
	// sqlStore is a store, with, on the SQL stores, the handler's write
	// through the call's transaction and the count of those committed.
	type sqlStore struct {
		st   store.Store
		pay  func(ctx context.Context, key string, amount int64) error
		rows func(t testing.TB, key string) int
	}
	stores := map[string]func(t *testing.T) sqlStore{
		"memory": func(t *testing.T) sqlStore { return sqlStore{st: newMemory(t)} },
		"redis": func(t *testing.T) sqlStore {
			st, _ := newRedis(t)
			return sqlStore{st: st}
		},
		"postgres": func(t *testing.T) sqlStore {
			e := newPostgres(t)
			return sqlStore{e.st, func(ctx context.Context, key string, amount int64) error {
				return pay(ctx, e.payments, key, amount)
			}, e.rows}
		},
		"mysql": func(t *testing.T) sqlStore {
			e := newMySQL(t)
			return sqlStore{e.st, e.pay, e.rows}
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			b := open(t)
			st, rows := b.st, b.rows
			svc := &payments{}
			svc.Fn = func(ctx context.Context, req any) (*testpb.Payment, error) {
				r := req.(*testpb.CreatePaymentRequest)
				time.Sleep(50 * time.Millisecond)
				if b.pay != nil {
					if err := b.pay(ctx, r.GetRequestId(), r.GetAmount()); err != nil {
						return nil, status.Error(codes.Internal, err.Error())
					}
				}
				return &testpb.Payment{Id: "pay_once", Amount: r.GetAmount(), Run: svc.Runs.Load()}, nil
			}
			c := dialTCP(t, serveTCP(t, newServer(t, st), svc))
			ctx := timeout(t, 30*time.Second)
			key := newKey()
			req := &testpb.CreatePaymentRequest{RequestId: key, Amount: 42}
			var ok, aborted, other atomic.Int64
			var wg sync.WaitGroup
			for range 64 {
				wg.Go(func() {
					p, err := c.CreatePayment(ctx, req)
					switch {
					case err == nil && p.GetId() == "pay_once" && p.GetRun() == 1:
						ok.Add(1)
					case status.Code(err) == codes.Aborted:
						aborted.Add(1)
					default:
						other.Add(1)
						t.Errorf("call: %v %v", p, err)
					}
				})
			}
			wg.Wait()
			if n := svc.Runs.Load(); n != 1 {
				t.Fatalf("handler ran %d times for one key", n)
			}
			if ok.Load() < 1 || other.Load() != 0 {
				t.Fatalf("answers: %d OK, %d ABORTED, %d other", ok.Load(), aborted.Load(), other.Load())
			}
			for range 3 {
				p, err := c.CreatePayment(ctx, req)
				if err != nil || p.GetRun() != 1 {
					t.Fatalf("after the first run: %v %v", p, err)
				}
			}
			if rows != nil {
				if n := rows(t, key); n != 1 {
					t.Fatalf("%d payment rows for one key", n)
				}
			}
			t.Logf("%d OK, %d ABORTED", ok.Load(), aborted.Load())
		})
	}
}

// TestPostgresTransaction: on PostgreSQL the handler writes through
// postgres.Tx(ctx), as on HTTP, and its writes commit with the kept
// answer: a released code or a panic rolls them back (the retry runs
// again and writes once), a kept caller's error undoes them (the store's
// default) and is replayed, and a call without a key on an optional method
// runs in a transaction of its own that commits.
func TestPostgresTransaction(t *testing.T) {
	e := newPostgres(t)
	svc := &payments{}
	var fail atomic.Value // of func(run int64) error, nil for none
	svc.Fn = func(ctx context.Context, req any) (*testpb.Payment, error) {
		r := req.(*testpb.CreatePaymentRequest)
		k := r.GetRequestId()
		if k == "" {
			k = "keyless-" + r.GetCurrency()
		}
		if err := pay(ctx, e.payments, k, r.GetAmount()); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if f, _ := fail.Load().(func() error); f != nil {
			if err := f(); err != nil {
				return nil, err
			}
		}
		return &testpb.Payment{Id: "pay_" + k, Run: svc.Runs.Load()}, nil
	}
	c := dialTCP(t, serveTCP(t, newServer(t, e.st), svc))
	ctx := timeout(t, 30*time.Second)
	setFail := func(f func() error) { fail.Store(f) }

	// Kept: one row, and the replay writes none.
	k := newKey()
	for range 2 {
		if _, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: k, Amount: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.rows(t, k); n != 1 {
		t.Errorf("kept: %d rows, want 1", n)
	}

	// Released, then run again: the failed run's row is rolled back.
	k = newKey()
	setFail(func() error { return status.Error(codes.Unavailable, "bank down") })
	if _, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: k, Amount: 1}); status.Code(err) != codes.Unavailable {
		t.Fatalf("released: %v", err)
	}
	setFail(func() error { return nil })
	if _, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: k, Amount: 1}); err != nil {
		t.Fatal(err)
	}
	if n := e.rows(t, k); n != 1 {
		t.Errorf("released then kept: %d rows, want 1", n)
	}

	// A panic rolls back.
	k = newKey()
	setFail(func() error { panic("mid-payment") })
	if _, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: k, Amount: 1}); status.Code(err) != codes.Internal {
		t.Fatalf("panic: %v", err)
	}
	if n := e.rows(t, k); n != 0 {
		t.Errorf("panic: %d rows, want 0", n)
	}

	// A kept caller's error: replayed, its writes undone.
	k = newKey()
	setFail(func() error { return status.Error(codes.FailedPrecondition, "insufficient funds") })
	for range 2 {
		if _, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: k, Amount: 1}); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("kept error: %v", err)
		}
	}
	if n := e.rows(t, k); n != 0 {
		t.Errorf("kept caller's error: %d rows, want 0", n)
	}

	// No key, optional method: a transaction of its own, committed.
	setFail(func() error { return nil })
	before := svc.Runs.Load()
	if _, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{Amount: 1, Currency: "eur"}); err != nil {
		t.Fatal(err)
	}
	if n := e.rows(t, "keyless-eur"); n != 1 || svc.Runs.Load() != before+1 {
		t.Errorf("keyless: %d rows, want 1", n)
	}
}

// TestPostgresHandlerEndsTransaction: a handler that ends the call's
// transaction itself (COMMIT as SQL) has its writes in; the store keeps
// the answer outside the transaction, fenced by the claim's token, and a
// retry replays it: one payment.
func TestPostgresHandlerEndsTransaction(t *testing.T) {
	e := newPostgres(t)
	svc := &payments{}
	svc.Fn = func(ctx context.Context, req any) (*testpb.Payment, error) {
		r := req.(*testpb.CreatePaymentRequest)
		if err := pay(ctx, e.payments, r.GetRequestId(), 1); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if _, err := postgres.Tx(ctx).Exec(ctx, "COMMIT"); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return &testpb.Payment{Id: "pay", Run: svc.Runs.Load()}, nil
	}
	c := dialTCP(t, serveTCP(t, newServer(t, e.st), svc))
	ctx := timeout(t, 30*time.Second)
	k := newKey()
	for range 3 {
		p, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: k})
		if err != nil || p.GetRun() != 1 {
			t.Fatalf("%v %v", p, err)
		}
	}
	if n, rows := svc.Runs.Load(), e.rows(t, k); n != 1 || rows != 1 {
		t.Fatalf("%d runs, %d payments for one key", n, rows)
	}
}

// TestPostgresSQLTx: on the database/sql face (postgres.NewDB) the
// handler gets its transaction with postgres.SQLTx(ctx), as on HTTP: a
// kept answer commits its write once, a released one rolls it back.
func TestPostgresSQLTx(t *testing.T) {
	e := newPostgres(t)
	db := stdlib.OpenDBFromPool(e.pool)
	t.Cleanup(func() { db.Close() })
	st, err := postgres.NewDB(context.Background(), db, postgres.WithTable(e.table), postgres.WithSweepInterval(0),
		postgres.WithCallTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	svc := &payments{}
	var fail atomic.Bool
	svc.Fn = func(ctx context.Context, req any) (*testpb.Payment, error) {
		r := req.(*testpb.CreatePaymentRequest)
		tx := postgres.SQLTx(ctx)
		if tx == nil {
			return nil, status.Error(codes.Internal, "no *sql.Tx in the handler's context")
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+pgx.Identifier{e.payments}.Sanitize()+" (key, amount) VALUES ($1, 1)", r.GetRequestId()); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if fail.Load() {
			return nil, status.Error(codes.Unavailable, "bank down")
		}
		return &testpb.Payment{Id: "pay", Run: svc.Runs.Load()}, nil
	}
	c := dialTCP(t, serveTCP(t, newServer(t, st), svc))
	ctx := timeout(t, 30*time.Second)
	k := newKey()
	fail.Store(true)
	if _, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: k}); status.Code(err) != codes.Unavailable {
		t.Fatalf("released: %v", err)
	}
	fail.Store(false)
	for range 2 {
		if _, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: k}); err != nil {
			t.Fatal(err)
		}
	}
	if n, rows := svc.Runs.Load(), e.rows(t, k); n != 2 || rows != 1 {
		t.Fatalf("%d runs, %d payments, want 2 runs (one released) and 1 payment", n, rows)
	}
}

// TestOneKeyBehindPgBouncer: 64 concurrent calls with one key, on a
// PostgreSQL store reached through PgBouncer in transaction mode (whose
// server connections are handed from client to client between
// transactions), run the handler once and make one payment.
func TestOneKeyBehindPgBouncer(t *testing.T) {
	e := newPostgres(t)
	b := pgtest.StartPgBouncer(t, databaseURL(), pgtest.PoolSize(20), pgtest.MaxClientConn(200))
	cfg, err := pgxpool.ParseConfig(b.URL + "&default_query_exec_mode=exec")
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 80
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st := e.open(t, pool)
	svc := &payments{}
	svc.Fn = func(ctx context.Context, req any) (*testpb.Payment, error) {
		r := req.(*testpb.CreatePaymentRequest)
		if err := pay(ctx, e.payments, r.GetRequestId(), r.GetAmount()); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		time.Sleep(50 * time.Millisecond)
		return &testpb.Payment{Id: "pay_once", Run: svc.Runs.Load()}, nil
	}
	c := dialTCP(t, serveTCP(t, newServer(t, st), svc))
	ctx := timeout(t, 60*time.Second)
	key := newKey()
	req := &testpb.CreatePaymentRequest{RequestId: key, Amount: 3}
	var wg sync.WaitGroup
	var ok atomic.Int64
	for range 64 {
		wg.Go(func() {
			p, err := c.CreatePayment(ctx, req)
			switch {
			case err == nil && p.GetRun() == 1:
				ok.Add(1)
			case status.Code(err) == codes.Aborted:
			default:
				t.Errorf("call: %v %v", p, err)
			}
		})
	}
	wg.Wait()
	if n, rows := svc.Runs.Load(), e.rows(t, key); n != 1 || rows != 1 || ok.Load() < 1 {
		t.Fatalf("%d runs, %d payments, %d OK for one key behind PgBouncer", n, rows, ok.Load())
	}
}
