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
	// locate names the server and database, for start-up's errors:
	// where the pool says it connects, or else where a connection it
	// gives goes. When it cannot connect it names what the error says,
	// and returns the error.
	locate(ctx context.Context) (string, error)
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

// locate names where the pool's configuration connects, and takes a
// connection from the pool (given back for the checks that follow), so
// that a server that cannot be reached fails start-up as it does on the
// database/sql face.
func (p pgxDB) locate(ctx context.Context) (string, error) {
	cfg := p.pool.Config().ConnConfig
	at := serverName(cfg.Host, int(cfg.Port), cfg.Database)
	c, err := p.pool.Acquire(ctx)
	if err != nil {
		return at, err
	}
	c.Release()
	return at, nil
}

// serverName is how start-up's errors name a server and its database.
func serverName(host string, port int, database string) string {
	return fmt.Sprintf("server %s, database %s", net.JoinHostPort(host, strconv.Itoa(port)), database)
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

func (d sqlDB) checkStatements(ctx context.Context) error { return checkDBStatements(ctx, d.db) }

// pgxConn is a database/sql driver connection that gives its *pgx.Conn:
// pgx's stdlib.Conn, through its exported method.
type pgxConn interface{ Conn() *pgx.Conn }

// locate takes a connection and names where it goes. A *sql.DB does not
// say where it connects (its connector is not reachable from it), so the
// connection is asked: pgx's driver connection gives its configuration
// (pgxConn); any other driver's asks the server its address and database,
// once (a server that does not answer that is named by its driver: the
// checks that follow say what is wrong). The connection then goes back to
// the DB's pool, for those checks. When no connection can be made, the
// error of pgx's driver says where it tried (pgconn.ConnectError's
// Config); another driver's leaves only the driver to name.
func (d sqlDB) locate(ctx context.Context) (string, error) {
	c, err := d.db.Conn(ctx)
	if err != nil {
		if ce, ok := errors.AsType[*pgconn.ConnectError](err); ok && ce.Config != nil {
			return serverName(ce.Config.Host, int(ce.Config.Port), ce.Config.Database), err
		}
		return fmt.Sprintf("the database/sql DB of driver %T, which does not say where it connects", d.db.Driver()), err
	}
	defer c.Close()
	var at string
	c.Raw(func(dc any) error {
		if pc, ok := dc.(pgxConn); ok {
			cfg := pc.Conn().Config()
			at = serverName(cfg.Host, int(cfg.Port), cfg.Database)
		}
		return nil
	})
	if at != "" {
		return at, nil
	}
	var host sql.NullString
	var port sql.NullInt64
	var database string
	err = c.QueryRowContext(ctx, "SELECT host(inet_server_addr()), inet_server_port(), current_database()").Scan(&host, &port, &database)
	switch {
	case err != nil:
		// The checks that follow say what is wrong with the server.
		return fmt.Sprintf("the database/sql DB of driver %T, whose server did not say where it is", d.db.Driver()), nil
	case !host.Valid:
		return "server on a Unix socket, database " + database, nil
	}
	return serverName(host.String, int(port.Int64), database) + " (as the server names itself)", nil
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
