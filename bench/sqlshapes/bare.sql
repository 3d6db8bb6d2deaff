-- pg-bare: the handler's INSERT in a transaction of its own, no idempotency.
\set id random(1, 9000000000000)
BEGIN;
INSERT INTO bench_payments (key, run, bytes) VALUES ('k' || :id, :id, 1024);
COMMIT;
