-- The table of idemkey's MySQL and MariaDB store (package store/mysql): one
-- row per idempotency key, a claim while its first request runs, then the
-- response kept for the retention window. Apply it with your migration tool,
-- or call mysql.Migrate. For another table name, mysql.Schema returns this
-- statement with that name.
CREATE TABLE IF NOT EXISTS idemkey_records (
    -- The store key, "idem:v1:{<64 hex>}" (store.KeyName): a digest of the
    -- caller's scope and key, never the raw key. Compared byte by byte.
    k            VARBINARY(100) NOT NULL,
    -- The owner token of the request that claimed the key.
    token        VARBINARY(128) NOT NULL,
    -- The SHA-256 fingerprint of that request, or of the kept response's.
    fingerprint  BINARY(32)     NOT NULL,
    -- A SHA-256 digest of that request's bytes as they were sent, kept
    -- with the response (NULL while in flight, and when there is none).
    raw_digest   BINARY(32)     NULL,
    -- When the key was claimed, in microseconds since the Unix epoch on
    -- the server's clock; once the response is kept, the record's
    -- CreatedAt as the middleware gave it.
    created_us   BIGINT         NOT NULL,
    -- When the claim lapses, or the kept response's retention ends, on the
    -- server's clock. A row past it is gone as far as the store is
    -- concerned; the sweeper deletes it.
    expires_us   BIGINT         NOT NULL,
    -- The kept response; all NULL while the key is in flight.
    status       SMALLINT       NULL,
    header       MEDIUMBLOB     NULL,
    body         LONGBLOB       NULL,
    body_omitted BOOLEAN        NULL,
    completed_us BIGINT         NULL,
    PRIMARY KEY (k),
    -- The sweeper deletes expired rows oldest first, in small batches.
    INDEX idemkey_records_expires_us (expires_us)
) ENGINE = InnoDB
