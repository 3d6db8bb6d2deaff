package postgres_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkey/idemkey/internal/sqlcore"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// TestStartUpIsBounded: against a server that accepts the connection and
// never answers, New, NewDB, Migrate and MigrateDB given a context
// without a deadline return within the default start-up budget, and
// their errors name the server and the database: the pgx face from its
// pool's configuration, the database/sql face (where a DB does not say
// where it connects) from what pgx's driver says of the connection it
// tried.
func TestStartUpIsBounded(t *testing.T) {
	// Ten seconds of waiting on a silent server, which uses neither the
	// shared server nor the CPU: alongside the other tests that wait out
	// a fixed life (TestMiddlewareLapse).
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	url := "postgres://app@" + ln.Addr().String() + "/silentdb?sslmode=disable"
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db := stdlib.OpenDB(*cfg.ConnConfig.Copy())
	t.Cleanup(func() { db.Close() })

	calls := map[string]func(context.Context) error{
		"New": func(ctx context.Context) error {
			_, err := postgres.New(ctx, pool, postgres.WithSweepInterval(0))
			return err
		},
		"Migrate": func(ctx context.Context) error { return postgres.Migrate(ctx, pool) },
		"NewDB": func(ctx context.Context) error {
			_, err := postgres.NewDB(ctx, db, postgres.WithSweepInterval(0))
			return err
		},
		"MigrateDB": func(ctx context.Context) error { return postgres.MigrateDB(ctx, db) },
	}
	var wg sync.WaitGroup
	for name, call := range calls {
		wg.Go(func() {
			start := time.Now()
			done := make(chan error, 1)
			go func() { done <- call(context.Background()) }()
			select {
			case err := <-done:
				took := time.Since(start)
				if err == nil {
					t.Errorf("%s: no error from a server that never answers", name)
					return
				}
				if took < sqlcore.DefaultStartTimeout-time.Second {
					t.Errorf("%s: gave up after %v, before the budget (%v): %v", name, took, sqlcore.DefaultStartTimeout, err)
				}
				want := []string{"idemkey: postgres: ", "start-up bounded by", sqlcore.DefaultStartTimeout.String(),
					"server " + ln.Addr().String() + ", database silentdb"}
				for _, w := range want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: error %q does not name %q", name, err, w)
					}
				}
			case <-time.After(sqlcore.DefaultStartTimeout + 10*time.Second):
				t.Errorf("%s hung past the start-up budget", name)
			}
		})
	}
	wg.Wait()
}

// TestReadOnlyServerIsRefused: a server whose transactions are read-only
// for the store's connections (default_transaction_read_only, here set
// for the connection) is refused at New and NewDB with ErrReadOnly and a
// message that says why, instead of answering every request 503.
func TestReadOnlyServerIsRefused(t *testing.T) {
	shared := sharedPool(t)
	table := newTable(t, shared)
	cfg, err := pgxpool.ParseConfig(sharedURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var db *sql.DB = stdlib.OpenDB(*cfg.ConnConfig.Copy())
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	_, err = postgres.New(ctx, pool, postgres.WithTable(table), postgres.WithSweepInterval(0))
	if !errors.Is(err, postgres.ErrReadOnly) || !strings.Contains(err.Error(), "default_transaction_read_only") {
		t.Errorf("New on a read-only server: %v, want ErrReadOnly naming default_transaction_read_only", err)
	}
	_, err = postgres.NewDB(ctx, db, postgres.WithTable(table), postgres.WithSweepInterval(0))
	if !errors.Is(err, postgres.ErrReadOnly) {
		t.Errorf("NewDB on a read-only server: %v, want ErrReadOnly", err)
	}
}

// TestUncommittedRecordIsNotTrusted: whatever isolation level the
// session runs at by default (here READ UNCOMMITTED, which PostgreSQL
// runs as READ COMMITTED, set for the connection as a user or database
// default would be, with the store beginning at the server's default), a
// record is trusted only once committed. The owner's record is written in
// its transaction and its COMMIT held: repeats on both faces and the plain
// claim find the key in flight, never the record; when the COMMIT is then
// lost (the transaction rolls back), the next request runs, and is not
// answered with a replay of what never committed.
func TestUncommittedRecordIsNotTrusted(t *testing.T) {
	shared := sharedPool(t)
	table := newTable(t, shared)
	cfg, err := pgxpool.ParseConfig(sharedURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "read uncommitted"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db := stdlib.OpenDB(*cfg.ConnConfig.Copy())
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	opts := []postgres.Option{postgres.WithTable(table), postgres.WithSweepInterval(0),
		postgres.WithCallTimeout(10 * time.Second), postgres.WithTxOptions(pgx.TxOptions{})}
	st, err := postgres.New(ctx, pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sst, err := postgres.NewDB(ctx, db, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer sst.Close()

	key, c := newKey(), newClaim(1)
	res, tx, err := st.ClaimTx(ctx, key, c)
	if err != nil || res.State != store.Claimed {
		t.Fatalf("owner: %v %v", res.State, err)
	}
	tctx := tx.NewContext(ctx)
	var level string
	if err := postgres.Tx(tctx).QueryRow(tctx, "SHOW transaction_isolation").Scan(&level); err != nil || level != "read uncommitted" {
		t.Fatalf("the owner's transaction runs at %q (%v), want the session's default", level, err)
	}
	// The record, written in the owner's transaction as its keep writes
	// it, its COMMIT not sent.
	if _, err := postgres.Tx(tctx).Exec(tctx, "UPDATE "+table+" SET status = 201, body = 'never committed', completed_at = now() WHERE key = $1", key); err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.Tx(tctx).Exec(tctx, "INSERT INTO "+table+" (key, token, fingerprint, created_at, expires_at, status, body) SELECT $1, 't', $2, now(), now() + interval '1 hour', 201, 'never committed' WHERE NOT EXISTS (SELECT FROM "+table+" WHERE key = $1)", key, c.Fingerprint[:]); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]*postgres.Store{"pgx": st, "database/sql": sst} {
		res, rtx, err := s.ClaimTx(ctx, key, newClaim(1))
		if err != nil || res.State != store.InFlight || rtx != nil {
			t.Errorf("%s: a repeat while the owner's COMMIT is held: %v %v, want in flight", name, res.State, err)
		}
		if res, err := s.Claim(ctx, key, newClaim(1)); err != nil || res.State != store.InFlight {
			t.Errorf("%s: a plain claim while the owner's COMMIT is held: %v %v, want in flight", name, res.State, err)
		}
	}
	// The COMMIT is lost: nothing of it committed.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	res, next, err := st.ClaimTx(ctx, key, newClaim(1))
	if err != nil || res.State != store.Claimed {
		t.Fatalf("after the owner's transaction rolled back: %v %v, want the key claimed anew", res.State, err)
	}
	next.Rollback(ctx)
}

// TestStartUpNamesServer: when the server answers and start-up fails
// after (a table that does not exist, a schema that does not), the errors
// of New, Migrate, NewDB and MigrateDB name the server and the database:
// through pgx's driver from its connection's configuration, and through a
// driver whose connections give nothing of theirs as the server names
// itself.
func TestStartUpNamesServer(t *testing.T) {
	pool := sharedPool(t)
	ctx := context.Background()
	cfg := pool.Config().ConnConfig
	configured := "server " + net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))) + ", database " + cfg.Database
	var host, database string
	var port int
	if err := pool.QueryRow(ctx, "SELECT host(inet_server_addr()), inet_server_port(), current_database()").Scan(&host, &port, &database); err != nil {
		t.Fatal(err)
	}
	itself := "server " + net.JoinHostPort(host, strconv.Itoa(port)) + ", database " + database + " (as the server names itself)"

	pgxDB := stdlib.OpenDB(*cfg.Copy())
	t.Cleanup(func() { pgxDB.Close() })
	opaque := sql.OpenDB(opaqueConnector{stdlib.GetConnector(*cfg.Copy())})
	t.Cleanup(func() { opaque.Close() })

	noTable := []postgres.Option{postgres.WithTable("idemkey_no_such_table"), postgres.WithSweepInterval(0)}
	noSchema := []postgres.Option{postgres.WithTable("idemkey_no_such_schema.records")}
	for _, c := range []struct {
		name, want string
		call       func() error
	}{
		{"New", configured, func() error { _, err := postgres.New(ctx, pool, noTable...); return err }},
		{"Migrate", configured, func() error { return postgres.Migrate(ctx, pool, noSchema...) }},
		{"NewDB (pgx)", configured, func() error { _, err := postgres.NewDB(ctx, pgxDB, noTable...); return err }},
		{"MigrateDB (pgx)", configured, func() error { return postgres.MigrateDB(ctx, pgxDB, noSchema...) }},
		{"NewDB (opaque driver)", itself, func() error { _, err := postgres.NewDB(ctx, opaque, noTable...); return err }},
		{"MigrateDB (opaque driver)", itself, func() error { return postgres.MigrateDB(ctx, opaque, noSchema...) }},
	} {
		err := c.call()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %q", c.name, err, c.want)
		}
	}
}

// opaqueConnector is pgx's database/sql driver with connections that give
// only database/sql's interfaces: a driver that does not say where it
// connects.
type opaqueConnector struct{ driver.Connector }

func (c opaqueConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return opaqueConn{dc.(sqlConn)}, nil
}

// sqlConn is what database/sql uses of a driver connection.
type sqlConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
}

type opaqueConn struct{ sqlConn }
