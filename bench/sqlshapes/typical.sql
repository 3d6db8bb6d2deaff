-- pg-typical: the hand-written pattern, six round trips (BEGIN, SELECT the key,
-- INSERT it, the handler's INSERT, UPDATE the key with the response, COMMIT).
\set id random(1, 9000000000000)
BEGIN;
SELECT request_hash, status, content_type, body FROM bench_typical_keys WHERE key = 'k' || :id;
INSERT INTO bench_typical_keys (key, request_hash) VALUES ('k' || :id, 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa');
INSERT INTO bench_payments (key, run, bytes) VALUES ('k' || :id, :id, 1024);
UPDATE bench_typical_keys SET status = 201, content_type = 'application/json', body = '\x7b226964223a226b2d3132333435363738222c2272756e223a31323334357d7b226964223a226b2d3132333435363738222c2272756e223a31323334357d7b226964223a226b2d31323334353637383930227d'::bytea WHERE key = 'k' || :id;
COMMIT;
