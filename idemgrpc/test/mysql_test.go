package test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemkey/idemkey/idemgrpc/internal/testpb"
	"github.com/idemkey/idemkey/internal/proctest"
	"github.com/idemkey/idemkey/store/mysql"
)

// mysqlURL is the shared MySQL or MariaDB (MYSQL_URL, else the one on
// 3306 of loopback).
func mysqlURL() string {
	if u := os.Getenv("MYSQL_URL"); u != "" {
		return u
	}
	return "mysql://root@127.0.0.1:3306/test"
}

// myEnv is a MySQL store on a table of the test's own, and a payments
// table beside it that handlers write through the call's transaction.
type myEnv struct {
	db       *sql.DB
	st       *mysql.Store
	table    string // the store's
	payments string // the handlers'
}

// newMySQL returns a MySQL store on the shared server. Its pool of 40
// connections leaves room under the server's default max_connections
// (151) for the other packages' tests that run at the same time.
func newMySQL(t testing.TB) *myEnv {
	t.Helper()
	dsn, err := mysql.DSN(mysqlURL())
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(40)
	db.SetMaxIdleConns(40)
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		proctest.Unavailable(t, "no MySQL or MariaDB at MYSQL_URL or on 3306 of loopback: %v", err)
	}
	var b [6]byte
	rand.Read(b[:])
	e := &myEnv{db: db, table: "idemgrpc_test_" + hex.EncodeToString(b[:])}
	e.payments = e.table + "_payments"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+e.table+"`, `"+e.payments+"`")
	})
	if err := mysql.Migrate(ctx, db, mysql.WithTable(e.table)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE `"+e.payments+"` (k VARCHAR(255) NOT NULL, amount BIGINT NOT NULL, KEY (k)) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	e.st, err = mysql.New(ctx, db, mysql.WithTable(e.table), mysql.WithSweepInterval(0), mysql.WithCallTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.st.Close() })
	return e
}

// pay is a handler's write: a payment row, in the call's transaction
// (mysql.Tx).
func (e *myEnv) pay(ctx context.Context, key string, amount int64) error {
	tx := mysql.Tx(ctx)
	if tx == nil {
		return errors.New("no transaction in the handler's context")
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO `"+e.payments+"` (k, amount) VALUES (?, ?)", key, amount)
	return err
}

// rows counts the committed payments of key.
func (e *myEnv) rows(t testing.TB, key string) int {
	t.Helper()
	var n int
	if err := e.db.QueryRow("SELECT COUNT(*) FROM `"+e.payments+"` WHERE k = ?", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestMySQLTransaction: on MySQL and MariaDB the handler writes through
// mysql.Tx(ctx), as on HTTP, and its write commits with the kept answer's
// record (the repeat is a replay, and one row is there); a released code
// or a panic rolls it back (the retry runs again and writes once), a kept
// caller's error undoes it (the store's default) and is replayed, and a
// call without a key on an optional method runs in a transaction of its
// own that commits.
func TestMySQLTransaction(t *testing.T) {
	e := newMySQL(t)
	svc := &payments{}
	var fail atomic.Value // of func() error
	svc.Fn = func(ctx context.Context, req any) (*testpb.Payment, error) {
		r := req.(*testpb.CreatePaymentRequest)
		k := r.GetRequestId()
		if k == "" {
			k = "keyless-" + r.GetCurrency()
		}
		if err := e.pay(ctx, k, r.GetAmount()); err != nil {
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

	// Kept: one row, committed with the record, and the replay writes none.
	k := newKey()
	for range 2 {
		p, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: k, Amount: 1})
		if err != nil || p.GetRun() != 1 {
			t.Fatalf("kept: %v %v", p, err)
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
	if n := e.rows(t, k); n != 0 {
		t.Errorf("released: %d rows, want 0", n)
	}
	setFail(func() error { return nil })
	before := svc.Runs.Load()
	if _, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: k, Amount: 1}); err != nil {
		t.Fatal(err)
	}
	if n := e.rows(t, k); n != 1 || svc.Runs.Load() != before+1 {
		t.Errorf("released then kept: %d rows, want 1", n)
	}

	// A panic rolls back, and the retry runs again.
	k = newKey()
	setFail(func() error { panic("mid-payment") })
	if _, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: k, Amount: 1}); status.Code(err) != codes.Internal {
		t.Fatalf("panic: %v", err)
	}
	if n := e.rows(t, k); n != 0 {
		t.Errorf("panic: %d rows, want 0", n)
	}
	setFail(func() error { return nil })
	if _, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: k, Amount: 1}); err != nil {
		t.Fatalf("the retry after a panic: %v", err)
	}
	if n := e.rows(t, k); n != 1 {
		t.Errorf("panic then kept: %d rows, want 1", n)
	}

	// A kept caller's error: replayed, its writes undone.
	k = newKey()
	setFail(func() error { return status.Error(codes.FailedPrecondition, "insufficient funds") })
	before = svc.Runs.Load()
	for range 2 {
		if _, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{RequestId: k, Amount: 1}); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("kept error: %v", err)
		}
	}
	if n := e.rows(t, k); n != 0 || svc.Runs.Load() != before+1 {
		t.Errorf("kept caller's error: %d rows, %d runs, want 0 rows and 1 run", n, svc.Runs.Load()-before)
	}

	// No key, optional method: a transaction of its own, committed.
	setFail(func() error { return nil })
	before = svc.Runs.Load()
	if _, err := c.CreatePayment(ctx, &testpb.CreatePaymentRequest{Amount: 1, Currency: "eur"}); err != nil {
		t.Fatal(err)
	}
	if n := e.rows(t, "keyless-eur"); n != 1 || svc.Runs.Load() != before+1 {
		t.Errorf("keyless: %d rows, want 1", n)
	}
}
