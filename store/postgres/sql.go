package postgres

import (
	"regexp"

	"github.com/jackc/pgx/v5"
)

// The statements, written once for the table named T. Times come from the
// database's clock (statement_timestamp(): the same value everywhere in a
// statement), so instances whose clocks disagree still agree on when a
// claim lapses. Lives are passed in microseconds. A row whose expires_at is
// past is gone as far as every statement is concerned, whether or not the
// sweeper has deleted it yet.
//
// Claim answers in one statement: an INSERT that does nothing when the key
// is taken, and a SELECT of the row that took it. Both run on the
// statement's snapshot, so when another transaction inserts the key and
// commits after the snapshot was taken (two claims racing), the INSERT
// waits for it and does nothing, and the SELECT cannot see its row: the
// statement returns no row, and the store runs it again.
const (
	// claimSQL: $1 key, $2 token, $3 fingerprint, $4 life (µs).
	// Columns: inserted, token, fingerprint, created_at, remaining (µs),
	// lock_id, status, header, body, body_omitted, completed_at, and a
	// boolean that is NULL here (see claimTxSQL).
	claimSQL = `WITH ins AS (
    INSERT INTO T AS r (key, token, fingerprint, created_at, expires_at)
    VALUES ($1, $2, $3, statement_timestamp(), statement_timestamp() + $4 * interval '1 microsecond')
    ON CONFLICT (key) DO NOTHING
    RETURNING NULL::boolean AS locked
)
SELECT true, NULL::text, NULL::bytea, NULL::timestamptz, NULL::bigint, NULL::bigint,
       NULL::smallint, NULL::bytea, NULL::bytea, NULL::boolean, NULL::timestamptz, locked
FROM ins
UNION ALL
SELECT false, r.token, r.fingerprint, r.created_at,
       (extract(epoch FROM r.expires_at - statement_timestamp()) * 1000000)::bigint, r.lock_id,
       r.status, r.header, r.body, r.body_omitted, r.completed_at, NULL::boolean
FROM T r WHERE r.key = $1`

	// claimTxSQL is claimSQL for a transactional request, on the
	// connection its transaction will run on. $5 is a fresh lock id.
	//
	// An inserted row records $5 and the statement takes the session
	// advisory lock on it in RETURNING: before the statement commits, so
	// no one ever sees the row while its lock is free and its owner alive.
	// The last column is then whether the lock was taken (false only when
	// someone else holds that id already).
	//
	// The claim then commits without waiting for its WAL to reach the disk
	// (synchronous_commit off, for this statement's transaction alone): a
	// transactional claim need not survive a crash of the server, because
	// its owner's transaction cannot. The owner's COMMIT (of its writes and
	// the record), which waits as the server is set to, flushes the WAL up
	// to it, the claim's included; a crash before that takes the claim and
	// the owner's session, with its uncommitted writes, together, and the
	// retry claims the key afresh. This saves each first run a disk flush.
	//
	// A row in flight with a lock id is probed: the lock is tried without
	// waiting and, when it is free, released at once. The last column is
	// then true when the owner's session is gone (it held the lock until it
	// committed or rolled back), and its transaction with it.
	claimTxSQL = `WITH ins AS (
    INSERT INTO T AS r (key, token, fingerprint, created_at, expires_at, lock_id)
    VALUES ($1, $2, $3, statement_timestamp(), statement_timestamp() + $4 * interval '1 microsecond', $5)
    ON CONFLICT (key) DO NOTHING
    RETURNING CASE WHEN pg_try_advisory_lock(r.lock_id)
                   THEN set_config('synchronous_commit', 'off', true) = 'off'
                   ELSE false END AS locked
)
SELECT true, NULL::text, NULL::bytea, NULL::timestamptz, NULL::bigint, NULL::bigint,
       NULL::smallint, NULL::bytea, NULL::bytea, NULL::boolean, NULL::timestamptz, locked
FROM ins
UNION ALL
SELECT false, r.token, r.fingerprint, r.created_at,
       (extract(epoch FROM r.expires_at - statement_timestamp()) * 1000000)::bigint, r.lock_id,
       r.status, r.header, r.body, r.body_omitted, r.completed_at,
       CASE WHEN r.status IS NULL AND r.lock_id IS NOT NULL AND r.expires_at > statement_timestamp()
            THEN CASE WHEN pg_try_advisory_lock(r.lock_id) THEN pg_advisory_unlock(r.lock_id) ELSE false END
       END
FROM T r WHERE r.key = $1`

	// takeoverSQL claims a key whose row lapsed, or whose owner's session
	// is gone ($7), for a new owner, fenced by the old owner's token ($6):
	// of two requests taking over one row, the second finds a token it
	// does not expect and changes nothing. $1 key, $2 token, $3
	// fingerprint, $4 life (µs), $5 lock id or NULL. Returns whether the
	// lock on $5 was taken (NULL without one).
	takeoverSQL = `UPDATE T AS r
SET token = $2, fingerprint = $3, created_at = statement_timestamp(),
    expires_at = statement_timestamp() + $4 * interval '1 microsecond', lock_id = $5,
    status = NULL, header = NULL, body = NULL, body_omitted = NULL, completed_at = NULL
WHERE r.key = $1 AND r.token = $6
  AND (r.expires_at <= statement_timestamp() OR (r.status IS NULL AND $7::boolean))
RETURNING CASE WHEN r.lock_id IS NOT NULL THEN pg_try_advisory_lock(r.lock_id) END`

	// completeSQL keeps a record in place of the claim held by $2. $1 key,
	// $3 fingerprint, $4 status, $5 header, $6 body, $7 body omitted, $8
	// created at, $9 completed at, $10 retention (µs). It answers 1 when
	// it kept the record; 2 when the key already holds a record kept
	// under $2 (a resent Complete); 0 when $2 does not hold the key; and 3
	// when the row was in flight under $2 on the statement's snapshot but
	// changed before the UPDATE reached it (a racing Complete or Release):
	// then the store asks again.
	completeSQL = `WITH kept AS (
    UPDATE T
    SET fingerprint = $3, status = $4, header = $5, body = $6, body_omitted = $7,
        created_at = $8, completed_at = $9,
        expires_at = statement_timestamp() + $10 * interval '1 microsecond', lock_id = NULL
    WHERE key = $1 AND token = $2 AND status IS NULL AND expires_at > statement_timestamp()
    RETURNING 1
)
SELECT CASE
    WHEN EXISTS (SELECT FROM kept) THEN 1
    ELSE coalesce((SELECT CASE
            WHEN r.token <> $2 OR r.expires_at <= statement_timestamp() THEN 0
            WHEN r.status IS NOT NULL THEN 2
            ELSE 3 END
        FROM T r WHERE r.key = $1), 0)
END`

	// releaseSQL deletes the claim held by $2. It answers 1 when it
	// deleted it or the key holds nothing (or only a lapsed row); 0 when
	// another token or a record holds the key; and 3 when the row was in
	// flight under $2 on the statement's snapshot but changed before the
	// DELETE reached it: then the store asks again.
	releaseSQL = `WITH gone AS (
    DELETE FROM T WHERE key = $1 AND token = $2 AND status IS NULL
    RETURNING 1
)
SELECT CASE
    WHEN EXISTS (SELECT FROM gone) THEN 1
    ELSE coalesce((SELECT CASE
            WHEN r.expires_at <= statement_timestamp() THEN 1
            WHEN r.token = $2 AND r.status IS NULL THEN 3
            ELSE 0 END
        FROM T r WHERE r.key = $1), 1)
END`

	// extendSQL sets the remaining life of the live claim held by $2 to
	// $3 µs.
	extendSQL = `UPDATE T SET expires_at = statement_timestamp() + $3 * interval '1 microsecond'
WHERE key = $1 AND token = $2 AND status IS NULL AND expires_at > statement_timestamp()`

	// keepTxSQL keeps the record inside the request's transaction, fenced
	// by the owner's token, with completeSQL's parameters. When the token
	// no longer holds the key it raises an error (a text that is not a
	// boolean, SQLSTATE 22P02, which names the cause in the server's log),
	// so that the COMMIT pipelined after it finds the transaction aborted
	// and rolls it back: the handler's writes and the record commit
	// together or not at all, in one round trip. A claim past its life
	// that nobody has taken over still commits: the row lock orders this
	// UPDATE against any takeover, and the one that comes second finds
	// the token it fences on gone.
	//
	// When it kept the record it releases the claim's advisory lock ($11)
	// and answers whether it held it, before the COMMIT that follows. From
	// here to the COMMIT the row lock of the UPDATE stands in for it: a
	// request that finds the advisory lock free in that moment and tries
	// to take the key over waits for the row, then finds the record. If
	// the COMMIT fails, the transaction is gone and the key free to take
	// over, which is what the lock says.
	keepTxSQL = `WITH kept AS (
    UPDATE T
    SET fingerprint = $3, status = $4, header = $5, body = $6, body_omitted = $7,
        created_at = $8, completed_at = $9,
        expires_at = statement_timestamp() + $10 * interval '1 microsecond', lock_id = NULL
    WHERE key = $1 AND token = $2 AND status IS NULL
    RETURNING 1
)
SELECT CASE WHEN n = 1 THEN pg_advisory_unlock($11)
    ELSE ('idemkey: the claim is no longer this request''s; rolling back (' || n || ' rows kept)')::boolean END
FROM (SELECT count(*) AS n FROM kept) k`

	// releaseTxSQL deletes the claim held by $2, after the request's
	// transaction rolled back.
	releaseTxSQL = `DELETE FROM T WHERE key = $1 AND token = $2 AND status IS NULL`

	// holdTxSQL keeps the claim held by $2 in flight for $3 µs more, and
	// no longer under an advisory lock (so that no one takes it over when
	// its owner's session ends): for a request whose transaction the
	// handler ended itself, whose writes may be committed.
	holdTxSQL = `UPDATE T SET lock_id = NULL,
    expires_at = greatest(expires_at, statement_timestamp() + $3 * interval '1 microsecond')
WHERE key = $1 AND token = $2 AND status IS NULL`

	// sweepSQL deletes up to $1 lapsed rows, oldest first, skipping rows
	// that another statement has locked (a takeover, another sweeper).
	sweepSQL = `DELETE FROM T WHERE key IN (
    SELECT key FROM T WHERE expires_at <= statement_timestamp()
    ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
) AND expires_at <= statement_timestamp()`

	unlockSQL = `SELECT pg_advisory_unlock($1)`
)

// statements are the SQL texts for one table.
type statements struct {
	claim, claimTx, takeover, complete, release, extend string
	keepTx, releaseTx, holdTx, sweep                    string
	inspect, delete, stats                              string
}

// tableWord is the table's placeholder in the statements: T, as a word of
// its own (no keyword the statements use is a lone T).
var tableWord = regexp.MustCompile(`\bT\b`)

func newStatements(table pgx.Identifier) statements {
	name := table.Sanitize()
	f := func(sql string) string { return tableWord.ReplaceAllLiteralString(sql, name) }
	return statements{
		claim:     f(claimSQL),
		claimTx:   f(claimTxSQL),
		takeover:  f(takeoverSQL),
		complete:  f(completeSQL),
		release:   f(releaseSQL),
		extend:    f(extendSQL),
		keepTx:    f(keepTxSQL),
		releaseTx: f(releaseTxSQL),
		holdTx:    f(holdTxSQL),
		sweep:     f(sweepSQL),
		inspect:   f(inspectSQL),
		delete:    f(deleteSQL),
		stats:     f(statsSQL),
	}
}
