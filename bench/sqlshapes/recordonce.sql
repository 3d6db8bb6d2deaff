-- The record written once, at the end: the claim takes the two locks (and
-- the claim's timeouts) and then reads the committed record in a statement
-- of its own (under READ COMMITTED a snapshot taken after the locks, which
-- sees a record committed by the owner the locks just let go of); nothing
-- is written until the record, one INSERT fenced by the claim's life and
-- against a live row, pipelined with COMMIT.
\set id random(1, 9000000000000)
\startpipeline
BEGIN;
SELECT k.key_got, l.fp_got, set_config('statement_timeout', '10000', true), set_config('idle_in_transaction_session_timeout', '10000', true)
FROM (SELECT pg_try_advisory_xact_lock(:id::bigint + 1) AS fp_got OFFSET 0) l
CROSS JOIN LATERAL (SELECT CASE WHEN l.fp_got THEN pg_try_advisory_xact_lock(:id::bigint) END AS key_got OFFSET 0) k;
SELECT t.token, t.fingerprint, t.created_at, t.expires_at, t.status, t.header, t.body, t.body_omitted, t.completed_at, t.raw_digest
FROM idemkey_records t WHERE t.key = 'k' || :id AND t.expires_at > statement_timestamp();
\endpipeline
INSERT INTO bench_payments (key, run, bytes) VALUES ('k' || :id, :id, 1024);
\startpipeline
WITH kept AS (
    INSERT INTO idemkey_records AS t (key, token, fingerprint, raw_digest, status, header, body, body_omitted, created_at, completed_at, expires_at)
    SELECT 'k' || :id, 'tok-0123456789abcdef0123456789abcdef', '\xabababababababababababababababababababababababababababababababab'::bytea, '\xabababababababababababababababababababababababababababababababab'::bytea, 201, '\x0001000c436f6e74656e742d54797065000000106170706c69636174696f6e2f6a736f6e'::bytea, '\x7b226964223a226b2d3132333435363738222c2272756e223a31323334357d7b226964223a226b2d3132333435363738222c2272756e223a31323334357d7b226964223a226b2d31323334353637383930227d'::bytea, false, statement_timestamp(), statement_timestamp(), statement_timestamp() + 86400000000 * interval '1 microsecond'
    WHERE statement_timestamp() < transaction_timestamp() + 10000000 * interval '1 microsecond'
    ON CONFLICT (key) DO UPDATE SET token = excluded.token, fingerprint = excluded.fingerprint, raw_digest = excluded.raw_digest,
        status = excluded.status, header = excluded.header, body = excluded.body, body_omitted = excluded.body_omitted,
        created_at = excluded.created_at, completed_at = excluded.completed_at, expires_at = excluded.expires_at
    WHERE t.expires_at <= statement_timestamp()
    RETURNING 1
)
SELECT CASE WHEN n = 1 THEN true
    ELSE ('idemkey: fenced (' || n || ' rows kept)')::boolean END
FROM (SELECT count(*) AS n FROM kept) k;
COMMIT;
\endpipeline
