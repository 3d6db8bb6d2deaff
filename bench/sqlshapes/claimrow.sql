-- The store as it is: BEGIN with the claim function (it reads the committed
-- record, takes the two locks, and writes the claim's row), the handler's
-- INSERT, the fenced UPDATE that keeps the record pipelined with COMMIT.
\set id random(1, 9000000000000)
\startpipeline
BEGIN;
SELECT r_kind, r_token, r_fingerprint, r_created_at, r_remaining, r_status, r_header, r_body, r_body_omitted, r_completed_at, r_same, r_raw_digest FROM idemkey_records_claim('k' || :id, 'tok-0123456789abcdef0123456789abcdef', '\xabababababababababababababababababababababababababababababababab'::bytea, 86410000000, :id::bigint, :id::bigint + 1, '10000');
\endpipeline
INSERT INTO bench_payments (key, run, bytes) VALUES ('k' || :id, :id, 1024);
\startpipeline
WITH kept AS (
    UPDATE idemkey_records
    SET fingerprint = '\xabababababababababababababababababababababababababababababababab'::bytea, status = 201, header = '\x0001000c436f6e74656e742d54797065000000106170706c69636174696f6e2f6a736f6e'::bytea, body = '\x7b226964223a226b2d3132333435363738222c2272756e223a31323334357d7b226964223a226b2d3132333435363738222c2272756e223a31323334357d7b226964223a226b2d31323334353637383930227d'::bytea, body_omitted = false,
        created_at = statement_timestamp(), completed_at = statement_timestamp(), raw_digest = '\xabababababababababababababababababababababababababababababababab'::bytea,
        expires_at = greatest(expires_at, statement_timestamp() + 86400000000 * interval '1 microsecond')
    WHERE key = 'k' || :id AND token = 'tok-0123456789abcdef0123456789abcdef' AND status IS NULL
      AND created_at + 10000000 * interval '1 microsecond' > statement_timestamp()
    RETURNING 1
)
SELECT CASE WHEN n = 1 THEN true
    ELSE ('idemkey: fenced (' || n || ' rows kept)')::boolean END
FROM (SELECT count(*) AS n FROM kept) k;
COMMIT;
\endpipeline
