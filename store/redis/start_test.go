package redis_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/redistest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// fakeServer accepts connections on a loopback port and answers every
// command with reply, a RESP line such as "-LOADING ...\r\n"; with reply
// "", it reads and never answers.
type fakeServer struct {
	ln    net.Listener
	reply string
	mu    sync.Mutex
	conns []net.Conn
}

func newFakeServer(t *testing.T, reply string) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeServer{ln: ln, reply: reply}
	go f.serve()
	t.Cleanup(f.close)
	return f
}

func (f *fakeServer) Addr() string { return f.ln.Addr().String() }

func (f *fakeServer) close() {
	f.ln.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Close()
	}
}

func (f *fakeServer) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns = append(f.conns, c)
		f.mu.Unlock()
		go f.handle(c)
	}
}

// handle reads commands (RESP arrays of bulk strings) and answers each.
func (f *fakeServer) handle(c net.Conn) {
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
		for range n {
			hdr, err := r.ReadString('\n')
			if err != nil {
				return
			}
			size, _ := strconv.Atoi(strings.TrimSpace(hdr[1:]))
			if _, err := io.CopyN(io.Discard, r, int64(size)+2); err != nil {
				return
			}
		}
		if f.reply != "" {
			io.WriteString(c, f.reply)
		}
	}
}

// TestStartBounded: New and Check against a server that accepts the
// connection and never answers return within their budget when the
// caller's context has none, with an error that names the server and
// says it timed out; so does NewContext within its context's deadline.
func TestStartBounded(t *testing.T) {
	silent := newFakeServer(t, "")
	const margin = 2 * time.Second // a loaded machine
	for _, ctxTimeouts := range []bool{true, false} {
		client := func(addr string) *goredis.Client {
			c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: ctxTimeouts, MaxRetries: -1})
			t.Cleanup(func() { c.Close() })
			return c
		}
		for _, tc := range []struct {
			name   string
			ctx    func() (context.Context, context.CancelFunc)
			opts   []redis.Option
			budget time.Duration
		}{
			{"defaults", nil, nil, redis.DefaultStartTimeout},
			{"start budget", nil, []redis.Option{redis.WithCallTimeout(time.Hour), redis.WithStartTimeout(300 * time.Millisecond)}, 300 * time.Millisecond},
			{"context deadline", func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 300*time.Millisecond)
			}, []redis.Option{redis.WithCallTimeout(time.Hour)}, 300 * time.Millisecond},
		} {
			t.Run(fmt.Sprintf("%s/ContextTimeoutEnabled=%v", tc.name, ctxTimeouts), func(t *testing.T) {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if tc.ctx != nil {
					ctx, cancel = tc.ctx()
				}
				defer cancel()
				start := time.Now()
				_, err := redis.NewContext(ctx, client(silent.Addr()), tc.opts...)
				took := time.Since(start)
				t.Logf("New after %v: %v", took, err)
				checkStartError(t, err, silent.Addr(), took, tc.budget+margin)

				// Check, once New is done, on a server that stops.
				srv := redistest.StartServer(t)
				st, err := redis.New(client(srv.Addr), tc.opts...)
				if err != nil {
					t.Fatal(err)
				}
				srv.Freeze()
				defer srv.Thaw()
				ctx, cancel = context.Background(), context.CancelFunc(func() {})
				if tc.ctx != nil {
					ctx, cancel = tc.ctx()
				}
				defer cancel()
				start = time.Now()
				_, err = st.Check(ctx)
				took = time.Since(start)
				t.Logf("Check after %v: %v", took, err)
				checkStartError(t, err, srv.Addr, took, tc.budget+margin)
			})
		}
	}
}

func checkStartError(t *testing.T, err error, addr string, took, bound time.Duration) {
	t.Helper()
	if err == nil {
		t.Fatal("a server that never answers was accepted")
	}
	if took > bound {
		t.Errorf("took %v, want at most %v", took, bound)
	}
	if !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrUnreachable) {
		t.Errorf("error %v, want ErrUnavailable (the server was reached) and not ErrUnreachable", err)
	}
	if msg := err.Error(); !strings.Contains(msg, addr) || !(strings.Contains(msg, "deadline exceeded") || strings.Contains(msg, "timeout")) {
		t.Errorf("error %q does not name the server %s and the timeout", msg, addr)
	}
}

// TestUnreachable: a store call's error wraps store.ErrUnreachable when
// the server could not be reached at all (the dial refused or timed out,
// the host unknown), and only store.ErrUnavailable when it was reached
// and failed or refused (a full pool, OOM, READONLY, LOADING, NOPERM, a
// reply that never came). WithFailOpen runs a handler only on the first
// kind.
func TestUnreachable(t *testing.T) {
	ctx := context.Background()
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	closed := fmt.Sprintf("127.0.0.1:%d", port)
	srv := redistest.StartServer(t)
	var fail sync.Map // addresses whose dial fails, and how
	dialer := func(ctx context.Context, network, addr string) (net.Conn, error) {
		how, _ := fail.Load(addr)
		if to, ok := strings.CutPrefix(fmt.Sprint(how), "to:"); ok {
			addr = to
		}
		switch how {
		case "refused":
			var d net.Dialer
			return d.DialContext(ctx, network, closed)
		case "timeout":
			<-ctx.Done()
			var d net.Dialer
			return d.DialContext(ctx, network, addr) // the dial a context ended
		case "dns":
			return nil, &net.OpError{Op: "dial", Net: network, Err: &net.DNSError{Err: "no such host", Name: "redis.invalid", IsNotFound: true}}
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	// A store made while its server answers, on a client whose pooled
	// connections are not used again after a millisecond, so that each
	// call after New dials with dialer.
	storeWith := func(t *testing.T, addr string) *redis.Store {
		t.Helper()
		c := goredis.NewClient(&goredis.Options{Addr: addr, Dialer: dialer, DialTimeout: 50 * time.Millisecond, ContextTimeoutEnabled: true, ConnMaxIdleTime: time.Millisecond})
		t.Cleanup(func() { c.Close() })
		st, err := redis.New(c, redis.WithCallTimeout(faultBudget))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
		return st
	}
	for _, how := range []string{"refused", "timeout", "dns"} {
		t.Run("unreachable/"+how, func(t *testing.T) {
			st := storeWith(t, srv.Addr)
			fail.Store(srv.Addr, how)
			defer fail.Delete(srv.Addr)
			_, err := st.Claim(ctx, newKey(), newClaim(1))
			t.Logf("claim: %v", err)
			if !errors.Is(err, store.ErrUnreachable) || !errors.Is(err, store.ErrUnavailable) {
				t.Errorf("claim: %v, want ErrUnreachable (and ErrUnavailable)", err)
			}
		})
	}
	t.Run("unreachable/New", func(t *testing.T) {
		c := goredis.NewClient(&goredis.Options{Addr: closed, ContextTimeoutEnabled: true})
		defer c.Close()
		_, err := redis.New(c)
		t.Logf("New: %v", err)
		if !errors.Is(err, store.ErrUnreachable) || !strings.Contains(err.Error(), closed) {
			t.Errorf("New: %v, want ErrUnreachable naming %s", err, closed)
		}
	})

	reached := func(t *testing.T, what string, err error) {
		t.Helper()
		t.Logf("%s: %v", what, err)
		if !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrUnreachable) {
			t.Errorf("%s: %v, want ErrUnavailable and not ErrUnreachable", what, err)
		}
	}
	t.Run("reached/full pool", func(t *testing.T) {
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, PoolSize: 1, PoolTimeout: 20 * time.Millisecond})
		defer c.Close()
		st, err := redis.New(c, redis.WithCallTimeout(faultBudget))
		if err != nil {
			t.Fatal(err)
		}
		held := c.Conn() // the pool's one connection, taken
		defer held.Close()
		if err := held.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		_, err = st.Claim(ctx, newKey(), newClaim(1))
		if !errors.Is(err, goredis.ErrPoolTimeout) {
			t.Errorf("claim: %v, want a pool timeout", err)
		}
		reached(t, "claim", err)
	})
	t.Run("reached/OOM", func(t *testing.T) {
		full := redistest.StartServer(t)
		st := storeWith(t, full.Addr)
		if _, err := redistest.Do(full.Addr, "CONFIG", "SET", "maxmemory", "1"); err != nil {
			t.Fatal(err)
		}
		_, err := st.Claim(ctx, newKey(), newClaim(1))
		reached(t, "claim", err)
	})
	t.Run("reached/READONLY", func(t *testing.T) {
		replica := redistest.StartServer(t)
		st := storeWith(t, replica.Addr)
		if _, err := redistest.Do(replica.Addr, "REPLICAOF", "127.0.0.1", strconv.Itoa(port)); err != nil {
			t.Fatal(err)
		}
		_, err := st.Claim(ctx, newKey(), newClaim(1))
		reached(t, "claim", err)
	})
	for _, reply := range []string{"-LOADING Redis is loading the dataset in memory\r\n", "-NOPERM this user has no permissions\r\n", ""} {
		name := strings.Fields(reply + " silent")[0]
		t.Run("reached/"+name, func(t *testing.T) {
			f := newFakeServer(t, reply)
			other := redistest.StartServer(t)
			st := storeWith(t, other.Addr)
			fail.Store(other.Addr, "to:"+f.Addr())
			_, err := st.Claim(ctx, newKey(), newClaim(1))
			reached(t, "claim", err)
		})
	}
}
