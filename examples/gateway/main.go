// Command gateway is a reverse proxy in front of several instances of an
// idemkey-protected service that share one store (Redis or PostgreSQL). It
// fails a keyed mutation over to another instance when the reply is lost,
// answers 502 upstream_reply_lost to an unkeyed one, and fails reads over
// freely (see package gateway).
//
//	REDIS_URL=redis://127.0.0.1:6379/0 ADDR=127.0.0.1:8081 go run ./examples/chi-app &
//	REDIS_URL=redis://127.0.0.1:6379/0 ADDR=127.0.0.1:8082 go run ./examples/chi-app &
//	UPSTREAMS=http://127.0.0.1:8081,http://127.0.0.1:8082 go run ./examples/gateway
//	curl -i -X POST localhost:8090/payments -H 'Idempotency-Key: k1' -H 'Content-Type: application/json' -d '{"amount":10,"currency":"EUR"}'
//
// # Environment
//
//	ADDR             where to listen; default 127.0.0.1:8090
//	UPSTREAMS        comma-separated base URLs of the instances; default
//	                 http://127.0.0.1:8081,http://127.0.0.1:8082
//	REQUEST_TIMEOUT  each request's deadline, which bounds its attempts
//	                 (a Go duration); default 30s
//	COOL_OFF         how long a failed upstream is passed over; default 10s,
//	                 0 turns passive health off
//	LOG_LEVEL        debug (every request), info (default), warn or error
//
// Every attempt that fails without a response is logged at warn level:
// which upstream, whether the request may have reached it, and whether the
// gateway went on to the next one. SIGINT and SIGTERM shut it down
// gracefully.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/gateway"
)

// Defaults of the environment.
const (
	defaultAddr      = "127.0.0.1:8090"
	defaultUpstreams = "http://127.0.0.1:8081,http://127.0.0.1:8082"
	defaultTimeout   = 30 * time.Second
)

type config struct {
	addr      string
	upstreams []string
	timeout   time.Duration
	coolOff   time.Duration
	logLevel  slog.Level
}

// parseEnv reads the configuration through getenv, and names the variable
// of a malformed value.
func parseEnv(getenv func(string) string) (config, error) {
	c := config{addr: defaultAddr, timeout: defaultTimeout, coolOff: gateway.DefaultCoolOff}
	if v := strings.TrimSpace(getenv("ADDR")); v != "" {
		c.addr = v
	}
	ups := getenv("UPSTREAMS")
	if strings.TrimSpace(ups) == "" {
		ups = defaultUpstreams
	}
	for u := range strings.SplitSeq(ups, ",") {
		if u = strings.TrimSpace(u); u != "" {
			c.upstreams = append(c.upstreams, u)
		}
	}
	for name, d := range map[string]*time.Duration{"REQUEST_TIMEOUT": &c.timeout, "COOL_OFF": &c.coolOff} {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			continue
		}
		parsed, err := time.ParseDuration(v)
		if err != nil || parsed < 0 || (name == "REQUEST_TIMEOUT" && parsed == 0) {
			return config{}, fmt.Errorf("%s: %q is not a positive Go duration such as 30s", name, v)
		}
		*d = parsed
	}
	if v := strings.TrimSpace(getenv("LOG_LEVEL")); v != "" {
		if err := c.logLevel.UnmarshalText([]byte(v)); err != nil {
			return config{}, fmt.Errorf("LOG_LEVEL: %q is not one of debug, info, warn, error", v)
		}
	}
	return c, nil
}

func main() {
	cfg, err := parseEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(2)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal ends the process at once
	}()
	if err := run(ctx, cfg, logger, nil); err != nil {
		logger.Error("gateway failed", "error", err)
		os.Exit(1)
	}
}

// run serves the gateway until ctx is done, then shuts it down gracefully.
// ready, when not nil, is called with the base URL once it accepts
// connections.
func run(ctx context.Context, cfg config, logger *slog.Logger, ready func(url string)) error {
	gw, err := gateway.New(cfg.upstreams,
		gateway.WithCoolOff(cfg.coolOff),
		gateway.WithObserver(func(f gateway.Failure) {
			logger.Warn("upstream attempt failed",
				"upstream", f.Upstream, "attempt", f.Attempt, "method", f.Method, "keyed", f.Keyed,
				"sent", f.Sent, "next_upstream", f.Next, "error", f.Err)
		}))
	if err != nil {
		return err
	}
	defer gw.CloseIdleConnections()
	proxy := gw.ReverseProxy()
	proxy.ErrorLog = slog.NewLogLogger(logger.Handler(), slog.LevelError)

	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           withDeadline(cfg.timeout, accessLog(logger, proxy)),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	url := "http://" + ln.Addr().String()
	logger.Info("gateway listening", "addr", url, "upstreams", strings.Join(gw.Upstreams(), ","),
		"request_timeout", cfg.timeout, "cool_off", cfg.coolOff)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	if ready != nil {
		ready(url)
	}
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	logger.Info("gateway shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.timeout+time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// withDeadline gives every request a deadline d from its arrival: the
// gateway makes no attempt after it and answers 504 upstream_timeout.
func withDeadline(d time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), d)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// accessLog logs every request at debug level: method, path, whether it
// carries a key (never the key), status and duration.
func accessLog(logger *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !logger.Enabled(r.Context(), slog.LevelDebug) {
			next.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		logger.Debug("request", "method", r.Method, "path", r.URL.Path,
			"keyed", len(r.Header.Values(idemkey.Header)) > 0, "status", sw.status,
			"replayed", sw.Header().Get(idemkey.HeaderReplayed) == "true", "duration", time.Since(start))
	})
}

// statusWriter records the status; Unwrap lets http.ResponseController
// (which the proxy flushes and upgrades through) reach the real writer.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
