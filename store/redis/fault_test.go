package redis_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/redistest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// The fault tests run against a redis-server of their own and report what
// each fault did with t.Logf. Elapsed times are checked against the call
// budget with a wide margin: they show that a call is bounded, not how fast
// it is.

const faultBudget = 300 * time.Millisecond

// bound is how long a call may take under a fault: its budget and a wide
// margin for a loaded machine.
const bound = faultBudget + 2*time.Second

// clientConfig is a way a caller may build the client and the store.
type clientConfig struct {
	name         string
	ctxTimeouts  bool // ContextTimeoutEnabled
	autoPipeline bool // WithAutoPipeline
}

var (
	// recommended is the client the package documentation recommends.
	recommended = clientConfig{name: "ContextTimeoutEnabled", ctxTimeouts: true}
	// pipelined sends the store's commands through the automatic pipeliner.
	pipelined = clientConfig{name: "AutoPipeline", ctxTimeouts: true, autoPipeline: true}
	// clientConfigs are the three: as recommended, without
	// ContextTimeoutEnabled (where the store bounds each call on its own),
	// and automatically pipelined.
	clientConfigs = []clientConfig{recommended, {name: "NoContextTimeouts"}, pipelined}
)

// options returns the store options of cfg.
func (cfg clientConfig) options() []redis.Option {
	if cfg.autoPipeline {
		return []redis.Option{redis.WithAutoPipeline()}
	}
	return nil
}

func faultStore(t *testing.T, addr string, cfg clientConfig) (*redis.Store, *goredis.Client) {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: cfg.ctxTimeouts, PoolSize: 8})
	t.Cleanup(func() { c.Close() })
	st := newStore(t, c, append(cfg.options(), redis.WithCallTimeout(faultBudget))...)
	// Load the scripts, so that a fault hits the path a warm server takes.
	k, cl := newKey(), newClaim(9)
	mustClaim(t, st, k, cl, store.Claimed)
	if err := st.Complete(context.Background(), k, cl.Token, record("warm", 9), time.Minute); err != nil {
		t.Fatal(err)
	}
	return st, c
}

func timed(f func()) time.Duration {
	start := time.Now()
	f()
	return time.Since(start)
}

func TestFaultKilledBeforeClaim(t *testing.T) {
	for _, cfg := range clientConfigs {
		t.Run(cfg.name, func(t *testing.T) {
			srv := redistest.StartServer(t)
			st, _ := faultStore(t, srv.Addr, cfg)
			srv.Kill()
			var err error
			d := timed(func() { _, err = st.Claim(context.Background(), newKey(), newClaim(1)) })
			t.Logf("server killed: claim failed after %v: %v", d.Round(time.Millisecond), err)
			checkUnavailable(t, "claim", err)
			if d > bound {
				t.Errorf("claim took %v against a dead server, budget %v", d, faultBudget)
			}
			// The same store recovers when the server is back.
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			mustClaim(t, st, newKey(), newClaim(1), store.Claimed)
		})
	}
}

func TestFaultFrozenDuringClaim(t *testing.T) {
	for _, cfg := range clientConfigs {
		t.Run(cfg.name, func(t *testing.T) {
			srv := redistest.StartServer(t)
			st, _ := faultStore(t, srv.Addr, cfg)
			key, a := newKey(), newClaim(1)
			srv.Freeze()
			var err error
			d := timed(func() { _, err = st.Claim(context.Background(), key, a) })
			srv.Thaw()
			t.Logf("server frozen: claim failed after %v: %v", d.Round(time.Millisecond), err)
			checkUnavailable(t, "claim", err)
			if d > bound {
				t.Errorf("claim took %v against a frozen server, budget %v", d, faultBudget)
			}
			// The request sat in the socket: once thawed, the server may run
			// it. Whatever it did, the key holds a's claim or nothing; another
			// request sees a's fingerprint or gets the key, never anything
			// else.
			b := newClaim(2)
			var res store.Result
			waitUntil(t, func() bool {
				res, err = st.Claim(context.Background(), key, b)
				return err == nil
			})
			switch res.State {
			case store.Claimed:
				t.Logf("after thaw: the failed claim never landed")
			case store.InFlight:
				if res.Fingerprint != a.Fingerprint {
					t.Fatalf("after thaw: in flight under fingerprint %x", res.Fingerprint[:1])
				}
				t.Logf("after thaw: the failed claim landed late and holds the key for its TTL (%v left)", res.TTL.Round(time.Millisecond))
			default:
				t.Fatalf("after thaw: state %v", res.State)
			}
		})
	}
}

func TestFaultFrozenDuringComplete(t *testing.T) {
	for _, cfg := range clientConfigs {
		t.Run(cfg.name, func(t *testing.T) {
			srv := redistest.StartServer(t)
			st, _ := faultStore(t, srv.Addr, cfg)
			ctx := context.Background()
			key, a := newKey(), newClaim(1)
			mustClaim(t, st, key, a, store.Claimed)
			srv.Freeze()
			var err error
			d := timed(func() { err = st.Complete(ctx, key, a.Token, record("a", 1), time.Minute) })
			srv.Thaw()
			t.Logf("server frozen: complete failed after %v: %v", d.Round(time.Millisecond), err)
			checkUnavailable(t, "complete", err)
			if d > bound {
				t.Errorf("complete took %v against a frozen server, budget %v", d, faultBudget)
			}
			// The key holds a's claim or a's record: no other request's data.
			var res store.Result
			waitUntil(t, func() bool {
				res, err = st.Claim(ctx, key, newClaim(2))
				return err == nil
			})
			switch res.State {
			case store.InFlight:
				if res.Fingerprint != a.Fingerprint {
					t.Fatalf("after thaw: in flight under fingerprint %x", res.Fingerprint[:1])
				}
				t.Logf("after thaw: the record was not kept; a's claim stays for its TTL (%v left)", res.TTL.Round(time.Millisecond))
			case store.Completed:
				if string(res.Record.Body) != "a" || res.Fingerprint != a.Fingerprint {
					t.Fatalf("after thaw: record %q", res.Record.Body)
				}
				t.Logf("after thaw: the complete landed late; a's record is kept")
			default:
				t.Fatalf("after thaw: state %v", res.State)
			}
		})
	}
}

func TestFaultClientPauseWrite(t *testing.T) {
	for _, cfg := range []clientConfig{recommended, pipelined} {
		t.Run(cfg.name, func(t *testing.T) { testClientPauseWrite(t, cfg) })
	}
}

func testClientPauseWrite(t *testing.T, cfg clientConfig) {
	srv := redistest.StartServer(t)
	st, _ := faultStore(t, srv.Addr, cfg)
	ctx := context.Background()
	done, held, a := newKey(), newKey(), newClaim(1)
	mustClaim(t, st, held, a, store.Claimed)
	mustClaim(t, st, done, a, store.Claimed)
	if err := st.Complete(ctx, done, a.Token, record("done", 1), time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := redistest.Do(srv.Addr, "CLIENT", "PAUSE", "2000", "WRITE"); err != nil {
		t.Fatal(err)
	}
	key, b := newKey(), newClaim(2)
	var err error
	d := timed(func() { _, err = st.Claim(ctx, key, b) })
	t.Logf("CLIENT PAUSE WRITE: claim failed after %v: %v", d.Round(time.Millisecond), err)
	checkUnavailable(t, "claim", err)
	if d > bound {
		t.Errorf("claim took %v during a pause, budget %v", d, faultBudget)
	}
	// SET is a write, so a replay waits for the pause too.
	d = timed(func() { _, err = st.Claim(ctx, done, newClaim(1)) })
	t.Logf("CLIENT PAUSE WRITE: replay failed after %v: %v", d.Round(time.Millisecond), err)
	checkUnavailable(t, "replay claim", err)

	if _, err := redistest.Do(srv.Addr, "CLIENT", "UNPAUSE"); err != nil {
		t.Fatal(err)
	}
	// A write sent after UNPAUSE on a new connection is served after any
	// command the pause held back.
	if _, err := redistest.Do(srv.Addr, "SET", "marker", "1"); err != nil {
		t.Fatal(err)
	}
	if !cfg.autoPipeline {
		// The paused claim's connection was closed at the deadline, so
		// the server dropped the command instead of running it after the
		// pause.
		if n, err := redistest.Do(srv.Addr, "EXISTS", key); err != nil || n != "0" {
			t.Fatalf("a claim reported failed appeared after the pause (EXISTS = %q, %v)", n, err)
		}
		mustClaim(t, st, key, newClaim(2), store.Claimed)
	} else {
		// The pipeliner does not stop a command it has sent: the claim
		// reported failed may run once the pause ends. The key then holds
		// that claim (nobody's: the caller was told it failed) until its
		// life ends, or nothing; never anything else.
		var res store.Result
		waitUntil(t, func() bool {
			res, err = st.Claim(ctx, key, newClaim(3))
			return err == nil
		})
		switch {
		case res.State == store.Claimed:
			t.Logf("after the pause: the failed claim never landed")
		case res.State == store.InFlight && res.Fingerprint == b.Fingerprint:
			t.Logf("after the pause: the failed claim landed late and holds the key for its life (%v left)", res.TTL.Round(time.Millisecond))
		default:
			t.Fatalf("after the pause: %v with fingerprint %x", res.State, res.Fingerprint[:1])
		}
	}
	mustClaim(t, st, held, newClaim(1), store.InFlight)
}

func TestFaultMaxmemory(t *testing.T) {
	for _, cfg := range []clientConfig{recommended, pipelined} {
		t.Run(cfg.name, func(t *testing.T) { testMaxmemory(t, cfg) })
	}
}

func testMaxmemory(t *testing.T, cfg clientConfig) {
	srv := redistest.StartServer(t, "--maxmemory", "3mb", "--maxmemory-policy", "noeviction")
	st, c := faultStore(t, srv.Addr, cfg)
	ctx := context.Background()
	done, held, a := newKey(), newKey(), newClaim(1)
	mustClaim(t, st, done, a, store.Claimed)
	if err := st.Complete(ctx, done, a.Token, record("done", 1), time.Hour); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, st, held, a, store.Claimed)

	// Fill memory with ever smaller values, until even a small write is
	// refused: a large write alone can be refused for its own arguments.
	fillers := 0
	for _, size := range []int{32 << 10, 1 << 10, 64} {
		filler := strings.Repeat("x", size)
		for {
			err := c.Set(ctx, "filler:"+randomHex(8), filler, 0).Err()
			if err != nil {
				if !strings.HasPrefix(err.Error(), "OOM") {
					t.Fatalf("filling: %v", err)
				}
				break
			}
			if fillers++; fillers > 100000 {
				t.Fatal("maxmemory never reached")
			}
		}
	}
	t.Logf("memory full after %d fillers", fillers)
	key := newKey()
	_, err := st.Claim(ctx, key, newClaim(2))
	t.Logf("OOM: new claim: %v", err)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("claim under OOM: %v, want ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), "OOM") {
		t.Errorf("claim error %v does not name OOM", err)
	}
	if n, _ := redistest.Do(srv.Addr, "EXISTS", key); n != "0" {
		t.Error("refused claim was stored")
	}
	res := mustClaim(t, st, done, newClaim(1), store.Completed)
	if string(res.Record.Body) != "done" {
		t.Errorf("replay under OOM: body %q", res.Record.Body)
	}
	mustClaim(t, st, held, newClaim(1), store.InFlight)
	t.Logf("OOM: replay and in-flight answers still served")
	// A running handler's claim is still extended: its life needs no
	// memory.
	if err := st.Extend(ctx, held, a.Token, 2*time.Hour); err != nil {
		t.Errorf("extend under OOM: %v", err)
	}
	if pttl := pttlOf(t, srv.Addr, held); pttl < 110*time.Minute {
		t.Errorf("after extend under OOM the claim lives %v, want about 2h", pttl)
	}
	// Keeping a record needs memory: it fails, and the claim is held for
	// the retention instead, so that no retry runs the request again.
	err = st.Complete(ctx, held, a.Token, record("held", 1), 3*time.Hour)
	t.Logf("OOM: complete: %v", err)
	checkUnavailable(t, "complete", err)
	mustClaim(t, st, held, newClaim(1), store.InFlight)
	if pttl := pttlOf(t, srv.Addr, held); pttl < 170*time.Minute {
		t.Errorf("after a refused complete the claim lives %v, want about the 3h retention", pttl)
	}
	// Deleting frees memory, so a claim can still be released.
	err = st.Release(ctx, held, a.Token)
	t.Logf("OOM: release: %v", err)
	if err != nil {
		t.Errorf("release under OOM: %v", err)
	}
}

func TestFaultLostClaimReply(t *testing.T) {
	for _, cfg := range []clientConfig{recommended, pipelined} {
		t.Run(cfg.name, func(t *testing.T) { testLostClaimReply(t, cfg) })
	}
}

func testLostClaimReply(t *testing.T, cfg clientConfig) {
	addr := redistest.Start(t)
	for _, retries := range []int{3, -1} {
		// The marker is in the claim's token.
		p := newDropProxy(t, addr, "lost-reply")
		c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true, MaxRetries: retries})
		t.Cleanup(func() { c.Close() })
		st := newStore(t, c, cfg.options()...)
		outcomes := make(map[string]int)
		for range 10 {
			key, a := newKey(), newClaim(1)
			a.Token = "lost-reply-" + randomHex(8)
			p.DropNextReply()
			res, err := st.Claim(context.Background(), key, a)
			if p.Dropped() == 0 {
				t.Fatal("proxy dropped no reply")
			}
			p.Reset()
			switch {
			case err != nil:
				checkUnavailable(t, "claim", err)
				outcomes["error"]++
			case res.State == store.Mine || res.State == store.Claimed:
				outcomes[res.State.String()]++
			default:
				t.Fatalf("retried claim answered %v against its own claim", res.State)
			}
			// Either way the claim landed under a's token.
			mustClaim(t, st, key, a, store.Mine)
		}
		t.Logf("lost claim reply, MaxRetries %d: %v", retries, outcomes)
		if retries > 0 && outcomes["mine"] != 10 {
			t.Errorf("with retries on, outcomes %v, want mine every time", outcomes)
		}
		if retries < 0 && outcomes["error"] != 10 {
			t.Errorf("with retries off, outcomes %v, want an error every time", outcomes)
		}
	}
}

// TestFaultLostFinishReply drops the reply to a complete, and to a release,
// after the server ran it. go-redis resends the script on a new connection;
// the resent call finds its own earlier write (the record kept under its
// token, or the key already free) and answers as the first did. With
// retries off, the call fails with ErrUnavailable, and the write stands.
func TestFaultLostFinishReply(t *testing.T) {
	for _, cfg := range []clientConfig{recommended, pipelined} {
		t.Run(cfg.name, func(t *testing.T) { testLostFinishReply(t, cfg) })
	}
}

func testLostFinishReply(t *testing.T, cfg clientConfig) {
	addr := redistest.Start(t)
	for _, retries := range []int{3, -1} {
		// The marker is in the body of the record that complete sends, and
		// in the token that release sends; the claim before each (which
		// carries the token too) is sent before the proxy is armed.
		p := newDropProxy(t, addr, "lost-reply")
		c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true, MaxRetries: retries})
		t.Cleanup(func() { c.Close() })
		st := newStore(t, c, cfg.options()...)
		ctx := context.Background()
		// Load the scripts, so that the dropped reply is the script's own
		// and not a NOSCRIPT.
		for _, finish := range []func(key, token string) error{
			func(key, token string) error { return st.Complete(ctx, key, token, record("warm", 1), time.Minute) },
			func(key, token string) error { return st.Release(ctx, key, token) },
		} {
			k, w := newKey(), newClaim(1)
			mustClaim(t, st, k, w, store.Claimed)
			if err := finish(k, w.Token); err != nil {
				t.Fatal(err)
			}
		}
		for _, op := range []string{"complete", "release"} {
			t.Run(fmt.Sprintf("%s/MaxRetries=%d", op, retries), func(t *testing.T) {
				key, a := newKey(), newClaim(1)
				a.Token = "lost-reply-" + randomHex(8)
				mustClaim(t, st, key, a, store.Claimed)
				rec := record("lost-reply", 1)
				p.DropNextReply()
				var err error
				if op == "complete" {
					err = st.Complete(ctx, key, a.Token, rec, time.Minute)
				} else {
					err = st.Release(ctx, key, a.Token)
				}
				if p.Dropped() == 0 {
					t.Fatal("proxy dropped no reply")
				}
				p.Reset()
				t.Logf("lost %s reply, MaxRetries %d: %v", op, retries, err)
				if retries > 0 && err != nil {
					t.Errorf("%s resent after a lost reply: %v, want nil", op, err)
				}
				if retries < 0 {
					checkUnavailable(t, op, err)
				}
				// The first call landed, whatever the caller heard.
				if op == "complete" {
					res := mustClaim(t, st, key, newClaim(1), store.Completed)
					if string(res.Record.Body) != "lost-reply" {
						t.Errorf("kept body %q", res.Record.Body)
					}
				} else {
					mustClaim(t, st, key, newClaim(2), store.Claimed)
				}
			})
		}
	}
}

func TestFaultLapsedClaim(t *testing.T) {
	st, _ := faultStore(t, redistest.Start(t), recommended)
	ctx := context.Background()
	key, a, b := newKey(), newClaim(1), newClaim(2)
	a.TTL = 50 * time.Millisecond
	mustClaim(t, st, key, a, store.Claimed)
	// a's handler is slow: its claim lapses and b takes the key.
	waitUntil(t, func() bool {
		res, err := st.Claim(ctx, key, b)
		return err == nil && res.State == store.Claimed
	})
	if err := st.Complete(ctx, key, b.Token, record("b", 2), time.Minute); err != nil {
		t.Fatal(err)
	}
	err := st.Complete(ctx, key, a.Token, record("a", 1), time.Minute)
	t.Logf("lapsed claim: late complete: %v", err)
	if !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("late complete: %v, want ErrNotOwner", err)
	}
	if res := mustClaim(t, st, key, newClaim(2), store.Completed); string(res.Record.Body) != "b" {
		t.Fatalf("record body %q, want the new owner's", res.Record.Body)
	}
}

// waitUntil polls ok until it holds, for up to 10 seconds.
func waitUntil(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// dropProxy forwards TCP connections to a Redis server. Told to, it lets
// the next request that contains a marker through, waits for the server's
// reply, and then closes the connection instead of passing the reply on: a
// reply lost on the way back.
type dropProxy struct {
	ln       net.Listener
	target   string
	marker   []byte
	dropNext atomic.Bool
	dropped  atomic.Int32
	wg       sync.WaitGroup
}

func newDropProxy(t *testing.T, target, marker string) *dropProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropProxy{ln: ln, target: target, marker: []byte(strings.ToLower(marker))}
	p.wg.Go(p.serve)
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *dropProxy) Addr() string   { return p.ln.Addr().String() }
func (p *dropProxy) DropNextReply() { p.dropNext.Store(true) }
func (p *dropProxy) Dropped() int32 { return p.dropped.Load() }
func (p *dropProxy) Reset()         { p.dropNext.Store(false); p.dropped.Store(0) }

func (p *dropProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.handle(c) })
	}
}

func (p *dropProxy) handle(client net.Conn) {
	defer client.Close()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer server.Close()
	var swallow atomic.Bool
	p.wg.Go(func() { // server to client
		buf := make([]byte, 64<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 {
				if swallow.Load() {
					p.dropped.Add(1)
					client.Close()
					server.Close()
					return
				}
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				client.Close()
				return
			}
		}
	})
	buf := make([]byte, 64<<10)
	for { // client to server
		n, err := client.Read(buf)
		if n > 0 {
			if bytes.Contains(bytes.ToLower(buf[:n]), p.marker) && p.dropNext.CompareAndSwap(true, false) {
				swallow.Store(true)
			}
			if _, werr := server.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// pttlOf returns the remaining life of key on the server at addr.
func pttlOf(t *testing.T, addr, key string) time.Duration {
	t.Helper()
	v, err := redistest.Do(addr, "PTTL", key)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("PTTL %q: %v", v, err)
	}
	return time.Duration(ms) * time.Millisecond
}
