-- A replay read first: one SELECT of the committed record, outside any
-- transaction.
\set id random(1, 100000)
SELECT t.token, t.fingerprint, t.created_at, t.expires_at, t.status, t.header, t.body, t.body_omitted, t.completed_at, t.raw_digest FROM idemkey_records t WHERE t.key = 'r' || :id AND t.expires_at > statement_timestamp();
