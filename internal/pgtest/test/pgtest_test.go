package test

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemkey/idemkey/internal/faultproxy"
	"github.com/idemkey/idemkey/internal/pgtest"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestServer(t *testing.T) {
	s := pgtest.Start(t, "max_connections=37")
	ctx := context.Background()
	c, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatal(err)
	}
	var v string
	if err := c.QueryRow(ctx, "SHOW max_connections").Scan(&v); err != nil || v != "37" {
		t.Fatalf("setting not applied: %q, %v", v, err)
	}
	if s.PID() == 0 {
		t.Fatal("no PID for a running cluster")
	}
	if len(s.Backends()) == 0 {
		t.Fatal("no backends found")
	}
	cpu0, err := s.CPU()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.QueryRow(ctx, "SELECT count(*) FROM generate_series(1, 3000000)").Scan(new(int)); err != nil {
		t.Fatal(err)
	}
	if cpu1, err := s.CPU(); err != nil || cpu1 <= cpu0 {
		t.Errorf("CPU %v then %v (%v) after a query that takes some", cpu0, cpu1, err)
	}

	// Frozen: nothing answers, neither a new connection nor one that was
	// open (its backend is stopped too).
	s.Freeze()
	fctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = pgx.Connect(fctx, s.URL)
	cancel()
	if err == nil {
		t.Error("connected to a frozen cluster")
	}
	fctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
	err = c.QueryRow(fctx, "SELECT 1").Scan(new(int))
	cancel()
	s.Thaw()
	if err == nil {
		t.Error("a query on an open connection was answered by a frozen cluster")
	}
	c, err = pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatalf("after thaw: %v", err)
	}

	// Killed: the open connection's backend dies with the postmaster.
	s.Kill()
	if err := c.QueryRow(ctx, "SELECT 1").Scan(new(int)); err == nil {
		t.Error("a query on an open connection was answered by a killed cluster")
	}
	if s.PID() != 0 {
		t.Error("PID after Kill")
	}
	if _, err := pgx.Connect(ctx, s.URL); err == nil {
		t.Fatal("connected to a killed cluster")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	c, err = pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatalf("after restart: %v", err)
	}
	c.Close(ctx)
}

func TestProxy(t *testing.T) {
	url := pgtest.Shared(t)
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	p := faultproxy.Start(t, cfg.Host+":"+itoa(int(cfg.Port)))
	cfg.Host, cfg.Port = "127.0.0.1", uint16(portOf(t, p.Addr))
	ctx := context.Background()
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)

	before := p.Turns()
	var n int
	if err := c.QueryRow(ctx, "SELECT 1", pgx.QueryExecModeSimpleProtocol).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if got := p.Turns() - before; got != 1 {
		t.Errorf("one simple query counted as %d round trips", got)
	}
	before = p.Turns()
	b := &pgx.Batch{}
	b.Queue("SELECT 1")
	b.Queue("SELECT 2")
	if err := c.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	after := p.Turns() - before
	t.Logf("a batch of two new statements: %d round trips (preparing, then running)", after)

	p.DropReplies(true)
	qctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err = c.QueryRow(qctx, "SELECT 3", pgx.QueryExecModeSimpleProtocol).Scan(&n)
	cancel()
	if err == nil || !errors.Is(err, context.DeadlineExceeded) && !c.IsClosed() {
		t.Fatalf("a query whose reply was lost: %v", err)
	}
	if p.Dropped() == 0 {
		t.Error("no bytes dropped")
	}
}

func itoa(n int) string { return fmt.Sprint(n) }

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
