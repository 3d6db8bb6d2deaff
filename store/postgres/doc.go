// Package postgres is the idempotency store that keeps each record in a
// PostgreSQL table, through a pgx v5 pool, and can keep it in the handler's
// own transaction: the handler's writes and the kept response commit
// together or not at all.
package postgres
