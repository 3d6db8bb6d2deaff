// Hand-written in the shape sqlc generates for database/sql (engine
// mysql, from query.sql and the payments table): sqlc is not run here.
// sqlc makes a package per engine; this is the MySQL one of
// ../sqlcdb's PostgreSQL queries.

// Package sqlcmysql holds the payments queries in the shape of sqlc's
// database/sql output for MySQL.
package sqlcmysql

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
func New(db DBTX) *Queries { return &Queries{db: db} }

// Queries runs the package's queries on one DBTX.
type Queries struct{ db DBTX }

// WithTx returns the queries on tx instead.
func (q *Queries) WithTx(tx *sql.Tx) *Queries { return &Queries{db: tx} }

const createPayment = `-- name: CreatePayment :exec
INSERT INTO payments (id, idem_key, amount, made_by)
VALUES (?, ?, ?, ?)
`

// CreatePaymentParams are CreatePayment's arguments.
type CreatePaymentParams struct {
	ID      string
	IdemKey string
	Amount  int64
	MadeBy  string
}

// CreatePayment inserts a payment (MySQL has no RETURNING: sqlc makes it
// an :exec query).
func (q *Queries) CreatePayment(ctx context.Context, arg CreatePaymentParams) error {
	_, err := q.db.ExecContext(ctx, createPayment, arg.ID, arg.IdemKey, arg.Amount, arg.MadeBy)
	return err
}
