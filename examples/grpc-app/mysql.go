package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	_ "github.com/go-sql-driver/mysql"

	"github.com/idemkey/idemkey/examples/grpc-app/paymentspb"
	"github.com/idemkey/idemkey/store/mysql"
)

// mysqlPoolSize is the connection pool on MySQL: a payment holds a
// connection for its handler's whole run, so this is how many payments the
// service makes at once, as in the HTTP examples.
const mysqlPoolSize = 32

// mysqlPaymentsSchema is the payments table of the HTTP examples on MySQL
// and MariaDB, created at start when it is missing.
const mysqlPaymentsSchema = `CREATE TABLE IF NOT EXISTS payments (
    id         VARCHAR(64) NOT NULL PRIMARY KEY,
    amount     BIGINT NOT NULL CHECK (amount > 0),
    currency   CHAR(3) NOT NULL,
    user_name  VARCHAR(255) NOT NULL,
    created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB`

// openMySQL opens the MySQL store and the payments table on url, a
// mysql:// URL.
func openMySQL(ctx context.Context, url string) (*backend, error) {
	dsn, err := mysql.DSN(url)
	if err != nil {
		// The URL may hold a password: do not repeat it.
		return nil, errors.New("DATABASE_URL is not a valid mysql://user[:password]@host:port/database URL")
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(mysqlPoolSize)
	db.SetMaxIdleConns(mysqlPoolSize)
	err = db.PingContext(ctx)
	if err == nil {
		err = mysql.Migrate(ctx, db)
	}
	if err == nil {
		_, err = db.ExecContext(ctx, mysqlPaymentsSchema)
	}
	var st *mysql.Store
	if err == nil {
		st, err = mysql.New(ctx, db)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("setting up MySQL: %w", err)
	}
	return &backend{store: st, name: "mysql", book: mysqlBook{db}, close: func() { st.Close(); db.Close() }}, nil
}

// mysqlBook is the payments table on MySQL, written through the call's
// transaction, which idemgrpc commits with the kept answer.
type mysqlBook struct{ db *sql.DB }

func (d mysqlBook) add(ctx context.Context, p *paymentspb.Payment) error {
	tx := mysql.Tx(ctx)
	if tx == nil {
		return errors.New("no call transaction: CreatePayment needs idemgrpc on the MySQL store")
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO payments (id, amount, currency, user_name) VALUES (?, ?, ?, ?)",
		p.GetId(), p.GetAmount(), p.GetCurrency(), p.GetUser())
	return err
}

func (mysqlBook) remove(string) {} // the transaction rolls back

func (d mysqlBook) get(ctx context.Context, id string) (*paymentspb.Payment, error) {
	ps, err := d.query(ctx, "SELECT id, amount, currency, user_name FROM payments WHERE id = ?", id)
	if err != nil || len(ps) == 0 {
		return nil, err
	}
	return ps[0], nil
}

func (d mysqlBook) all(ctx context.Context) ([]*paymentspb.Payment, error) {
	return d.query(ctx, "SELECT id, amount, currency, user_name FROM payments ORDER BY created_at, id")
}

func (d mysqlBook) query(ctx context.Context, query string, args ...any) ([]*paymentspb.Payment, error) {
	rows, err := d.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ps []*paymentspb.Payment
	for rows.Next() {
		p := &paymentspb.Payment{}
		if err := rows.Scan(&p.Id, &p.Amount, &p.Currency, &p.User); err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, rows.Err()
}
