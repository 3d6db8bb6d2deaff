package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemkey/idemkey/internal/sqlcore"
	"github.com/idemkey/idemkey/store"
)

var _ store.Inspector = (*Store)(nil)

// inspect reads key's row (when there is one) and who holds its named
// lock (kl).
func (q statements) inspect(key, kl string) string {
	return "SELECT r.token, r.fingerprint, r.raw_digest, r.created_us, r.expires_us, r.expires_us - IF(r.status IS NULL, GREATEST(n.now_us, r.created_us), n.now_us), r.status, r.header, r.body, r.body_omitted, r.completed_us,\n" +
		"  LENGTH(r.k) + LENGTH(r.token) + 32 + 8 + 8 + 2 + COALESCE(LENGTH(r.header), 0) + COALESCE(LENGTH(r.body), 0) + COALESCE(LENGTH(r.raw_digest), 0) + 1 + 8,\n" +
		"  IS_USED_LOCK('" + kl + "')\n" +
		"FROM (SELECT " + nowUS + " AS now_us) n LEFT JOIN " + q.t + " r ON r.k = " + strLit(key)
}

// Inspect implements store.Inspector: it reads key's row, and whether a
// session holds the key's named lock. A row whose life is over but that is
// not swept yet is returned Expired, with a TTL that is not positive. A
// key held by a request's transaction has no committed row: it is returned
// in flight and Transactional, with nothing else known, and Delete cannot
// free it (end the session instead: KILL CONNECTION). A record this
// version cannot read is returned with an error wrapping ErrUnreadable,
// with what could be read of the row. The owner token is not reported
// (Fence holds it, for Delete). Size is the row's columns' bytes, without
// InnoDB's overhead.
func (s *Store) Inspect(ctx context.Context, key string) (store.Entry, bool, error) {
	var (
		e                    store.Entry
		token, fp, raw       []byte
		header, body         []byte
		createdUS, expiresUS sql.NullInt64
		leftUS, status       sql.NullInt64
		completedUS, size    sql.NullInt64
		omitted              sql.NullBool
		holder               sql.NullInt64
	)
	kl, _ := s.locks(key, [32]byte{})
	err := s.db.QueryRowContext(ctx, s.sql.inspect(key, kl)).Scan(&token, &fp, &raw, &createdUS, &expiresUS, &leftUS,
		&status, &header, &body, &omitted, &completedUS, &size, &holder)
	if err != nil {
		return store.Entry{}, false, fmt.Errorf("idemkey: mysql: inspect: %w", err)
	}
	live := expiresUS.Valid && leftUS.Int64 > 0
	if !live && holder.Valid {
		// No live row, and a session holds the key: a request's
		// transaction, whose claim is not committed.
		return store.Entry{State: store.InFlight, Transactional: true}, true, nil
	}
	if !expiresUS.Valid {
		return store.Entry{}, false, nil
	}
	copy(e.Fingerprint[:], fp)
	e.CreatedAt = time.UnixMicro(createdUS.Int64)
	e.TTL = time.Duration(leftUS.Int64) * time.Microsecond
	e.Expired = !live
	e.Size = int(size.Int64)
	if !status.Valid {
		e.State = store.InFlight
		e.Fence = fence(e.State, expiresUS.Int64, string(token))
		return e, true, nil
	}
	e.State = store.Completed
	e.Fence = fence(e.State, expiresUS.Int64, string(token))
	if body == nil {
		body = []byte{}
	}
	rec := &store.Record{Status: int(status.Int64), Body: body, BodyOmitted: omitted.Valid && omitted.Bool,
		Fingerprint: e.Fingerprint, CreatedAt: e.CreatedAt}
	copy(rec.RawDigest[:], raw)
	if completedUS.Valid {
		rec.CompletedAt = time.UnixMicro(completedUS.Int64)
	}
	e.Record = rec
	if rec.Header, err = sqlcore.DecodeHeader(header); err != nil {
		return e, true, fmt.Errorf("%w: %w", ErrUnreadable, err)
	}
	return e, true, nil
}

// fence is an Entry's Fence: what Delete compares, the row's state, expiry
// (in microseconds, as the column holds it) and owner token.
func fence(st store.State, expiresUS int64, token string) string {
	return strconv.Itoa(int(st)) + ":" + strconv.FormatInt(expiresUS, 10) + ":" + token
}

// Delete implements store.Inspector: it deletes key's row only while it is
// still the row seen was read from (the same owner, state and expiry). A
// key held by a request's transaction has no committed row to delete: end
// the transaction instead (KILL CONNECTION of its session).
func (s *Store) Delete(ctx context.Context, key string, seen store.Entry) (bool, error) {
	parts := strings.SplitN(seen.Fence, ":", 3)
	if len(parts) != 3 {
		return false, nil // not a row's entry: nothing it names can be deleted
	}
	expires, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return false, nil
	}
	token, kept := parts[2], "0"
	if parts[0] == strconv.Itoa(int(store.Completed)) {
		kept = "1"
	}
	res, err := s.db.ExecContext(ctx, s.sql.noWait("DELETE FROM "+s.sql.t+" WHERE k = "+strLit(key)+" AND token = "+strLit(token)+
		" AND expires_us = "+intLit(expires)+" AND (status IS NOT NULL) = "+kept))
	if isNumber(err, errLockWaitTimeout) {
		// A request's transaction holds the row: it took the key over,
		// and the entry seen is gone.
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("idemkey: mysql: delete: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("idemkey: mysql: delete: %w", err)
	}
	return n == 1, nil
}

// TableStats is the Detail of a MySQL store's Stats: the table's size, as
// information_schema.TABLES reports it. The server computes those figures
// from InnoDB's statistics, and MySQL 8 caches them
// (information_schema_stats_expiry, a day by default; ANALYZE TABLE
// refreshes them): they are estimates.
type TableStats struct {
	// Rows is the table's row count (a scan: exact).
	Rows int64
	// EstimatedRows is InnoDB's estimate of it (TABLE_ROWS).
	EstimatedRows int64
	// DataBytes is the clustered index's size (DATA_LENGTH: the rows),
	// IndexBytes the secondary index's (INDEX_LENGTH), FreeBytes the
	// space allocated but unused (DATA_FREE), TotalBytes data and index
	// (Stats.Bytes).
	DataBytes, IndexBytes, FreeBytes, TotalBytes int64
	// OldestExpiry is the earliest expires_us in the table; zero when it
	// is empty.
	OldestExpiry time.Time
}

// Stats implements store.Inspector: it counts the table's rows (a scan of
// the whole table) into Records, InFlight, Expired (rows whose life is
// over that the sweeper has not deleted yet) and Unreadable (a header
// block of a format this version does not know), and reports the table's
// size (Bytes: data and index) in the *TableStats of Detail. Claims held
// by a request's transaction have no committed row and are not counted.
func (s *Store) Stats(ctx context.Context) (store.Stats, error) {
	var st store.Stats
	var ts TableStats
	var oldest sql.NullInt64
	q := "SELECT COUNT(*), COALESCE(SUM(expires_us > n.now_us AND status IS NOT NULL), 0), " +
		"COALESCE(SUM(expires_us > n.now_us AND status IS NULL), 0), COALESCE(SUM(expires_us <= n.now_us), 0), " +
		"COALESCE(SUM(header IS NOT NULL AND LENGTH(header) > 0 AND LEFT(header, 1) <> X'01'), 0), MIN(expires_us) " +
		"FROM (SELECT " + nowUS + " AS now_us) n JOIN " + s.sql.t
	if err := s.db.QueryRowContext(ctx, q).Scan(&ts.Rows, &st.Records, &st.InFlight, &st.Expired, &st.Unreadable, &oldest); err != nil {
		return store.Stats{}, fmt.Errorf("idemkey: mysql: stats: %w", err)
	}
	if oldest.Valid {
		ts.OldestExpiry = time.UnixMicro(oldest.Int64)
	}
	var rows, data, index, free sql.NullInt64
	err := s.db.QueryRowContext(ctx, "SELECT TABLE_ROWS, DATA_LENGTH, INDEX_LENGTH, DATA_FREE FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
		s.schema, s.table).Scan(&rows, &data, &index, &free)
	if err != nil {
		return store.Stats{}, fmt.Errorf("idemkey: mysql: stats: %w", err)
	}
	ts.EstimatedRows, ts.DataBytes, ts.IndexBytes, ts.FreeBytes = rows.Int64, data.Int64, index.Int64, free.Int64
	ts.TotalBytes = ts.DataBytes + ts.IndexBytes
	st.Bytes = ts.TotalBytes
	st.Detail = &ts
	return st, nil
}
