-- The store's replay as it is: BEGIN with the claim function, which finds
-- the record; ROLLBACK after.
\set id random(1, 100000)
\startpipeline
BEGIN;
SELECT r_kind, r_token, r_fingerprint, r_created_at, r_remaining, r_status, r_header, r_body, r_body_omitted, r_completed_at, r_same, r_raw_digest FROM idemkey_records_claim('r' || :id, 'tok-0123456789abcdef0123456789abcdef', '\xabababababababababababababababababababababababababababababababab'::bytea, 86410000000, :id, :id + 1, '10000');
\endpipeline
ROLLBACK;
