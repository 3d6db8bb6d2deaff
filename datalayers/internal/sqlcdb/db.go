// Hand-written in the shape sqlc generates for database/sql (its
// "database/sql" driver, engine postgresql, from query.sql and the
// payments table): sqlc is not run here. The files of this package are
// what its output looks like, so that the tests call the request's
// transaction the way a service on sqlc does: New once, WithTx per
// request.

// Package sqlcdb holds the payments queries in the shape of sqlc's
// database/sql output.
package sqlcdb

import (
	"context"
	"database/sql"
)

// DBTX is what the queries run on: a *sql.DB, a *sql.Conn or a *sql.Tx.
type DBTX interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
	PrepareContext(context.Context, string) (*sql.Stmt, error)
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	QueryRowContext(context.Context, string, ...any) *sql.Row
}

// New returns the queries on db.
func New(db DBTX) *Queries {
	return &Queries{db: db}
}

// Queries runs the package's queries on one DBTX.
type Queries struct {
	db DBTX
}

// WithTx returns the queries on tx instead.
func (q *Queries) WithTx(tx *sql.Tx) *Queries {
	return &Queries{
		db: tx,
	}
}
