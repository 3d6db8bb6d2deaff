package datalayers_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/schema"
	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/idemkey/idemkey/datalayers/internal/sqlcdb"
	"github.com/idemkey/idemkey/internal/pgtest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// database is an engine the data layers are tested on, with its store:
// one that keeps the record in the handler's transaction and hands that
// transaction to the handler as a *sql.Tx. Another engine is another
// entry in databases.
//
// Each test works in a namespace of its own (a PostgreSQL schema) holding
// the store's table and a payments table, so that every data layer finds
// the payments table under its plain name, as in a service.
type database struct {
	name string
	// driver is the database/sql driver's name (sqlx chooses its
	// placeholders by it).
	driver string
	// bind rewrites a query written with ? placeholders into the
	// engine's.
	bind func(query string) string
	// server returns the server's URL, skipping the test without one
	// (failing it when CI is set).
	server func(t testing.TB) string
	// create makes the namespace ns on the server at url, with the
	// payments table and the store's table in it; drop removes it all.
	create func(ctx context.Context, url, ns string) error
	drop   func(ctx context.Context, url, ns string) error
	// open returns a *sql.DB on the server at url that finds the tables
	// of ns by their plain names, with room for maxConns connections.
	open func(url, ns string, maxConns int) (*sql.DB, error)
	// newStore returns the store on db, its table in ns.
	newStore func(ctx context.Context, db *sql.DB, ns string) (txStore, error)
	// tx returns the request's transaction, in the handler.
	tx func(ctx context.Context) *sql.Tx

	// What each data layer needs to know of the engine.
	gorm func(conn gorm.ConnPool) gorm.Dialector
	bun  func() schema.Dialect
	// sqlc returns the insert through the engine's sqlc package (sqlc
	// generates one per engine), bound once to db.
	sqlc func(db *sql.DB) func(ctx context.Context, tx *sql.Tx, p payment) error
}

// txStore is a store that keeps the record in the handler's transaction.
type txStore interface {
	store.TxStore
	Close() error
}

// databases are the engines the tests run on.
var databases = []*database{postgresDB}

var postgresDB = &database{
	name:   "postgres",
	driver: "pgx",
	bind: func(query string) string {
		var b strings.Builder
		n := 0
		for _, r := range query {
			if r == '?' {
				n++
				b.WriteString("$" + strconv.Itoa(n))
				continue
			}
			b.WriteRune(r)
		}
		return b.String()
	},
	server: pgtest.Shared,
	create: func(ctx context.Context, url, ns string) error {
		db, err := sql.Open("pgx", url)
		if err != nil {
			return err
		}
		defer db.Close()
		if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+ns); err != nil {
			return err
		}
		_, err = db.ExecContext(ctx, `CREATE TABLE `+ns+`.payments (
	id       text PRIMARY KEY,
	idem_key text NOT NULL,
	amount   bigint NOT NULL,
	made_by  text NOT NULL
)`)
		if err != nil {
			return err
		}
		return postgres.MigrateDB(ctx, db, postgres.WithTable(ns+".idemkey_records"))
	},
	drop: func(ctx context.Context, url, ns string) error {
		db, err := sql.Open("pgx", url)
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+ns+" CASCADE")
		return err
	},
	open: func(url, ns string, maxConns int) (*sql.DB, error) {
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			return nil, err
		}
		cfg.RuntimeParams["search_path"] = ns
		db := stdlib.OpenDB(*cfg)
		db.SetMaxOpenConns(maxConns)
		return db, nil
	},
	newStore: func(ctx context.Context, db *sql.DB, ns string) (txStore, error) {
		// No sweeper, and a wide call budget: the machine running the
		// tests may be busy (and under the race detector).
		return postgres.NewDB(ctx, db, postgres.WithTable(ns+".idemkey_records"),
			postgres.WithSweepInterval(0), postgres.WithCallTimeout(10*time.Second))
	},
	tx: postgres.SQLTx,
	gorm: func(conn gorm.ConnPool) gorm.Dialector {
		return gormpg.New(gormpg.Config{Conn: conn})
	},
	bun: func() schema.Dialect { return pgdialect.New() },
	sqlc: func(db *sql.DB) func(ctx context.Context, tx *sql.Tx, p payment) error {
		queries := sqlcdb.New(db)
		return func(ctx context.Context, tx *sql.Tx, p payment) error {
			_, err := queries.WithTx(tx).CreatePayment(ctx, sqlcdb.CreatePaymentParams{
				ID: p.ID, IdemKey: p.Key, Amount: p.Amount, MadeBy: p.By,
			})
			return err
		}
	},
}

// env is one test's namespace on a database, and the store on it.
type env struct {
	d   *database
	url string
	ns  string
	db  *sql.DB
	st  txStore
}

// newEnv makes a namespace of the test's own on d, with the store on it;
// both go when the test ends.
func newEnv(t *testing.T, d *database) *env {
	t.Helper()
	url := d.server(t)
	var b [6]byte
	rand.Read(b[:])
	ns := "idemkey_dl_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.create(ctx, url, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.drop(ctx, url, ns); err != nil {
			t.Errorf("dropping the test's namespace %s: %v", ns, err)
		}
	})
	db, err := d.open(url, ns, 20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st, err := d.newStore(ctx, db, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &env{d: d, url: url, ns: ns, db: db, st: st}
}

// madeBy returns who made the committed payments for key, in order.
func (e *env) madeBy(t testing.TB, key string) []string {
	t.Helper()
	rows, err := e.db.Query(e.d.bind("SELECT made_by FROM payments WHERE idem_key = ? ORDER BY made_by"), key)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var who []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		who = append(who, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return who
}

// paymentID returns the id of the one committed payment for key.
func (e *env) paymentID(t testing.TB, key string) string {
	t.Helper()
	var id string
	if err := e.db.QueryRow(e.d.bind("SELECT id FROM payments WHERE idem_key = ?"), key).Scan(&id); err != nil {
		t.Fatal(fmt.Errorf("the payment for the key: %w", err))
	}
	return id
}
