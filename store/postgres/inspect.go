package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkey/idemkey/store"
)

// Row is a row of the table decoded for operators' tools (cmd/idemctl): a
// claim of a request in flight, or a kept record.
type Row struct {
	// State is store.InFlight for a claim and store.Completed for a record.
	State store.State
	// Fingerprint is the fingerprint of the request that claimed the key
	// or produced the record.
	Fingerprint [32]byte
	// CreatedAt is when the key was claimed.
	CreatedAt time.Time
	// ExpiresAt is when the claim lapses or the record's retention ends,
	// on the database's clock; TTL is the time left then, which is not
	// positive for a row whose life is over and that the sweeper has not
	// deleted yet (the store treats it as gone).
	ExpiresAt time.Time
	TTL       time.Duration
	// Record is the kept response when State is store.Completed.
	Record *store.Record
	// Transactional reports a claim in flight held by a request's
	// transaction (ClaimTx). Such a claim is not committed: only that it
	// is held, and since when, can be seen (Fingerprint and TTL are zero),
	// and Delete cannot free it (end the transaction instead: its
	// backend's pg_terminate_backend). OwnerGone reports, for a claim
	// committed by an earlier version of this package with a session
	// lock, that the lock is free: its owner is gone, and the key is
	// taken over when the claim's life ends.
	Transactional, OwnerGone bool
	// Size is the row's size in the table, in bytes (pg_column_size: after
	// compression, without the index entries).
	Size int

	token string // for Delete: the row it was read from
}

// inspectSQL reads a key's row, and probes the owner of a transactional
// claim in flight as a claim would.
const inspectSQL = `SELECT r.token, r.fingerprint, r.created_at, r.expires_at,
       (extract(epoch FROM r.expires_at - statement_timestamp()) * 1000000)::bigint,
       r.lock_id, r.status, r.header, r.body, r.body_omitted, r.completed_at, pg_column_size(r.*),
       CASE WHEN r.status IS NULL AND r.lock_id IS NOT NULL
            THEN CASE WHEN pg_try_advisory_lock(r.lock_id) THEN pg_advisory_unlock(r.lock_id) ELSE false END
       END
FROM T r WHERE r.key = $1`

// Inspect returns what key holds, and whether it holds anything (a row
// whose life is over but that is not swept yet is returned, with a TTL that
// is not positive). It returns an error wrapping ErrUnreadable for a
// record this version cannot read, with what could be read of the row.
// The owner token is not reported.
func (s *Store) Inspect(ctx context.Context, key string) (Row, bool, error) {
	var (
		rw          Row
		fp, header  []byte
		body        []byte
		remaining   int64
		lockID      *int64
		status      *int16
		omitted     *bool
		completedAt *time.Time
		gone        *bool
	)
	err := s.pool.QueryRow(ctx, s.sql.inspect, key).Scan(&rw.token, &fp, &rw.CreatedAt, &rw.ExpiresAt, &remaining,
		&lockID, &status, &header, &body, &omitted, &completedAt, &rw.Size, &gone)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && remaining <= 0) {
		// No live row: the key may still be held by a request's
		// transaction, whose claim is not committed.
		if held, ok, herr := s.heldByTx(ctx, key); herr != nil || ok {
			return held, ok, herr
		}
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, false, nil
	}
	if err != nil {
		return Row{}, false, fmt.Errorf("idemkey: postgres: inspect: %w", err)
	}
	copy(rw.Fingerprint[:], fp)
	rw.TTL = time.Duration(remaining) * time.Microsecond
	rw.Transactional = lockID != nil
	if status == nil {
		rw.State = store.InFlight
		rw.OwnerGone = gone != nil && *gone
		return rw, true, nil
	}
	rw.State = store.Completed
	rec := &store.Record{Status: int(*status), Body: body, BodyOmitted: omitted != nil && *omitted,
		Fingerprint: rw.Fingerprint, CreatedAt: rw.CreatedAt}
	if completedAt != nil {
		rec.CompletedAt = *completedAt
	}
	rw.Record = rec
	if rec.Header, err = decodeHeader(header); err != nil {
		return rw, true, err
	}
	return rw, true, nil
}

// heldBySQL finds the transaction that holds a key's lock ($1), and when
// it began.
const heldBySQL = `SELECT a.xact_start FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode = 'ExclusiveLock'
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = (($1::bigint >> 32) & 4294967295)::oid AND l.objid = ($1::bigint & 4294967295)::oid
LIMIT 1`

// heldByTx reports a key held by a request's transaction: in flight, with
// a claim that is not committed (so neither its fingerprint nor its life
// can be read; CreatedAt is when the transaction began, when the server
// shows it).
func (s *Store) heldByTx(ctx context.Context, key string) (Row, bool, error) {
	l1, _ := s.locks(key, [32]byte{})
	var began *time.Time
	err := s.pool.QueryRow(ctx, heldBySQL, l1).Scan(&began)
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, false, nil
	}
	if err != nil {
		return Row{}, false, fmt.Errorf("idemkey: postgres: inspect: %w", err)
	}
	rw := Row{State: store.InFlight, Transactional: true}
	if began != nil {
		rw.CreatedAt = *began
	}
	return rw, true, nil
}

// Delete deletes key's row only while it is still the row seen was read
// from (by Inspect: the same owner, state and expiry), so that an operator
// deletes what they were shown. It reports whether it deleted it.
//
// Once a record is deleted, a retry with its key runs the handler again;
// once a claim in flight is deleted, a retry runs the handler while the
// first request may still be running.
func (s *Store) Delete(ctx context.Context, key string, seen Row) (bool, error) {
	tag, err := s.pool.Exec(ctx, s.sql.delete, key, seen.token, seen.ExpiresAt, seen.State == store.Completed)
	if err != nil {
		return false, fmt.Errorf("idemkey: postgres: delete: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

const deleteSQL = `DELETE FROM T WHERE key = $1 AND token = $2 AND expires_at = $3 AND (status IS NOT NULL) = $4`

// TableStats describes the store's table, for operators' tools.
type TableStats struct {
	// Rows counts the table's rows: Records kept, claims InFlight, and
	// Expired rows of either kind whose life is over and that the sweeper
	// has not deleted yet (counted in neither Records nor InFlight).
	Rows, Records, InFlight, Expired int64
	// Transactional counts the claims in flight committed by an earlier
	// version of this package for a transactional request. A claim held
	// by a request's transaction now is no row until it commits, and is
	// not counted anywhere.
	Transactional int64
	// TableBytes is the table's size on disk (pg_table_size: the heap,
	// its TOAST and free space), IndexBytes its indexes', TotalBytes both.
	TableBytes, IndexBytes, TotalBytes int64
	// DeadRows is the table's dead row versions awaiting vacuum
	// (pg_stat_user_tables.n_dead_tup, an estimate).
	DeadRows int64
	// LastVacuum and LastAutovacuum are when the table was last vacuumed
	// by hand and by autovacuum; zero when never.
	LastVacuum, LastAutovacuum time.Time
	// OldestExpiry is the earliest expires_at in the table; zero when it
	// is empty.
	OldestExpiry time.Time
}

const statsSQL = `SELECT count(*),
       count(*) FILTER (WHERE expires_at > statement_timestamp() AND status IS NOT NULL),
       count(*) FILTER (WHERE expires_at > statement_timestamp() AND status IS NULL),
       count(*) FILTER (WHERE expires_at <= statement_timestamp()),
       count(*) FILTER (WHERE expires_at > statement_timestamp() AND status IS NULL AND lock_id IS NOT NULL),
       min(expires_at)
FROM T`

const sizeSQL = `SELECT pg_table_size(c.oid), pg_indexes_size(c.oid), pg_total_relation_size(c.oid),
       coalesce(s.n_dead_tup, 0), s.last_vacuum, s.last_autovacuum
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = $1::regclass`

// Stats counts the table's rows (a scan of the whole table) and reports
// its size and vacuum state.
func (s *Store) Stats(ctx context.Context) (TableStats, error) {
	var st TableStats
	var oldest, vac, autovac *time.Time
	if err := s.pool.QueryRow(ctx, s.sql.stats).Scan(&st.Rows, &st.Records, &st.InFlight, &st.Expired, &st.Transactional, &oldest); err != nil {
		return st, fmt.Errorf("idemkey: postgres: stats: %w", err)
	}
	if err := s.pool.QueryRow(ctx, sizeSQL, s.table).Scan(&st.TableBytes, &st.IndexBytes, &st.TotalBytes, &st.DeadRows, &vac, &autovac); err != nil {
		return st, fmt.Errorf("idemkey: postgres: stats: %w", err)
	}
	for _, t := range []struct {
		dst *time.Time
		src *time.Time
	}{{&st.OldestExpiry, oldest}, {&st.LastVacuum, vac}, {&st.LastAutovacuum, autovac}} {
		if t.src != nil {
			*t.dst = *t.src
		}
	}
	return st, nil
}

// Table returns the name of the store's table, quoted as SQL needs it.
func (s *Store) Table() string { return s.table }
