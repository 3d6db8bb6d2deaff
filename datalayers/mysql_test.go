package datalayers_test

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/uptrace/bun/dialect/mysqldialect"
	"github.com/uptrace/bun/schema"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"

	"github.com/idemkey/idemkey/datalayers/internal/sqlcmysql"
	"github.com/idemkey/idemkey/internal/proctest"
	"github.com/idemkey/idemkey/store/mysql"
)

// mysqlDB is MySQL or MariaDB (MYSQL_URL): each test's namespace is a
// database of its own.
var mysqlDB = &database{
	name:   "mysql",
	driver: "mysql",
	bind:   func(query string) string { return query },
	server: mysqlServer,
	create: func(ctx context.Context, url, ns string) error {
		db, err := openMySQL(url, "", 1)
		if err != nil {
			return err
		}
		defer db.Close()
		if _, err := db.ExecContext(ctx, "CREATE DATABASE "+ns); err != nil {
			return err
		}
		_, err = db.ExecContext(ctx, `CREATE TABLE `+ns+`.payments (
	id       VARCHAR(64) NOT NULL PRIMARY KEY,
	idem_key VARCHAR(255) NOT NULL,
	amount   BIGINT NOT NULL,
	made_by  VARCHAR(64) NOT NULL
) ENGINE=InnoDB`)
		if err != nil {
			return err
		}
		in, err := openMySQL(url, ns, 1)
		if err != nil {
			return err
		}
		defer in.Close()
		return mysql.Migrate(ctx, in)
	},
	drop: func(ctx context.Context, url, ns string) error {
		db, err := openMySQL(url, "", 1)
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.ExecContext(ctx, "DROP DATABASE IF EXISTS "+ns)
		return err
	},
	open: openMySQL,
	newStore: func(ctx context.Context, db *sql.DB, _ string) (txStore, error) {
		return mysql.New(ctx, db, mysql.WithSweepInterval(0), mysql.WithCallTimeout(10*time.Second))
	},
	tx:   mysql.Tx,
	gorm: func(conn gorm.ConnPool) gorm.Dialector { return gormmysql.New(gormmysql.Config{Conn: conn}) },
	bun:  func() schema.Dialect { return mysqldialect.New() },
	sqlc: func(db *sql.DB) func(ctx context.Context, tx *sql.Tx, p payment) error {
		queries := sqlcmysql.New(db)
		return func(ctx context.Context, tx *sql.Tx, p payment) error {
			return queries.WithTx(tx).CreatePayment(ctx, sqlcmysql.CreatePaymentParams{
				ID: p.ID, IdemKey: p.Key, Amount: p.Amount, MadeBy: p.By,
			})
		}
	},
}

func init() { databases = append(databases, mysqlDB) }

// mysqlServer returns MYSQL_URL (or the local server's), skipping the
// test when it does not answer (failing it under CI).
func mysqlServer(t testing.TB) string {
	t.Helper()
	url := os.Getenv("MYSQL_URL")
	if url == "" {
		url = "mysql://root@127.0.0.1:3306/test"
	}
	db, err := openMySQL(url, "", 1)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		err = db.PingContext(ctx)
		cancel()
		db.Close()
	}
	if err != nil {
		proctest.Unavailable(t, "MySQL at %s: %v", url, err)
	}
	return url
}

// openMySQL opens url's server, on database ns (url's own when ns is
// empty), with room for maxConns connections.
func openMySQL(url, ns string, maxConns int) (*sql.DB, error) {
	dsn, err := mysql.DSN(url)
	if err != nil {
		return nil, err
	}
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	if ns != "" {
		cfg.DBName = ns
	}
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(maxConns)
	return db, nil
}
