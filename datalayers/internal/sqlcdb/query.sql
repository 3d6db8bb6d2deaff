-- The query sqlc would compile into query.sql.go, against the payments
-- table (schema.sql).

-- name: CreatePayment :one
INSERT INTO payments (id, idem_key, amount, made_by)
VALUES ($1, $2, $3, $4)
RETURNING id, idem_key, amount, made_by;
