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

-- The claim, as the store makes it: one call, whose statements PostgreSQL
-- plans once per server session and keeps (the same claim as one inline
-- statement costs about half a millisecond of planning on every call where
-- statements are not kept prepared, as behind a transaction-mode pooler).
-- It answers one row: r_kind 1 when it claimed the key, 2 when a live row
-- holds it (a kept record, or a claim committed in flight), 3 when a
-- transaction holds it (r_same: for this request); no row when the key
-- changed under it (ask again). p_life is the row's life and p_timeout the
-- claim's life in milliseconds, the statement and idle timeouts of the
-- rest of the transaction. The store falls back to an inline statement
-- while the function is missing.
CREATE OR REPLACE FUNCTION idemkey_records_claim(p_key text, p_token text, p_fp bytea, p_life bigint,
        p_lock bigint, p_lock_fp bigint, p_timeout text)
    RETURNS TABLE (r_kind smallint, r_token text, r_fingerprint bytea, r_created_at timestamptz,
        r_remaining bigint, r_status smallint, r_header bytea, r_body bytea, r_body_omitted boolean,
        r_completed_at timestamptz, r_same boolean)
    LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    cur record;
    other_request boolean;
BEGIN
    SELECT t.token, t.fingerprint, t.created_at, t.expires_at, t.status, t.header, t.body, t.body_omitted,
           t.completed_at
      INTO cur FROM idemkey_records t WHERE t.key = p_key AND t.expires_at > statement_timestamp();
    IF FOUND THEN
        RETURN QUERY SELECT 2::smallint, cur.token, cur.fingerprint, cur.created_at,
            (extract(epoch FROM cur.expires_at - greatest(statement_timestamp(), cur.created_at)) * 1000000)::bigint,
            cur.status, cur.header, cur.body, cur.body_omitted, cur.completed_at, NULL::boolean;
        RETURN;
    END IF;
    IF NOT pg_try_advisory_xact_lock(p_lock_fp) THEN
        other_request := false;
    ELSIF NOT pg_try_advisory_xact_lock(p_lock) THEN
        other_request := true;
    ELSE
        INSERT INTO idemkey_records AS t (key, token, fingerprint, created_at, expires_at)
        VALUES (p_key, p_token, p_fp, statement_timestamp(), statement_timestamp() + p_life * interval '1 microsecond')
        ON CONFLICT (key) DO UPDATE
        SET token = excluded.token, fingerprint = excluded.fingerprint, created_at = excluded.created_at,
            expires_at = excluded.expires_at, lock_id = NULL, status = NULL, header = NULL, body = NULL,
            body_omitted = NULL, completed_at = NULL
        WHERE t.expires_at <= statement_timestamp();
        IF FOUND THEN
            PERFORM set_config('statement_timeout', p_timeout, true),
                    set_config('idle_in_transaction_session_timeout', p_timeout, true);
            RETURN QUERY SELECT 1::smallint, NULL::text, NULL::bytea, NULL::timestamptz, NULL::bigint,
                NULL::smallint, NULL::bytea, NULL::bytea, NULL::boolean, NULL::timestamptz, NULL::boolean;
        END IF;
        RETURN;
    END IF;
    RETURN QUERY SELECT 3::smallint, NULL::text, NULL::bytea,
        (SELECT a.xact_start FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
          WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode = 'ExclusiveLock'
            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND l.classid = ((p_lock >> 32) & 4294967295)::oid AND l.objid = (p_lock & 4294967295)::oid
            AND l.pid <> pg_backend_pid()
          LIMIT 1),
        NULL::bigint, NULL::smallint, NULL::bytea, NULL::bytea, NULL::boolean, NULL::timestamptz, NOT other_request;
END
$fn$;
