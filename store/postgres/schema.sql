-- The table of idemkey's PostgreSQL store (package store/postgres): one row
-- per idempotency key, a claim while its first request runs, then the
-- response kept for the retention window. Apply it with your migration tool,
-- or call postgres.Migrate. For another table name, postgres.Schema returns
-- this file with that name.
CREATE TABLE IF NOT EXISTS idemkey_records (
    -- The store key, "idem:v1:{<64 hex>}" (store.KeyName): a digest of the
    -- caller's scope and key, never the raw key. Compared byte by byte.
    key          text COLLATE "C" PRIMARY KEY,
    -- The owner token of the request that claimed the key.
    token        text        NOT NULL,
    -- The SHA-256 fingerprint of that request, or of the kept response's.
    fingerprint  bytea       NOT NULL,
    -- When the key was claimed, on the database's clock; once the response
    -- is kept, the record's CreatedAt as the middleware gave it.
    created_at   timestamptz NOT NULL,
    -- When the claim lapses, or the kept response's retention ends, on the
    -- database's clock. A row past it is gone as far as the store is
    -- concerned; the sweeper deletes it.
    expires_at   timestamptz NOT NULL,
    -- A claim made for a transactional request: the session advisory lock
    -- its owner holds until it commits or rolls back. NULL otherwise.
    lock_id      bigint,
    -- The kept response; all NULL while the key is in flight.
    status       smallint,
    header       bytea,
    body         bytea,
    body_omitted boolean,
    completed_at timestamptz
);

-- The sweeper deletes expired rows oldest first, in small batches.
CREATE INDEX IF NOT EXISTS idemkey_records_expires_at ON idemkey_records (expires_at);
