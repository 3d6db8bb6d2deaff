-- The tables the shapes run on, in the schema sqlshapes (run.sh applies
-- store/postgres/schema.sql there first): the hand-written pattern's key
-- table and the payments, as the load driver makes them, and 100,000
-- kept records in both key tables for the replays ('r1' to 'r100000').
CREATE TABLE bench_payments (id bigserial PRIMARY KEY, key text NOT NULL, run bigint NOT NULL, bytes int NOT NULL);
CREATE TABLE bench_typical_keys (key text PRIMARY KEY, request_hash text NOT NULL, status int, content_type text,
    body bytea, created_at timestamptz NOT NULL DEFAULT now());
INSERT INTO bench_typical_keys
SELECT 'r' || i, repeat('a', 64), 201, 'application/json', convert_to(repeat('x', 90), 'UTF8')
FROM generate_series(1, 100000) i;
INSERT INTO idemkey_records (key, token, fingerprint, raw_digest, created_at, expires_at, status, header, body, body_omitted, completed_at)
SELECT 'r' || i, 'tok', decode(repeat('ab', 32), 'hex'), decode(repeat('cd', 32), 'hex'), now(), now() + interval '1 day',
    201, decode(repeat('ef', 40), 'hex'), convert_to(repeat('x', 90), 'UTF8'), false, now()
FROM generate_series(1, 100000) i;
ANALYZE;
