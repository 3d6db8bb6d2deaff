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
    -- A digest of the kept response's request as its bytes were sent
    -- (store.Record.RawDigest); NULL when it was kept without one.
    raw_digest   bytea,
    -- When the key was claimed, on the database's clock; once the response
    -- is kept, the record's CreatedAt as the middleware gave it.
    created_at   timestamptz NOT NULL,
    -- When the claim lapses, or the kept response's retention ends, on the
    -- database's clock. A row past it is gone as far as the store is
    -- concerned; the sweeper deletes it.
    expires_at   timestamptz NOT NULL,
    -- The kept response; all NULL while the key is in flight.
    status       smallint,
    header       bytea,
    body         bytea,
    body_omitted boolean,
    completed_at timestamptz
);

-- A table made by an earlier version is brought up to date in place: the
-- column raw_digest added, the unused lock_id dropped, and a claim function
-- that does not return raw_digest dropped to be made again below. Each
-- change is made only when it is needed, so that applying this file to a
-- table that is up to date takes no lock stronger than a read's.
DO $up$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass('idemkey_records')
                   AND attname = 'raw_digest' AND NOT attisdropped) THEN
        ALTER TABLE idemkey_records ADD COLUMN raw_digest bytea;
    END IF;
    IF EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass('idemkey_records')
               AND attname = 'lock_id' AND NOT attisdropped) THEN
        ALTER TABLE idemkey_records DROP COLUMN lock_id;
    END IF;
    IF EXISTS (SELECT FROM pg_proc WHERE oid = to_regprocedure('idemkey_records_claim(text, text, bytea, bigint, bigint, bigint, text)')
               AND NOT 'r_raw_digest' = ANY (proargnames)) THEN
        DROP FUNCTION idemkey_records_claim(text, text, bytea, bigint, bigint, bigint, text);
    END IF;
END
$up$;

-- The sweeper deletes expired rows oldest first, in small batches.
CREATE INDEX IF NOT EXISTS idemkey_records_expires_at ON idemkey_records (expires_at);

-- The claim, as the store makes it: one call, whose statements PostgreSQL
-- plans once per server session and keeps (the same claim as one inline
-- statement costs about half a millisecond of planning on every call where
-- statements are not kept prepared, as behind a transaction-mode pooler).
-- It answers one row: r_kind 1 when it claimed the key, 2 when a live row
-- holds it (a kept record, or a claim committed in flight), 3 when a
-- transaction holds it (r_same: for this request); no row when the key
-- changed under it (ask again). r_created_at is, for kind 1, when the
-- claim was made, on the database's clock: where the claim's life starts.
-- p_life is the row's life and p_timeout the claim's life in milliseconds,
-- the statement and idle timeouts of the rest of the transaction. It is
-- the one place the claim is written: New refuses a table without it. It
-- opens no subtransaction (no EXCEPTION block).
CREATE OR REPLACE FUNCTION idemkey_records_claim(p_key text, p_token text, p_fp bytea, p_life bigint,
        p_lock bigint, p_lock_fp bigint, p_timeout text)
    RETURNS TABLE (r_kind smallint, r_token text, r_fingerprint bytea, r_created_at timestamptz,
        r_remaining bigint, r_status smallint, r_header bytea, r_body bytea, r_body_omitted boolean,
        r_completed_at timestamptz, r_same boolean, r_raw_digest bytea)
    LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    cur record;
    other_request boolean;
BEGIN
    SELECT t.token, t.fingerprint, t.created_at, t.expires_at, t.status, t.header, t.body, t.body_omitted,
           t.completed_at, t.raw_digest
      INTO cur FROM idemkey_records t WHERE t.key = p_key AND t.expires_at > statement_timestamp();
    IF FOUND THEN
        RETURN QUERY SELECT 2::smallint, cur.token, cur.fingerprint, cur.created_at,
            (extract(epoch FROM cur.expires_at - greatest(statement_timestamp(), cur.created_at)) * 1000000)::bigint,
            cur.status, cur.header, cur.body, cur.body_omitted, cur.completed_at, NULL::boolean, cur.raw_digest;
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
            expires_at = excluded.expires_at, raw_digest = NULL, status = NULL, header = NULL, body = NULL,
            body_omitted = NULL, completed_at = NULL
        WHERE t.expires_at <= statement_timestamp();
        IF FOUND THEN
            PERFORM set_config('statement_timeout', p_timeout, true),
                    set_config('idle_in_transaction_session_timeout', p_timeout, true);
            RETURN QUERY SELECT 1::smallint, NULL::text, NULL::bytea, statement_timestamp(), NULL::bigint,
                NULL::smallint, NULL::bytea, NULL::bytea, NULL::boolean, NULL::timestamptz, NULL::boolean, NULL::bytea;
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
        NULL::bigint, NULL::smallint, NULL::bytea, NULL::bytea, NULL::boolean, NULL::timestamptz, NOT other_request,
        NULL::bytea;
END
$fn$;
