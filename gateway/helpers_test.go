package gateway

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

// payments is the application behind every instance: one shared
// idempotency store, and a ledger that counts the handler's runs per key.
type payments struct {
	mw *middleware.Middleware

	mu   sync.Mutex
	runs map[string]int // key ("" for none): handler runs
	// onRun, when set, runs inside the handler after the payment is made,
	// with the instance that made it.
	onRun func(in *instance)
}

func newPayments(t *testing.T) *payments {
	t.Helper()
	st, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	mw, err := middleware.New(st)
	if err != nil {
		t.Fatal(err)
	}
	return &payments{mw: mw, runs: map[string]int{}}
}

// handler is the instance's routes: POST /payments requires a key, POST
// /notes takes one optionally, GET /payments lists the runs.
func (p *payments) handler(in *instance) http.Handler {
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		k, _ := idemkey.FromContext(r.Context())
		p.mu.Lock()
		p.runs[k.Value]++
		hook := p.onRun
		p.mu.Unlock()
		if hook != nil {
			hook(in)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]string{"instance": in.name, "key": k.Value, "body": string(body)})
	})
	mux := http.NewServeMux()
	mux.Handle("POST /payments", p.mw.Required()(pay))
	mux.Handle("POST /notes", p.mw.Optional()(pay))
	mux.HandleFunc("GET /payments", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"instance":"`+in.name+`"}`)
	})
	return mux
}

// Runs returns the handler's runs for key.
func (p *payments) Runs(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.runs[key]
}

// Total returns the handler's runs for all keys, and how many keys ran.
func (p *payments) Total() (runs, keys int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range p.runs {
		runs += n
	}
	return runs, len(p.runs)
}

// instance is one upstream: a real HTTP server on a fixed loopback
// address that can lose replies, die and come back.
type instance struct {
	name string
	addr string
	h    http.Handler

	mu  sync.Mutex
	srv *http.Server // nil while down

	seen atomic.Int32 // requests that reached the handler
	// lose is how many of the next replies are lost: the connection is
	// closed when the response is first written, after the handler ran.
	lose atomic.Int32
	// drop is how many of the next requests get their connection closed
	// before the handler runs, without a response.
	drop atomic.Int32
}

func startInstance(t *testing.T, name string, app *payments) *instance {
	t.Helper()
	in := &instance{name: name}
	in.h = app.handler(in)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	in.addr = ln.Addr().String()
	in.serve(ln)
	t.Cleanup(in.Stop)
	return in
}

func (in *instance) URL() string { return "http://" + in.addr }

func (in *instance) serve(ln net.Listener) {
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if in.drop.Add(-1) >= 0 {
				conn, _, err := http.NewResponseController(w).Hijack()
				if err == nil {
					conn.Close()
				}
				return
			}
			in.seen.Add(1)
			in.h.ServeHTTP(w, r)
		}),
		ErrorLog: discardLog,
	}
	in.mu.Lock()
	in.srv = srv
	in.mu.Unlock()
	go srv.Serve(&lossyListener{Listener: ln, in: in})
}

// Stop kills the instance: its listener and every connection close at once
// (a handler that is running goes on, but its reply is lost).
func (in *instance) Stop() {
	in.mu.Lock()
	srv := in.srv
	in.srv = nil
	in.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

// Start brings a stopped instance back on its address.
func (in *instance) Start(t *testing.T) {
	in.mu.Lock()
	up := in.srv != nil
	in.mu.Unlock()
	if up {
		return
	}
	var ln net.Listener
	var err error
	for range 100 { // the port may take a moment to be free again
		if ln, err = net.Listen("tcp", in.addr); err == nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err != nil {
		t.Errorf("restarting %s: %v", in.name, err)
		return
	}
	in.serve(ln)
}

type lossyListener struct {
	net.Listener
	in *instance
}

func (l *lossyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &lossyConn{Conn: c, in: l.in}, nil
}

type lossyConn struct {
	net.Conn
	in *instance
}

func (c *lossyConn) Write(p []byte) (int, error) {
	if c.in.lose.Add(-1) >= 0 {
		c.Conn.Close()
		return 0, net.ErrClosed
	}
	return c.Conn.Write(p)
}

// refusedAddrs returns n distinct loopback URLs nothing listens on.
func refusedAddrs(t *testing.T, n int) []string {
	t.Helper()
	var urls []string
	var lns []net.Listener
	for range n { // held open together, so that no port comes back twice
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		urls = append(urls, "http://"+ln.Addr().String())
	}
	for _, ln := range lns {
		ln.Close()
	}
	return urls
}

func refusedAddr(t *testing.T) string { return refusedAddrs(t, 1)[0] }

// hangingAddr returns the URL of a server that accepts connections and
// reads requests but never answers, until the test ends.
func hangingAddr(t *testing.T) (url string, seen *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seen = new(atomic.Int32)
	done := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() {
		close(done)
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				buf := make([]byte, 1)
				if n, _ := c.Read(buf); n > 0 {
					seen.Add(1)
				}
				<-done
			}()
		}
	}()
	return "http://" + ln.Addr().String(), seen
}

// dialCounter is a transport that counts the dials to each address.
type dialCounter struct {
	mu    sync.Mutex
	dials map[string]int
}

func newDialCounter() (*dialCounter, *http.Transport) {
	d := &dialCounter{dials: map[string]int{}}
	var dialer net.Dialer
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.mu.Lock()
		d.dials["http://"+addr]++
		d.mu.Unlock()
		return dialer.DialContext(ctx, network, addr)
	}}
	return d, tr
}

func (d *dialCounter) Dials(url string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dials[url]
}

// fakeClock is the gateway's clock for cool-offs.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// newGateway returns a Gateway over urls with a fake clock, closing its
// idle connections at the end.
func newGateway(t *testing.T, urls []string, opts ...Option) (*Gateway, *fakeClock) {
	t.Helper()
	g, err := New(urls, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	clk := &fakeClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
	g.now = clk.Now
	t.Cleanup(g.CloseIdleConnections)
	return g, clk
}

// failures records what the observer saw.
type failures struct {
	mu   sync.Mutex
	list []Failure
}

func (f *failures) observe(x Failure) {
	f.mu.Lock()
	f.list = append(f.list, x)
	f.mu.Unlock()
}

func (f *failures) List() []Failure {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Failure(nil), f.list...)
}

func postReq(t *testing.T, ctx context.Context, url, key, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idemkey.Header, key)
	}
	return req
}

// answer is a response read whole.
type answer struct {
	Status   int
	Header   http.Header
	Body     string
	Instance string // the "instance" of a payment's JSON answer
	Problem  idemkey.Problem
}

func read(t *testing.T, resp *http.Response) answer {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	a := answer{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		if err := json.Unmarshal(b, &a.Problem); err != nil {
			t.Errorf("problem body %q: %v", b, err)
		}
	} else {
		var v struct{ Instance string }
		if json.Unmarshal(b, &v) == nil {
			a.Instance = v.Instance
		}
	}
	return a
}

var discardLog = log.New(io.Discard, "", 0)
