// Hand-written in the shape sqlc generates (see db.go), from query.sql.

package sqlcdb

import (
	"context"
)

const createPayment = `-- name: CreatePayment :one
INSERT INTO payments (id, idem_key, amount, made_by)
VALUES ($1, $2, $3, $4)
RETURNING id, idem_key, amount, made_by
`

// CreatePaymentParams are CreatePayment's arguments.
type CreatePaymentParams struct {
	ID      string
	IdemKey string
	Amount  int64
	MadeBy  string
}

// CreatePayment inserts a payment and returns its row.
func (q *Queries) CreatePayment(ctx context.Context, arg CreatePaymentParams) (Payment, error) {
	row := q.db.QueryRowContext(ctx, createPayment,
		arg.ID,
		arg.IdemKey,
		arg.Amount,
		arg.MadeBy,
	)
	var i Payment
	err := row.Scan(
		&i.ID,
		&i.IdemKey,
		&i.Amount,
		&i.MadeBy,
	)
	return i, err
}
