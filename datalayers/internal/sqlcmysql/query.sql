-- name: CreatePayment :exec
INSERT INTO payments (id, idem_key, amount, made_by)
VALUES (?, ?, ?, ?);
