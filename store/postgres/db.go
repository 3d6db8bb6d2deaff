package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// db is the store's way to the server for every statement outside a
// request's transaction: a pgx pool (New) or a database/sql DB (NewDB).
// The statements are the same on both; only a request's transaction is
// run each face's own way (tx.go for pgx, sqltx.go for database/sql).
type db interface {
	queryRow(ctx context.Context, sql string, args ...any) scanner
	exec(ctx context.Context, sql string, args ...any) (int64, error)
	// inTx runs f in a transaction of its own, committed when f returns
	// nil and rolled back otherwise.
	inTx(ctx context.Context, f func(q db) error) error
	// maxConns is the pool's bound on open connections; 0 when it has
	// none.
	maxConns() int
	// server names the server and database, for start-up's errors.
	server() string
	// checkStatements refuses a pool whose prepared statements are lost
	// between transactions (ErrPreparedStatements).
	checkStatements(ctx context.Context) error
}

// scanner is a row: pgx.Row and *sql.Row alike.
type scanner interface{ Scan(dest ...any) error }

// pgxQuerier is what both a pool and a transaction of pgx run.
type pgxQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// pgxDB is a pgx pool, or a transaction on one.
type pgxDB struct {
	q    pgxQuerier
	pool *pgxpool.Pool // nil inside a transaction
}

func (p pgxDB) queryRow(ctx context.Context, sql string, args ...any) scanner {
	return p.q.QueryRow(ctx, sql, args...)
}

func (p pgxDB) exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := p.q.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

func (p pgxDB) inTx(ctx context.Context, f func(q db) error) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error { return f(pgxDB{q: tx}) })
}

func (p pgxDB) maxConns() int { return int(p.pool.Config().MaxConns) }

func (p pgxDB) checkStatements(ctx context.Context) error { return checkPoolStatements(ctx, p.pool) }

func (p pgxDB) server() string {
	c := p.pool.Config().ConnConfig
	return fmt.Sprintf("server %s, database %s", net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port))), c.Database)
}

// sqlQuerier is what both a *sql.DB and a *sql.Tx run.
type sqlQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// sqlDB is a database/sql DB, or a transaction on one.
type sqlDB struct {
	q  sqlQuerier
	db *sql.DB // nil inside a transaction
}

func (d sqlDB) queryRow(ctx context.Context, query string, args ...any) scanner {
	return d.q.QueryRowContext(ctx, query, args...)
}

func (d sqlDB) exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := d.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (d sqlDB) inTx(ctx context.Context, f func(q db) error) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f(sqlDB{q: tx}); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

func (d sqlDB) maxConns() int { return d.db.Stats().MaxOpenConnections }

// server names what database/sql says of the server: only its driver (a
// DB does not say where it connects), and, once connected, what the
// server says of itself.
func (d sqlDB) checkStatements(ctx context.Context) error { return checkDBStatements(ctx, d.db) }

func (d sqlDB) server() string {
	return fmt.Sprintf("the database/sql DB of driver %T", d.db.Driver())
}

// noRows reports a statement that answered no row, on either face.
func noRows(err error) bool {
	return errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows)
}

// sqlStater is a server's error with its SQLSTATE code: pgconn.PgError
// (pgx, and its database/sql driver) and the errors of other
// database/sql drivers that say which code the server answered.
type sqlStater interface {
	error
	SQLState() string
}

// sqlState returns the SQLSTATE code of the server's error in err, or ""
// when err is not one (a connection that failed, a timeout).
func sqlState(err error) string {
	if e, ok := errors.AsType[sqlStater](err); ok {
		return e.SQLState()
	}
	return ""
}
