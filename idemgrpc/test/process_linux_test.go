//go:build linux

package test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemkey/idemkey/idemgrpc"
	"github.com/idemkey/idemkey/idemgrpc/internal/testpb"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
	redisstore "github.com/idemkey/idemkey/store/redis"
)

// The multi-process tests run this test binary again as a server process
// (TestMain sees childEnv set): it serves the test service through the
// interceptor on a loopback port over a shared Redis or PostgreSQL, and
// prints "addr <host:port>" on its standard output, then "running" each
// time a handler starts. Its handler counts the runs where every process
// sees them (a Redis counter, or a row written in the call's
// transaction); with childHang set, the first handler to run writes its
// row and then hangs, until the process is killed.
const (
	childEnv      = "IDEMGRPC_TEST_CHILD" // "redis" or "postgres"
	childTable    = "IDEMGRPC_TEST_TABLE"
	childPayments = "IDEMGRPC_TEST_PAYMENTS"
	childCounter  = "IDEMGRPC_TEST_COUNTER"
	childHang     = "IDEMGRPC_TEST_HANG"
)

func TestMain(m *testing.M) {
	if kind := os.Getenv(childEnv); kind != "" {
		if err := runChild(kind); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func runChild(kind string) error {
	ctx := context.Background()
	var st store.Store
	var count func(ctx context.Context, r *testpb.CreatePaymentRequest) error
	switch kind {
	case "redis":
		opt, err := goredis.ParseURL(redisURL())
		if err != nil {
			return err
		}
		opt.ContextTimeoutEnabled, opt.PoolSize = true, 128
		c := goredis.NewClient(opt)
		if st, err = redisstore.New(c, redisstore.WithCallTimeout(5*time.Second)); err != nil {
			return err
		}
		counter := os.Getenv(childCounter)
		count = func(ctx context.Context, _ *testpb.CreatePaymentRequest) error { return c.Incr(ctx, counter).Err() }
	case "postgres":
		cfg, err := pgxpool.ParseConfig(databaseURL())
		if err != nil {
			return err
		}
		cfg.MaxConns = 80
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return err
		}
		if st, err = postgres.New(ctx, pool, postgres.WithTable(os.Getenv(childTable)), postgres.WithSweepInterval(0),
			postgres.WithCallTimeout(10*time.Second)); err != nil {
			return err
		}
		table := os.Getenv(childPayments)
		count = func(ctx context.Context, r *testpb.CreatePaymentRequest) error {
			return pay(ctx, table, r.GetRequestId(), r.GetAmount())
		}
	default:
		return fmt.Errorf("unknown store %q", kind)
	}
	srv, err := idemgrpc.NewServer(st)
	if err != nil {
		return err
	}
	hang := os.Getenv(childHang) != ""
	var out sync.Mutex
	say := func(s string) { out.Lock(); fmt.Println(s); out.Unlock() }
	var runs atomic.Int64
	svc := &payments{}
	svc.Fn = func(ctx context.Context, req any) (*testpb.Payment, error) {
		r := req.(*testpb.CreatePaymentRequest)
		n := runs.Add(1)
		say("running")
		if err := count(ctx, r); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if hang && n == 1 {
			select {}
		}
		time.Sleep(50 * time.Millisecond)
		return &testpb.Payment{Id: "pay_" + r.GetRequestId(), Amount: r.GetAmount(), Run: 1}, nil
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	gs := grpc.NewServer(grpc.UnaryInterceptor(srv.UnaryServerInterceptor()))
	testpb.RegisterPaymentsServer(gs, svc)
	say("addr " + lis.Addr().String())
	return gs.Serve(lis)
}

// child is a server process started by startChild.
type child struct {
	cmd     *exec.Cmd
	addr    string
	running chan struct{} // a value each time a handler starts
}

// startChild starts a server process with env added, and stops it (by
// its PID) when the test ends.
func startChild(t *testing.T, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	c := &child{cmd: cmd, running: make(chan struct{}, 128)}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "addr "):
				addr <- strings.TrimPrefix(line, "addr ")
			case line == "running":
				select {
				case c.running <- struct{}{}:
				default:
				}
			}
		}
	}()
	select {
	case c.addr = <-addr:
	case <-time.After(30 * time.Second):
		t.Fatal("the server process did not start")
	}
	return c
}

// TestTwoProcesses: 64 concurrent calls with one key, spread over two
// server processes on one Redis, and on one PostgreSQL, run the handler
// once in all.
func TestTwoProcesses(t *testing.T) {
	for _, kind := range []string{"redis", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			var env []string
			var runs func() int
			key := newKey()
			switch kind {
			case "redis":
				_, rc := newRedis(t)
				counter := "idemgrpc-test:" + newKey()
				t.Cleanup(func() { rc.Del(context.Background(), counter) })
				env = []string{childEnv + "=redis", childCounter + "=" + counter}
				runs = func() int {
					n, err := rc.Get(context.Background(), counter).Int()
					if err != nil && err != goredis.Nil {
						t.Fatal(err)
					}
					return n
				}
			case "postgres":
				e := newPostgres(t)
				env = []string{childEnv + "=postgres", childTable + "=" + e.table, childPayments + "=" + e.payments}
				runs = func() int { return e.rows(t, key) }
			}
			a, b := startChild(t, env...), startChild(t, env...)
			clients := []testpb.PaymentsClient{dialTCP(t, a.addr), dialTCP(t, b.addr)}
			ctx := timeout(t, 60*time.Second)
			req := &testpb.CreatePaymentRequest{RequestId: key, Amount: 5}
			var ok, aborted atomic.Int64
			var wg sync.WaitGroup
			for i := range 64 {
				wg.Go(func() {
					p, err := clients[i%2].CreatePayment(ctx, req)
					switch {
					case err == nil && p.GetId() == "pay_"+key:
						ok.Add(1)
					case status.Code(err) == codes.Aborted:
						aborted.Add(1)
					default:
						t.Errorf("call: %v %v", p, err)
					}
				})
			}
			wg.Wait()
			if n := runs(); n != 1 {
				t.Fatalf("the handler ran %d times over two processes", n)
			}
			for _, c := range clients {
				if _, err := c.CreatePayment(ctx, req); err != nil {
					t.Fatalf("after the run: %v", err)
				}
			}
			if n := runs(); n != 1 {
				t.Fatalf("the handler ran %d times after the replays", n)
			}
			t.Logf("%d OK, %d ABORTED", ok.Load(), aborted.Load())
		})
	}
}

// TestKilledMidCall: on PostgreSQL, a server process killed with SIGKILL
// while its handler has written a payment in the call's transaction takes
// that write with it; the client's retry, on another process, runs the
// handler and pays once, and every later repeat replays.
func TestKilledMidCall(t *testing.T) {
	e := newPostgres(t)
	env := []string{childEnv + "=postgres", childTable + "=" + e.table, childPayments + "=" + e.payments}
	doomed := startChild(t, append(env, childHang+"=1")...)
	survivor := startChild(t, env...)
	key := newKey()
	req := &testpb.CreatePaymentRequest{RequestId: key, Amount: 100}
	ctx := timeout(t, 60*time.Second)

	first := make(chan error, 1)
	go func() {
		_, err := dialTCP(t, doomed.addr).CreatePayment(ctx, req)
		first <- err
	}()
	select {
	case <-doomed.running:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not start")
	}
	// Let the handler's write reach the server before the kill.
	time.Sleep(200 * time.Millisecond)
	if err := doomed.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-first; status.Code(err) != codes.Unavailable {
		t.Fatalf("the call to the killed process: %v, want UNAVAILABLE", err)
	}
	doomed.cmd.Wait()

	// The retry goes to the survivor, through the client interceptor: the
	// killed owner's claim is taken over once its transaction is gone.
	cl := newClient(t, idemgrpc.WithMaxAttempts(20), idemgrpc.WithBackoff(50*time.Millisecond, time.Second))
	c := dialTCP(t, survivor.addr, grpc.WithUnaryInterceptor(cl.UnaryClientInterceptor()))
	p, err := c.CreatePayment(ctx, req)
	if err != nil || p.GetId() != "pay_"+key {
		t.Fatalf("retry: %v %v", p, err)
	}
	for range 3 {
		if _, err := c.CreatePayment(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.rows(t, key); n != 1 {
		t.Fatalf("%d payments for one key after a kill and retries", n)
	}
}
