package payments

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idemkey/idemkey/store/mysql"
)

// MySQLPoolSize is the connection pool of the MySQL store: a payment holds
// a connection for its handler's whole run, as on PostgreSQL.
const MySQLPoolSize = PostgresPoolSize

// mysqlPaymentsSchema is the payments table on MySQL and MariaDB.
const mysqlPaymentsSchema = `CREATE TABLE IF NOT EXISTS payments (
    id         VARCHAR(64) NOT NULL PRIMARY KEY,
    amount     BIGINT NOT NULL CHECK (amount > 0),
    currency   CHAR(3) NOT NULL,
    user_name  VARCHAR(255) NOT NULL,
    created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB`

// openMySQL opens the MySQL store and the payments table on url, a
// mysql:// URL.
func openMySQL(ctx context.Context, url string, logger *slog.Logger) (*Backend, error) {
	dsn, err := mysql.DSN(url)
	if err != nil {
		// The URL may hold a password: do not repeat it.
		return nil, errors.New("DATABASE_URL is not a valid mysql://user[:password]@host:port/database URL")
	}
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		return nil, errors.New("DATABASE_URL is not a valid mysql://user[:password]@host:port/database URL")
	}
	logger.Info("idempotency store", "store", "mysql", "addr", cfg.Addr, "database", cfg.DBName, "pool", MySQLPoolSize,
		"note", "payments and idempotency records commit together")
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(MySQLPoolSize)
	db.SetMaxIdleConns(MySQLPoolSize)
	wctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	err = db.PingContext(wctx)
	if err == nil {
		err = mysql.Migrate(wctx, db)
	}
	if err == nil {
		_, err = db.ExecContext(wctx, mysqlPaymentsSchema)
	}
	var st *mysql.Store
	if err == nil {
		st, err = mysql.New(wctx, db)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("MySQL: %w", err)
	}
	return &Backend{
		Store: st,
		Name:  "mysql",
		book:  mysqlPayments{db},
		Ping:  db.PingContext,
		Close: func() error {
			st.Close()
			return db.Close()
		},
	}, nil
}

// mysqlPayments is the paymentBook of a service with a mysql://
// DATABASE_URL: the payments table.
type mysqlPayments struct{ db *sql.DB }

// add inserts the payment through the request's transaction, which the
// idempotency middleware commits together with the kept answer.
func (d mysqlPayments) add(ctx context.Context, p Payment) (func(), error) {
	tx := mysql.Tx(ctx)
	if tx == nil {
		return nil, errors.New("payments: no request transaction: POST /payments needs the idempotency middleware on the MySQL store")
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO payments (id, amount, currency, user_name) VALUES (?, ?, ?, ?)",
		p.ID, p.Amount, p.Currency, p.User); err != nil {
		return nil, fmt.Errorf("inserting the payment: %w", err)
	}
	return nil, nil // a 5xx answer rolls the transaction back
}

func (d mysqlPayments) all(ctx context.Context) ([]Payment, error) {
	rows, err := d.db.QueryContext(ctx, "SELECT id, amount, currency, user_name FROM payments ORDER BY created_at, id")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	ps := []Payment{}
	for rows.Next() {
		var p Payment
		if err := rows.Scan(&p.ID, &p.Amount, &p.Currency, &p.User); err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, rows.Err()
}

func (d mysqlPayments) get(ctx context.Context, id string) (Payment, bool, error) {
	var p Payment
	err := d.db.QueryRowContext(ctx, "SELECT id, amount, currency, user_name FROM payments WHERE id = ?", id).
		Scan(&p.ID, &p.Amount, &p.Currency, &p.User)
	if errors.Is(err, sql.ErrNoRows) {
		return Payment{}, false, nil
	}
	return p, err == nil, err
}
