package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrPreparedStatements is what New and NewDB return for a pool whose pgx
// connections name prepared statements (default_query_exec_mode
// cache_statement, pgx's default, or describe_exec) but reach the server
// through a pooler that does not keep them across transactions
// (PgBouncer in transaction mode before 1.21, or with
// max_prepared_statements = 0; other transaction-mode poolers): every
// transaction may run on another server connection, and under
// concurrency requests fail with "prepared statement ... already exists"
// or "does not exist". The store's statements and the handler's go
// through that pool alike. Set default_query_exec_mode to exec,
// cache_describe or simple_protocol (in the URL, or
// pgx.ConnConfig.DefaultQueryExecMode), or turn on the pooler's
// prepared-statement support.
var ErrPreparedStatements = errors.New("idemkey: postgres: the pool names prepared statements, and its connections go through a pooler that does not keep them across transactions")

// namesStatements reports whether pgx in mode m names prepared
// statements, or splits a statement over two round trips, either of
// which needs the same server connection for more than one transaction or
// round trip.
func namesStatements(m pgx.QueryExecMode) bool {
	return m == pgx.QueryExecModeCacheStatement || m == pgx.QueryExecModeDescribeExec
}

// probeTimeout bounds the probe's last step: a pooler with one server
// connection makes it wait for the other client's transaction, and then
// nothing can be told.
const probeTimeout = 2 * time.Second

// probeStatements tells whether a statement prepared by name on a's
// connection outside a transaction is still there for a's next
// statement while b holds a transaction open: on a direct connection
// (or behind a pooler that keeps prepared statements, or in session
// mode) it is; behind a transaction-mode pooler without that support,
// b's transaction most likely runs on the server connection a's prepare
// used (PgBouncer hands out the one used last), a's next statement
// reaches another, and the statement does not exist there. A pooler that
// hands a the same server connection again is not seen: then the probe
// reports false. It deallocates the statement, on both, whatever it
// finds.
func probeStatements(ctx context.Context, a, b *pgconn.PgConn) (bool, error) {
	name := fmt.Sprintf("idemkey_probe_%x", uint64(randomLock()))
	if _, err := a.Prepare(ctx, name, "SELECT 1", nil); err != nil {
		return false, err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeTimeout)
		defer cancel()
		a.Deallocate(ctx, name)
	}()
	if err := b.Exec(ctx, "BEGIN; SELECT 1").Close(); err != nil {
		return false, err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeTimeout)
		defer cancel()
		b.Deallocate(ctx, name) // on the server connection the pooler gave it
		b.Exec(ctx, "ROLLBACK").Close()
	}()
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	res := a.ExecPrepared(pctx, name, nil, nil, nil).Read()
	if res.Err != nil {
		if sqlState(res.Err) == "26000" { // invalid_sql_statement_name: it does not exist
			return true, nil
		}
		if pctx.Err() != nil && ctx.Err() == nil {
			return false, nil // a pooler of one server connection: cannot tell
		}
		return false, res.Err
	}
	return false, nil
}

// checkPoolStatements refuses a pgx pool in a mode that names statements
// when its connections turn out to go through a pooler that does not
// keep them (probeStatements). A pool of one connection is not probed.
func checkPoolStatements(ctx context.Context, pool *pgxpool.Pool) error {
	cfg := pool.Config()
	mode := cfg.ConnConfig.DefaultQueryExecMode
	if !namesStatements(mode) || cfg.MaxConns < 2 {
		return nil
	}
	const checking = "idemkey: postgres: checking how the pool's connections keep prepared statements: %w"
	a, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf(checking, err)
	}
	defer a.Release()
	b, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf(checking, err)
	}
	defer b.Release()
	lost, err := probeStatements(ctx, a.Conn().PgConn(), b.Conn().PgConn())
	if err != nil {
		return fmt.Errorf(checking, err)
	}
	return statementsErr(lost, mode)
}

// checkDBStatements is checkPoolStatements for a database/sql DB of pgx's
// driver (a driver connection that gives its *pgx.Conn); other drivers are
// not probed.
func checkDBStatements(ctx context.Context, db *sql.DB) error {
	if db.Stats().MaxOpenConnections == 1 {
		return nil
	}
	const checking = "idemkey: postgres: checking how the DB's connections keep prepared statements: %w"
	a, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf(checking, err)
	}
	defer a.Close()
	b, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf(checking, err)
	}
	defer b.Close()
	var lost bool
	var mode pgx.QueryExecMode
	err = a.Raw(func(ad any) error {
		ac, ok := ad.(pgxConn)
		if !ok {
			return nil
		}
		mode = ac.Conn().Config().DefaultQueryExecMode
		if !namesStatements(mode) {
			return nil
		}
		return b.Raw(func(bd any) error {
			bc, ok := bd.(pgxConn)
			if !ok {
				return nil
			}
			var err error
			lost, err = probeStatements(ctx, ac.Conn().PgConn(), bc.Conn().PgConn())
			return err
		})
	})
	if err != nil {
		return fmt.Errorf(checking, err)
	}
	return statementsErr(lost, mode)
}

func statementsErr(lost bool, mode pgx.QueryExecMode) error {
	if !lost {
		return nil
	}
	return fmt.Errorf("%w (a statement prepared on one of them was gone in its next transaction): pgx's default_query_exec_mode is %s; set it to exec, cache_describe or simple_protocol (in the URL, or pgx.ConnConfig.DefaultQueryExecMode), or turn on the pooler's prepared statements (PgBouncer 1.21 and later: max_prepared_statements)", ErrPreparedStatements, mode)
}
