package postgres

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemkey/idemkey/store"
)

var _ store.Inspector = (*Store)(nil)

// inspectSQL reads a key's row.
const inspectSQL = `SELECT r.token, r.fingerprint, r.created_at, r.expires_at,
       (extract(epoch FROM r.expires_at - statement_timestamp()) * 1000000)::bigint,
       r.status, r.header, r.body, r.body_omitted, r.completed_at, pg_column_size(r.*), r.raw_digest
FROM T r WHERE r.key = $1`

// Inspect implements store.Inspector: it reads key's row, and probes the
// owner of a claim committed with a lock as a claim would. A row whose life
// is over but that is not swept yet is returned Expired, with a TTL that is
// not positive. A key held by a request's transaction has no committed row:
// it is returned in flight and Transactional, with only the time its
// transaction began (when the server shows it), and Delete cannot free it.
// A record this version cannot read is returned with an error wrapping
// ErrUnreadable, with what could be read of the row. The owner token is not
// reported (Fence holds it, for Delete).
func (s *Store) Inspect(ctx context.Context, key string) (store.Entry, bool, error) {
	var (
		e           store.Entry
		token       string
		expiresAt   time.Time
		fp, header  []byte
		body        []byte
		remaining   int64
		status      *int16
		omitted     *bool
		completedAt *time.Time
		raw         []byte
	)
	err := s.db.queryRow(ctx, s.sql.inspect, key).Scan(&token, &fp, &e.CreatedAt, &expiresAt, &remaining,
		&status, &header, &body, &omitted, &completedAt, &e.Size, &raw)
	if noRows(err) || (err == nil && remaining <= 0) {
		// No live row: the key may still be held by a request's
		// transaction, whose claim is not committed.
		if held, ok, herr := s.heldByTx(ctx, key); herr != nil || ok {
			return held, ok, herr
		}
	}
	if noRows(err) {
		return store.Entry{}, false, nil
	}
	if err != nil {
		return store.Entry{}, false, fmt.Errorf("idemkey: postgres: inspect: %w", err)
	}
	copy(e.Fingerprint[:], fp)
	e.TTL = time.Duration(remaining) * time.Microsecond
	e.Expired = remaining <= 0
	if status == nil {
		e.State = store.InFlight
		e.Fence = fence(e.State, expiresAt, token)
		return e, true, nil
	}
	e.State = store.Completed
	e.Fence = fence(e.State, expiresAt, token)
	rec := &store.Record{Status: int(*status), Body: body, BodyOmitted: omitted != nil && *omitted,
		Fingerprint: e.Fingerprint, CreatedAt: e.CreatedAt}
	if completedAt != nil {
		rec.CompletedAt = *completedAt
	}
	copy(rec.RawDigest[:], raw)
	e.Record = rec
	if rec.Header, err = decodeHeader(header); err != nil {
		return e, true, err
	}
	return e, true, nil
}

// fence is an Entry's Fence: what Delete compares, the row's state, expiry
// (in microseconds, as the column holds it) and owner token.
func fence(st store.State, expiresAt time.Time, token string) string {
	return strconv.Itoa(int(st)) + ":" + strconv.FormatInt(expiresAt.UnixMicro(), 10) + ":" + token
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
func (s *Store) heldByTx(ctx context.Context, key string) (store.Entry, bool, error) {
	l1, _ := s.locks(key, [32]byte{})
	var began *time.Time
	err := s.db.queryRow(ctx, heldBySQL, l1).Scan(&began)
	if noRows(err) {
		return store.Entry{}, false, nil
	}
	if err != nil {
		return store.Entry{}, false, fmt.Errorf("idemkey: postgres: inspect: %w", err)
	}
	e := store.Entry{State: store.InFlight, Transactional: true}
	if began != nil {
		e.CreatedAt = *began
	}
	return e, true, nil
}

// Delete implements store.Inspector: it deletes key's row only while it is
// still the row seen was read from (the same owner, state and expiry). A
// key held by a request's transaction has no committed row to delete: end
// the transaction instead (its backend's pg_terminate_backend).
func (s *Store) Delete(ctx context.Context, key string, seen store.Entry) (bool, error) {
	st, rest, ok1 := strings.Cut(seen.Fence, ":")
	us, token, ok2 := strings.Cut(rest, ":")
	micros, err := strconv.ParseInt(us, 10, 64)
	if !ok1 || !ok2 || err != nil {
		return false, nil // not a row's entry: nothing it names can be deleted
	}
	n, err := s.db.exec(ctx, s.sql.delete, key, token, time.UnixMicro(micros), st == strconv.Itoa(int(store.Completed)))
	if err != nil {
		return false, fmt.Errorf("idemkey: postgres: delete: %w", err)
	}
	return n == 1, nil
}

const deleteSQL = `DELETE FROM T WHERE key = $1 AND token = $2 AND expires_at = $3 AND (status IS NOT NULL) = $4`

// TableStats is the Detail of a PostgreSQL store's Stats: the table's
// size and vacuum state.
type TableStats struct {
	// Transactional is always 0: a claim held by a request's transaction
	// is no committed row, and is not counted anywhere (Inspect finds it
	// by its lock).
	Transactional int64
	// TableBytes is the table's size on disk (pg_table_size: the heap,
	// its TOAST and free space), IndexBytes its indexes', TotalBytes both
	// (Stats.Bytes).
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
       0::bigint,
       min(expires_at)
FROM T`

const sizeSQL = `SELECT pg_table_size(c.oid), pg_indexes_size(c.oid), pg_total_relation_size(c.oid),
       coalesce(s.n_dead_tup, 0), s.last_vacuum, s.last_autovacuum
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = $1::regclass`

// Stats implements store.Inspector: it counts the table's rows (a scan of
// the whole table) into Records, InFlight and Expired (rows whose life is
// over that the sweeper has not deleted yet), and reports the table's size
// (Bytes: the table's and its indexes') and vacuum state in the
// *TableStats of Detail.
func (s *Store) Stats(ctx context.Context) (store.Stats, error) {
	var st store.Stats
	var ts TableStats
	var rows int64
	var oldest, vac, autovac *time.Time
	if err := s.db.queryRow(ctx, s.sql.stats).Scan(&rows, &st.Records, &st.InFlight, &st.Expired, &ts.Transactional, &oldest); err != nil {
		return store.Stats{}, fmt.Errorf("idemkey: postgres: stats: %w", err)
	}
	if err := s.db.queryRow(ctx, sizeSQL, s.table).Scan(&ts.TableBytes, &ts.IndexBytes, &ts.TotalBytes, &ts.DeadRows, &vac, &autovac); err != nil {
		return store.Stats{}, fmt.Errorf("idemkey: postgres: stats: %w", err)
	}
	for _, t := range []struct {
		dst *time.Time
		src *time.Time
	}{{&ts.OldestExpiry, oldest}, {&ts.LastVacuum, vac}, {&ts.LastAutovacuum, autovac}} {
		if t.src != nil {
			*t.dst = *t.src
		}
	}
	st.Bytes = ts.TotalBytes
	st.Detail = &ts
	return st, nil
}

// Table returns the name of the store's table, quoted as SQL needs it.
func (s *Store) Table() string { return s.table }
