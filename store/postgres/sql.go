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
// The claim is the table's claim function (schema.sql), for both modes. It looks at the key's row
// on the statement's snapshot first: a live record is replayed and a live
// claim committed by a plain Claim is in flight, with no lock taken. When
// there is none, it tries two transaction-scoped advisory locks, in this
// order: the key's with the request's fingerprint ($6), then the key's
// ($5). Whoever holds the key's lock owns the key, and holds the first
// one too, for the rest of its transaction. So a request that finds the
// first lock taken is a repeat of a request that holds the key, or is
// about to (409), and one that gets the first but not the second finds
// the key held for another request (422): no row needs to be read, which
// matters because the owner's claim is not committed.
//
// In a request's transaction (ClaimTx) the locks and the uncommitted row
// are all the claim holds: they end with the transaction, on whatever
// server connection it ran, so nothing is left in a session, and an owner
// whose connection dies is replaced at once. A plain Claim is a statement
// of its own: its locks end with it and the committed row holds the key.
//
// The row the INSERT finds taken is the latest committed one, which the
// snapshot may not show (a claim racing a commit): then the statement
// returns no row and the store asks again (under REPEATABLE READ and
// SERIALIZABLE the INSERT fails with a serialization error instead, and
// the store begins again).
const (
	// completeSQL keeps a record in place of the claim held by $2. $1 key,
	// $3 fingerprint, $4 status, $5 header, $6 body, $7 body omitted, $8
	// created at, $9 completed at, $10 retention (µs), $11 raw digest (NULL
	// for none). It answers 1 when
	// it kept the record; 2 when the key already holds a record kept
	// under $2 (a resent Complete); 0 when $2 does not hold the key; and 3
	// when the row was in flight under $2 on the statement's snapshot but
	// changed before the UPDATE reached it (a racing Complete or Release):
	// then the store asks again.
	completeSQL = `WITH kept AS (
    UPDATE T
    SET fingerprint = $3, status = $4, header = $5, body = $6, body_omitted = $7,
        created_at = $8, completed_at = $9, raw_digest = $11,
        expires_at = statement_timestamp() + $10 * interval '1 microsecond'
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

	// keepTxSQL keeps the record inside the request's transaction, with
	// completeSQL's parameters and $12 the claim's life (µs): fenced by
	// the owner's token and by that life, so that a commit that comes
	// after the claim's life (its owner stalled past the route's deadline)
	// never lands. When it keeps nothing it raises an error (a text that
	// is not a boolean, SQLSTATE 22P02, which names the cause in the
	// server's log), so that the COMMIT pipelined after it finds the
	// transaction aborted and rolls it back: the handler's writes and the
	// record commit together or not at all, in one round trip.
	//
	// The claim's row was inserted with a life that outlasts the
	// retention (holdLife plus the claim's life), so expires_at stays as
	// it is unless the retention asks for longer: the UPDATE then changes
	// no indexed column and can be a heap-only update, which writes no
	// index entries.
	keepTxSQL = `WITH kept AS (
    UPDATE T
    SET fingerprint = $3, status = $4, header = $5, body = $6, body_omitted = $7,
        created_at = $8, completed_at = $9, raw_digest = $11,
        expires_at = greatest(expires_at, statement_timestamp() + $10 * interval '1 microsecond')
    WHERE key = $1 AND token = $2 AND status IS NULL
      AND created_at + $12 * interval '1 microsecond' > statement_timestamp()
    RETURNING 1
)
SELECT CASE WHEN n = 1 THEN true
    ELSE ('idemkey: the claim is no longer this request''s, or its life is over; rolling back (' || n || ' rows kept)')::boolean END
FROM (SELECT count(*) AS n FROM kept) k`

	// keepAloneSQL keeps the record of a 4xx whose writes are undone, in
	// a statement of its own after the request's transaction rolled back
	// (its claim with it): completeSQL's parameters, $12 the key's lock,
	// $13 when the claim was made (the database's clock), $14 its life
	// (µs) and $15 the lock of the key with the request's fingerprint. It
	// is fenced as the claim it stands for: it takes the key's lock, so
	// that it writes nothing while a transaction holds the key (a request
	// that took it once the rollback let it go wins); it writes only where
	// no live row is (a plain claim or a record that came meanwhile wins);
	// and only within the claim's life. It takes the fingerprint's lock
	// first, as the claim does, shared (a waiter's Wait holds it so too):
	// a repeat of the request that claims meanwhile then finds it taken
	// and answers in flight, where with the key's lock alone it would get
	// the fingerprint's lock but not the key's, which reads as the key
	// held for another request (422); and a repeat that holds it first
	// goes on to claim the key, and the keep writes nothing. It answers
	// how many rows it kept: 1, or 0 when fenced.
	keepAloneSQL = `WITH lock AS MATERIALIZED (
    SELECT CASE WHEN pg_try_advisory_xact_lock_shared($15::bigint)
        THEN pg_try_advisory_xact_lock($12::bigint) ELSE false END AS got
), kept AS (
    INSERT INTO T AS r (key, token, fingerprint, raw_digest, status, header, body, body_omitted,
        created_at, completed_at, expires_at)
    SELECT $1, $2, $3, $11, $4, $5, $6, $7, $8, $9, statement_timestamp() + $10 * interval '1 microsecond'
    FROM lock WHERE lock.got AND statement_timestamp() < $13::timestamptz + $14 * interval '1 microsecond'
    ON CONFLICT (key) DO UPDATE
    SET token = excluded.token, fingerprint = excluded.fingerprint, raw_digest = excluded.raw_digest,
        status = excluded.status, header = excluded.header, body = excluded.body,
        body_omitted = excluded.body_omitted, created_at = excluded.created_at,
        completed_at = excluded.completed_at, expires_at = excluded.expires_at
    WHERE r.expires_at <= statement_timestamp()
    RETURNING 1
)
SELECT count(*) FROM kept`

	// waitSQL waits up to $2 milliseconds (text) for the lock $1 to be
	// free, and lets go of it at once: it wakes the moment the transaction
	// that holds it commits or rolls back. It answers false, without
	// waiting, when the lock is free already (no transaction holds it),
	// and true once it was held and is free; it fails with
	// lock_not_available (55P03) when the time is up.
	waitSQL = `SELECT CASE WHEN pg_try_advisory_xact_lock_shared($1::bigint) THEN false
    WHEN set_config('lock_timeout', $2, true) IS NOT NULL THEN pg_advisory_xact_lock_shared($1::bigint) IS NOT NULL
    END`

	// heldSQL reports whether the claim held by $2 is committed and in
	// flight: after the handler ended the request's transaction itself,
	// whether its writes (and the claim with them) committed.
	heldSQL = `SELECT EXISTS (SELECT FROM T WHERE key = $1 AND token = $2 AND status IS NULL)`

	// sweepSQL deletes up to $1 lapsed rows, oldest first, skipping rows
	// that another statement has locked (a takeover, another sweeper).
	sweepSQL = `DELETE FROM T WHERE key IN (
    SELECT key FROM T WHERE expires_at <= statement_timestamp()
    ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
) AND expires_at <= statement_timestamp()`
)

// statements are the SQL texts for one table.
type statements struct {
	// claimCall calls the table's claim function (schema.sql), which does
	// what claim does with statements PostgreSQL keeps planned.
	claimCall string

	complete, release, extend, keepTx, keepAlone, held, sweep string
	inspect, delete, stats                                    string
}

// tableWord is the table's placeholder in the statements: T, as a word of
// its own (no keyword the statements use is a lone T).
var tableWord = regexp.MustCompile(`\bT\b`)

func newStatements(table pgx.Identifier) statements {
	name := table.Sanitize()
	f := func(sql string) string { return tableWord.ReplaceAllLiteralString(sql, name) }
	return statements{
		claimCall: "SELECT r_kind, r_token, r_fingerprint, r_created_at, r_remaining, r_status, r_header, r_body, r_body_omitted, r_completed_at, r_same, r_raw_digest FROM " +
			claimFunc(table).Sanitize() + "($1, $2, $3, $4, $5, $6, $7)",
		complete:  f(completeSQL),
		release:   f(releaseSQL),
		extend:    f(extendSQL),
		keepTx:    f(keepTxSQL),
		keepAlone: f(keepAloneSQL),
		held:      f(heldSQL),
		sweep:     f(sweepSQL),
		inspect:   f(inspectSQL),
		delete:    f(deleteSQL),
		stats:     f(statsSQL),
	}
}
