// Package payments is the payment service both example commands run: its
// handlers, its in-process ledger, the demo authentication, the simulated
// bank it sends transfers to, and the choice of idempotency store from the
// environment. examples/chi-app and examples/nethttp-app differ only in how
// they route requests to it.
//
// # Environment
//
//	ADDR                 where to listen; default 127.0.0.1:8080
//	REDIS_URL            redis:// URL of a Redis to keep keys in; unset: in memory
//	REDIS_CLUSTER_ADDRS  comma-separated seed nodes of a Redis Cluster instead
//	DATABASE_URL         postgres:// URL: keep keys and payments in PostgreSQL, in one transaction;
//	                     mysql://user[:password]@host:port/database: the same in MySQL or MariaDB
//	PAYMENT_DELAY        how long POST /payments waits after paying, before answering; default 0
//	BANK_DELAY           how long the simulated bank takes; default 200ms
//	LOG_LEVEL            debug, info (default), warn or error
//
// Logs go to stderr through log/slog; the first line names the store.
// SIGINT and SIGTERM shut the service down gracefully: requests in flight
// finish, then the bank and the store close. A second signal stops at once.
package payments

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemkey/idemkey/client"
	"github.com/idemkey/idemkey/metrics/prom"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

// Routes builds a command's router over the service's handlers.
type Routes func(s *Service) http.Handler

// Addrs are where a running service and its bank listen, as base URLs such
// as "http://127.0.0.1:8080".
type Addrs struct {
	// Service is the payment service's base URL.
	Service string
	// Bank is the simulated bank's base URL.
	Bank string
}

// Options are seams for the end-to-end tests; the commands pass the zero
// value.
type Options struct {
	// Ready, when not nil, is called with the addresses once both servers
	// accept connections.
	Ready func(Addrs)
	// WrapBankTransport, when not nil, wraps the RoundTripper each attempt
	// to reach the bank is made with, under the retrying client.Transport:
	// a test uses it to lose the bank's answers or hold a transfer in
	// flight.
	WrapBankTransport func(http.RoundTripper) http.RoundTripper
}

// Main runs the service configured by the process's environment until
// SIGINT or SIGTERM, and exits with status 1 if it fails.
func Main(routes Routes) {
	cfg, err := ParseEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
		os.Exit(2)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal ends the process at once
	}()
	if err := Run(ctx, os.Getenv, logger, routes, Options{}); err != nil {
		logger.Error("payments service failed", "error", err)
		os.Exit(1)
	}
}

// Run runs the service configured by getenv (see the package documentation)
// until ctx is done, then shuts it down gracefully: it stops accepting
// connections, lets requests in flight finish (for up to the longest
// route deadline and a second), stops the bank and closes the store. It
// returns nil after a clean shutdown, and an error when the configuration
// is invalid, the store or the address cannot be opened, or serving
// fails.
func Run(ctx context.Context, getenv func(string) string, logger *slog.Logger, routes Routes, opts Options) (err error) {
	cfg, err := ParseEnv(getenv)
	if err != nil {
		return err
	}
	backend, err := OpenBackend(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := backend.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("closing the store: %w", cerr))
		}
	}()

	// The bank: another service, with its own store, on a free loopback
	// port.
	bankStore, err := memory.New()
	if err != nil {
		return err
	}
	defer bankStore.Close()
	bk := &bank{delay: cfg.BankDelay}
	bankHandler, err := bk.handler(bankStore, logger.With("service", "bank"))
	if err != nil {
		return err
	}
	bankLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("bank: %w", err)
	}
	bankSrv := newServer(bankHandler, logger)
	bankURL := "http://" + bankLn.Addr().String()
	bankDone := serve(bankSrv, bankLn)
	logger.Info("simulated bank listening", "url", bankURL, "delay", cfg.BankDelay)

	// The service's own connection to the bank: attempts time out when the
	// bank takes much longer than its delay; client.Transport retries them
	// with the same key.
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.ResponseHeaderTimeout = cfg.BankDelay + 2*time.Second
	var rt http.RoundTripper = base
	if opts.WrapBankTransport != nil {
		rt = opts.WrapBankTransport(rt)
	}
	bankTransport, err := client.New(client.WithBase(rt))
	if err != nil {
		return err
	}

	// Every idempotency decision is logged and counted; GET /metrics serves
	// the counts.
	reg := prometheus.NewRegistry()
	met, err := prom.New(reg)
	if err != nil {
		return err
	}
	idem, err := middleware.New(backend.Store,
		middleware.WithObserver(middleware.SlogObserver(logger)),
		middleware.WithObserver(met.Observer()))
	if err != nil {
		return err
	}
	led := newLedger()
	var pays paymentBook = memoryPayments{led}
	if backend.book != nil {
		pays = backend.book
	}
	s := &Service{
		metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		cfg:     cfg,
		backend: backend,
		idem:    idem,
		ledger:  led,
		pays:    pays,
		bankURL: bankURL,
		bank:    &http.Client{Transport: bankTransport},
		logger:  logger,
	}

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		bankSrv.Close()
		<-bankDone
		return err
	}
	srv := newServer(routes(s), logger)
	done := serve(srv, ln)
	addrs := Addrs{Service: "http://" + ln.Addr().String(), Bank: bankURL}
	logger.Info("payments service listening", "url", addrs.Service)
	if opts.Ready != nil {
		opts.Ready(addrs)
	}

	select {
	case <-ctx.Done():
	case err = <-done:
		// Serving failed: stop the rest and report it.
		done = nil
	}
	logger.Info("shutting down: finishing requests in flight")
	grace := max(PaymentDeadline, cfg.TransferDeadline()) + time.Second
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil {
		err = errors.Join(err, fmt.Errorf("shutting down: %w", serr))
		srv.Close()
	}
	if done != nil {
		err = errors.Join(err, <-done)
	}
	// No handler calls the bank any more: close the connections to it, so
	// that its shutdown need not wait for them.
	bankTransport.CloseIdleConnections()
	if serr := bankSrv.Shutdown(sctx); serr != nil {
		bankSrv.Close()
	}
	err = errors.Join(err, <-bankDone)
	logger.Info("stopped")
	return err
}

// newServer returns a server with timeouts suited to a service on the
// open network.
func newServer(h http.Handler, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// serve serves srv on ln in the background. The channel gets nil when the
// server was shut down and the error when serving failed.
func serve(srv *http.Server, ln net.Listener) <-chan error {
	done := make(chan error, 1)
	go func() {
		err := srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		done <- err
	}()
	return done
}
