package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/gateway"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestParseEnvDefaults(t *testing.T) {
	c, err := parseEnv(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.addr != "127.0.0.1:8090" || !slices.Equal(c.upstreams, []string{"http://127.0.0.1:8081", "http://127.0.0.1:8082"}) ||
		c.timeout != 30*time.Second || c.coolOff != gateway.DefaultCoolOff || c.logLevel != slog.LevelInfo {
		t.Errorf("defaults: %+v", c)
	}
}

func TestParseEnvValues(t *testing.T) {
	c, err := parseEnv(env(map[string]string{"ADDR": ":9000", "UPSTREAMS": " http://a:1, ,http://b:2 ",
		"REQUEST_TIMEOUT": "5s", "COOL_OFF": "0", "LOG_LEVEL": "debug"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.addr != ":9000" || !slices.Equal(c.upstreams, []string{"http://a:1", "http://b:2"}) ||
		c.timeout != 5*time.Second || c.coolOff != 0 || c.logLevel != slog.LevelDebug {
		t.Errorf("values: %+v", c)
	}
}

func TestParseEnvErrors(t *testing.T) {
	for name, kv := range map[string]map[string]string{
		"REQUEST_TIMEOUT": {"REQUEST_TIMEOUT": "soon"},
		"zero timeout":    {"REQUEST_TIMEOUT": "0"},
		"COOL_OFF":        {"COOL_OFF": "-1s"},
		"LOG_LEVEL":       {"LOG_LEVEL": "loud"},
	} {
		if _, err := parseEnv(env(kv)); err == nil {
			t.Errorf("%s: no error", name)
		} else if v := strings.Fields(name)[0]; v == strings.ToUpper(v) && !strings.Contains(err.Error(), v) {
			t.Errorf("%s: error %q does not name the variable", name, err)
		}
	}
}

// TestGatewayEndToEnd runs the command in front of two instances on one
// store; the first loses the reply of its first payment, which the second
// replays. The failure and the request are logged.
func TestGatewayEndToEnd(t *testing.T) {
	st, err := memory.New()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	idem, err := middleware.New(st)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	instance := func(name string, lose int32) string {
		mux := http.NewServeMux()
		pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"by":"`+name+`"}`)
		})
		mux.Handle("POST /payments", idem.Required()(pay))
		mux.Handle("POST /notes", idem.Optional()(pay))
		srv := httptest.NewUnstartedServer(mux)
		l := &lossy{Listener: srv.Listener}
		l.lose.Store(lose)
		srv.Listener = l
		srv.Start()
		t.Cleanup(srv.Close)
		return srv.URL
	}
	a, b := instance("a", 1), instance("b", 0)

	ctx, cancel := context.WithCancel(context.Background())
	urls := make(chan string, 1)
	done := make(chan error, 1)
	var logBuf syncBuffer
	logger := slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	go func() {
		done <- run(ctx, config{addr: "127.0.0.1:0", upstreams: []string{a, b}, timeout: 10 * time.Second,
			coolOff: time.Second}, logger, func(u string) { urls <- u })
	}()
	var url string
	select {
	case url = <-urls:
	case err := <-done:
		t.Fatalf("run: %v", err)
	}

	post := func(path, key string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, url+path, strings.NewReader(`{"amount":10}`))
		if key != "" {
			req.Header.Set(idemkey.Header, key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}
	resp, body := post("/payments", "k1")
	if resp.StatusCode != http.StatusCreated || resp.Header.Get(idemkey.HeaderReplayed) != "true" || body != `{"by":"a"}` {
		t.Errorf("keyed: %d replayed=%q %s; want a's 201 replayed by b", resp.StatusCode, resp.Header.Get(idemkey.HeaderReplayed), body)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("%d runs, want 1", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run after shutdown: %v", err)
	}
	// After the shutdown, which waits for every request, all is logged.
	logs := logBuf.String()
	for _, want := range []string{"upstream attempt failed", "upstream=" + a, "keyed=true", "sent=true", "next_upstream=true",
		"msg=request method=POST path=/payments keyed=true status=201 replayed=true"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log does not say %q:\n%s", want, logs)
		}
	}
}

// TestUnkeyedLostReplyEndToEnd: the command answers 502
// upstream_reply_lost, as problem+json, and the handler ran once.
func TestUnkeyedLostReplyEndToEnd(t *testing.T) {
	var runs atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	l := &lossy{Listener: srv.Listener}
	l.lose.Store(1)
	srv.Listener = l
	srv.Start()
	defer srv.Close()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer other.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	urls := make(chan string, 1)
	go run(ctx, config{addr: "127.0.0.1:0", upstreams: []string{srv.URL, other.URL}, timeout: 10 * time.Second},
		slog.New(slog.NewTextHandler(io.Discard, nil)), func(u string) { urls <- u })
	url := <-urls
	resp, err := http.Post(url+"/payments", "application/json", strings.NewReader(`{"amount":1}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p struct{ Code string }
	json.NewDecoder(resp.Body).Decode(&p)
	if resp.StatusCode != http.StatusBadGateway || p.Code != gateway.CodeReplyLost ||
		resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("got %d %q %q, want 502 upstream_reply_lost problem+json", resp.StatusCode, p.Code, resp.Header.Get("Content-Type"))
	}
	if runs.Load() != 1 {
		t.Errorf("%d runs, want 1", runs.Load())
	}
}

// lossy closes a connection instead of writing the reply, for the first
// lose replies.
type lossy struct {
	net.Listener
	lose atomic.Int32
}

func (l *lossy) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &lossyConn{Conn: c, l: l}, nil
}

type lossyConn struct {
	net.Conn
	l *lossy
}

func (c *lossyConn) Write(p []byte) (int, error) {
	if c.l.lose.Add(-1) >= 0 {
		c.Conn.Close()
		return 0, net.ErrClosed
	}
	return c.Conn.Write(p)
}

// syncBuffer is a bytes.Buffer safe for the logger and the test at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
