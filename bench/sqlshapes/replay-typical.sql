-- pg-typical's replay: BEGIN, SELECT the key's row, ROLLBACK.
\set id random(1, 100000)
BEGIN;
SELECT request_hash, status, content_type, body FROM bench_typical_keys WHERE key = 'r' || :id;
ROLLBACK;
