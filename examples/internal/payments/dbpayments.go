package payments

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store/postgres"
)

// paymentsSchema is the payments table, which the service creates at
// start when it is missing.
const paymentsSchema = `CREATE TABLE IF NOT EXISTS payments (
    id         text PRIMARY KEY,
    amount     bigint NOT NULL CHECK (amount > 0),
    currency   text NOT NULL,
    user_name  text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
)`

// dbPayments is the paymentBook of a service with DATABASE_URL: the
// payments table.
type dbPayments struct{ pool *pgxpool.Pool }

// createPayments creates the payments table unless it exists, holding a
// lock so that instances starting together do not race to create it.
func createPayments(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('idemkey example: payments'))"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, paymentsSchema)
		return err
	})
}

// add inserts the payment through the request's transaction, which the
// idempotency middleware commits together with the kept answer. A request
// without one (there is none when the middleware does not run the handler
// in a transaction) is refused rather than paid outside it.
func (d dbPayments) add(ctx context.Context, p Payment) (func(), error) {
	tx := postgres.Tx(ctx)
	if tx == nil {
		return nil, errors.New("payments: no request transaction: POST /payments needs the idempotency middleware on the PostgreSQL store")
	}
	_, err := tx.Exec(ctx, "INSERT INTO payments (id, amount, currency, user_name) VALUES ($1, $2, $3, $4)",
		p.ID, p.Amount, p.Currency, p.User)
	if err != nil {
		return nil, fmt.Errorf("inserting the payment: %w", err)
	}
	return nil, nil // a 5xx answer rolls the transaction back
}

func (d dbPayments) all(ctx context.Context) ([]Payment, error) {
	rows, err := d.pool.Query(ctx, "SELECT id, amount, currency, user_name FROM payments ORDER BY created_at, id")
	if err != nil {
		return nil, err
	}
	ps, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Payment])
	if ps == nil {
		ps = []Payment{}
	}
	return ps, err
}

func (d dbPayments) get(ctx context.Context, id string) (Payment, bool, error) {
	var p Payment
	err := d.pool.QueryRow(ctx, "SELECT id, amount, currency, user_name FROM payments WHERE id = $1", id).
		Scan(&p.ID, &p.Amount, &p.Currency, &p.User)
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, false, nil
	}
	return p, err == nil, err
}
