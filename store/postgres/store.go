package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/option"
	"github.com/idemkey/idemkey/internal/sqlcore"
	"github.com/idemkey/idemkey/store"
)

// Store keeps claims and records in a PostgreSQL table, one row per
// idempotency key. It is safe for concurrent use. The pool belongs to the
// caller, who closes it after closing the Store.
type Store struct {
	// db runs every statement outside a request's transaction; face
	// runs a request's transaction (pgx's for New, database/sql's for
	// NewDB).
	db            db
	face          face
	sql           statements
	table         string // sanitized, for messages
	timeout       time.Duration
	commitTimeout time.Duration
	begin         string // the BEGIN of a request's transaction
	// claimSQL is the claim: a call of the table's claim function.
	claimSQL  string
	txOptions pgx.TxOptions
	// undo4xx: a kept 4xx undoes the handler's writes, its record kept
	// on its own (WithClientErrorWrites, keepAlone).
	undo4xx       bool
	sweepBatch    int
	sweepInterval time.Duration

	sweeper sqlcore.Sweeper
}

var (
	_ store.Store    = (*Store)(nil)
	_ store.Extender = (*Store)(nil)
	_ store.TxStore  = (*Store)(nil)
)

// smallPool is the pool size under which New warns: pgxpool's default is
// 4 connections, or the number of CPUs.
const smallPool = 10

// maxAttempts bounds how often one call runs its statement when the answer
// says the row changed under it.
const maxAttempts = sqlcore.Attempts

// New returns a Store on pool. It checks, within ctx (DefaultStartTimeout,
// 10 s, when ctx has no deadline), that the table (WithTable; default
// DefaultTable) exists with the schema's columns and function, and returns
// an error that says how to create it when it does not; that the server
// takes writes (ErrReadOnly for a hot standby, or transactions read-only
// by default); and that its advisory locks are real (ErrLocksNotReal).
// Its errors name the server and database. It starts
// the background sweeper unless WithSweepInterval(0) is given; Close stops
// it. It returns an error for a nil pool and for any invalid option.
//
// Size the pool for the requests served at once: a transactional request
// holds one connection for its handler's whole run (see the package
// documentation).
func New(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	if pool == nil {
		return nil, errors.New("idemkey: postgres: nil pool")
	}
	s, err := open(ctx, pgxDB{q: pool, pool: pool}, opts)
	if err != nil {
		return nil, err
	}
	s.face = pgxFace{s: s, pool: pool}
	s.start()
	return s, nil
}

// NewDB returns a Store on db, a database/sql DB of any PostgreSQL driver
// (pgx's stdlib, lib/pq): the same store as New, whose handlers get the
// request's transaction as a *sql.Tx (SQLTx) for the data layers built on
// database/sql (sqlc, GORM, Bun, sqlx, ent). It checks what New checks.
// WithTxOptions' DeferrableMode is refused: database/sql has no word for
// it. Its errors name the server and database as the package
// documentation says (What is checked at New), as far as the driver
// tells.
//
// Size db for the requests served at once (SetMaxOpenConns): a
// transactional request holds one connection for its handler's whole
// run, and waits for one within the call's budget.
func NewDB(ctx context.Context, db *sql.DB, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, errors.New("idemkey: postgres: nil DB")
	}
	s, err := open(ctx, sqlDB{q: db, db: db}, opts)
	if err != nil {
		return nil, err
	}
	if s.txOptions.DeferrableMode != "" {
		return nil, errors.New("idemkey: postgres: WithTxOptions: a DeferrableMode cannot be set through database/sql")
	}
	s.face = sqlFace{s: s, db: db, opts: &sql.TxOptions{Isolation: isolation(s.txOptions.IsoLevel)}}
	s.start()
	return s, nil
}

// isolation is database/sql's word for a pgx isolation level.
func isolation(l pgx.TxIsoLevel) sql.IsolationLevel {
	switch l {
	case pgx.ReadUncommitted:
		return sql.LevelReadUncommitted
	case pgx.ReadCommitted:
		return sql.LevelReadCommitted
	case pgx.RepeatableRead:
		return sql.LevelRepeatableRead
	case pgx.Serializable:
		return sql.LevelSerializable
	}
	return sql.LevelDefault
}

// open checks the server and the table through d, and returns the Store,
// its sweeper not started.
func open(ctx context.Context, d db, opts []Option) (*Store, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	caller := ctx
	ctx, cancel := sqlcore.StartContext(ctx)
	defer cancel()
	where, err := d.locate(ctx)
	if err != nil {
		return nil, startErr(caller, ctx, where, fmt.Errorf("idemkey: postgres: connecting: %w", err))
	}
	if err := checkServer(ctx, d, cfg.table); err != nil {
		return nil, startErr(caller, ctx, where, err)
	}
	sql := newStatements(cfg.table)
	s := &Store{
		db:            d,
		sql:           sql,
		claimSQL:      sql.claimCall,
		table:         cfg.table.Sanitize(),
		timeout:       cfg.CallTimeout,
		commitTimeout: cfg.CommitTimeout,
		begin:         beginSQL(cfg.txOptions),
		txOptions:     cfg.txOptions,
		undo4xx:       !cfg.ClientErrorWrites,
		sweepBatch:    cfg.SweepBatch,
		sweepInterval: cfg.SweepInterval,
	}
	if n := d.maxConns(); n > 0 && n < smallPool {
		slog.Warn("idemkey: postgres: the pool is small for transactional requests: each holds a connection for its handler's whole run, so at most this many run at once, and the rest are answered 503 once the call's budget has passed waiting for one; size the pool for the requests served at once (pgxpool MaxConns, pool_max_conns in the URL; sql.DB SetMaxOpenConns)",
			"max_conns", n, "call_timeout", cfg.CallTimeout)
	}
	return s, nil
}

// checkServer runs New's checks: prepared statements that are not lost
// between transactions, the table and its function, a server that is not
// read-only, advisory locks that are real.
func checkServer(ctx context.Context, d db, table pgx.Identifier) error {
	// The pool's prepared statements first: where they are lost, the
	// other checks' statements may fail with it.
	if err := d.checkStatements(ctx); err != nil {
		return err
	}
	if err := checkTable(ctx, d, table); err != nil {
		return err
	}
	if err := checkWritable(ctx, d); err != nil {
		return err
	}
	return checkLocks(ctx, d)
}

// startErr adds to an error of start-up (New, NewDB, Migrate, MigrateDB)
// the server it was talking to (where, as locate names it) and, when its
// time was up (ctx, bounded from the caller's context), the budget that
// ran out.
func startErr(caller, ctx context.Context, where string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%s; start-up bounded by %s)", err, where, sqlcore.Budget(caller))
	}
	return fmt.Errorf("%w (%s)", err, where)
}

// start starts the background sweeper, unless WithSweepInterval(0).
func (s *Store) start() {
	s.sweeper.Start(s.sweepInterval, s.Sweep, "idemkey: postgres: sweeping expired rows failed", "table", s.table)
}

func newConfig(opts []Option) (config, error) {
	cfg := defaultConfig()
	if err := option.Apply("idemkey: postgres", &cfg, opts); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// beginSQL is the BEGIN statement for o.
func beginSQL(o pgx.TxOptions) string {
	s := "BEGIN"
	if o.IsoLevel != "" {
		s += " ISOLATION LEVEL " + string(o.IsoLevel)
	}
	if o.AccessMode != "" {
		s += " " + string(o.AccessMode)
	}
	if o.DeferrableMode != "" {
		s += " " + string(o.DeferrableMode)
	}
	return s
}

// Close stops the background sweeper and waits for a sweep in progress to
// end. It does not close the pool. It is safe to call more than once.
func (s *Store) Close() error {
	s.sweeper.Stop()
	return nil
}

// row is the answer of a claim statement.
type row struct {
	kind        int16 // 1 claimed, 2 a row holds the key, 3 a transaction holds it
	token       *string
	fingerprint []byte
	createdAt   *time.Time
	remaining   *int64 // µs
	status      *int16
	header      []byte
	body        []byte
	omitted     *bool
	completedAt *time.Time
	same        *bool // kind 3: the holder's request has the claim's fingerprint
	rawDigest   []byte
}

// The kinds of answer of claimSQL.
const (
	kindClaimed = 1
	kindRow     = 2
	kindHeld    = 3
)

func (r *row) scan(rows scanner) error {
	return rows.Scan(&r.kind, &r.token, &r.fingerprint, &r.createdAt, &r.remaining,
		&r.status, &r.header, &r.body, &r.omitted, &r.completedAt, &r.same, &r.rawDigest)
}

// queryClaim runs the claim statement on q and returns its row, or false
// when it returned none (it raced a commit: ask again).
func (s *Store) queryClaim(ctx context.Context, q db, key string, c store.Claim, life int64) (row, bool, error) {
	var r row
	err := r.scan(q.queryRow(ctx, s.claimSQL, s.claimArgs(key, c, life)...))
	if noRows(err) {
		return r, false, nil
	}
	return r, err == nil, err
}

// claimArgs are the arguments of the claim (claimSQL, or the table's
// claim function) for key and c, the row living life microseconds.
func (s *Store) claimArgs(key string, c store.Claim, life int64) []any {
	l1, l2 := s.locks(key, c.Fingerprint)
	return []any{key, c.Token, c.Fingerprint[:], life, l1, l2, timeoutText(c.TTL)}
}

// locks returns the advisory lock ids of a claim: the key's, and the key's
// with the request's fingerprint (sqlcore.LockIDs).
func (s *Store) locks(key string, fp [32]byte) (int64, int64) {
	return sqlcore.LockIDs(s.table, key, fp)
}

// result reads the claim's answer when the key is not claimed: a row that
// holds it (kind 2; the caller decides Mine), or a transaction (kind 3).
func (r *row) result(c store.Claim) (store.Result, error) {
	f := sqlcore.Found{Kind: sqlcore.Row, Fingerprint: r.fingerprint, RawDigest: r.rawDigest, Header: r.header, Body: r.body}
	if r.kind == kindHeld {
		f.Kind = sqlcore.HeldOther
		if r.same != nil && *r.same {
			f.Kind = sqlcore.HeldSame
		}
		if r.createdAt != nil {
			f.HeldSince = *r.createdAt
		}
	} else {
		if r.createdAt != nil {
			f.CreatedAt = *r.createdAt
		}
		if r.remaining != nil {
			f.Remaining = time.Duration(*r.remaining) * time.Microsecond
		}
		if r.status != nil {
			f.Kept, f.Status = true, int(*r.status)
		}
		f.BodyOmitted = r.omitted != nil && *r.omitted
		if r.completedAt != nil {
			f.CompletedAt = *r.completedAt
		}
	}
	// The token is left out: the caller decides Mine.
	res, err := f.Result(c)
	if err != nil {
		return store.Result{}, fmt.Errorf("%w: %w", ErrUnreadable, err)
	}
	return res, nil
}

// Claim claims key for c.Token with a life of c.TTL, or reports what holds
// it, in one round trip: one statement (see claimSQL) that inserts the
// claim unless the key is taken (a row whose life is over is taken over in
// the same statement) and otherwise returns what took it. A claim that
// raced another for the same key may run its statement again. Backend
// failures wrap store.ErrUnavailable; a row this version cannot read is
// ErrUnreadable. c.TTL is rounded up to whole microseconds and must be
// positive; c.Token must not be empty.
func (s *Store) Claim(ctx context.Context, key string, c store.Claim) (store.Result, error) {
	ttl, err := checkClaim(c)
	if err != nil {
		return store.Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.Result{}, unavailable("claim", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var lastErr error
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		r, ok, err := s.queryClaim(ctx, s.db, key, c, ttl)
		if err != nil {
			if connLost(ctx, err) {
				// A pooled connection that died (a server restart): a
				// claim that landed before it did answers Mine now.
				lastErr = err
				continue
			}
			return store.Result{}, unavailable("claim", err)
		}
		switch {
		case !ok:
			continue // raced a claim that committed after the snapshot
		case r.kind == kindClaimed:
			return store.Result{State: store.Claimed, Fingerprint: c.Fingerprint}, nil
		case r.kind == kindHeld && (r.same == nil || !*r.same) && attempt < maxAttempts:
			// Held by a transaction for another request: most likely
			// another plain claim whose statement has not committed yet.
			// Wait a moment for it to, then ask again for its
			// fingerprint (a transactional owner's is never to be seen:
			// then the answer says only "another").
			l1, _ := s.locks(key, c.Fingerprint)
			s.db.exec(ctx, waitSQL, l1, "50")
			continue
		}
		res, err := r.result(c)
		if err != nil {
			return store.Result{}, fmt.Errorf("idemkey: postgres: claim: %w", err)
		}
		if res.State == store.InFlight && r.token != nil && *r.token == c.Token {
			return store.Result{State: store.Mine, Fingerprint: res.Fingerprint}, nil
		}
		return res, nil
	}
	return store.Result{}, unavailable("claim", gaveUp(lastErr))
}

// gaveUp is the error of a call that ran out of attempts.
func gaveUp(lastErr error) error { return sqlcore.GaveUp(lastErr) }

// connLost reports whether err is a connection that failed (closed by the
// server, reset, cut short) while ctx is still live: then the statement
// may run again on another connection. Every statement of the store is
// safe to run twice: a claim that landed answers Mine, a complete that
// landed answers as kept, a release that landed finds the key free.
func connLost(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if code := sqlState(err); code != "" {
		// The server answered. (An error that ends the session, such as
		// a terminated backend, also closes the connection: that one is
		// retried.)
		return sessionEnded(err, code)
	}
	return sqlcore.Transport(err) || pgconn.SafeToRetry(err)
}

// sessionEnded reports whether err, a server's error with SQLSTATE code,
// ended the session: a FATAL or PANIC error (pgx says which), or, from a
// driver that does not say, an operator intervention (57P: the backend
// terminated, the server shutting down) or a connection exception (08).
func sessionEnded(err error, code string) bool {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC"
	}
	return len(code) == 5 && (code[:3] == "57P" || code[:2] == "08")
}

// Complete replaces the claim held by token with rec, kept for retention
// (rounded up to whole microseconds; must be positive), in one round trip.
// It returns nil without writing when key already holds a record kept
// under token, store.ErrNotOwner when token does not hold the claim, and
// an error wrapping store.ErrUnavailable when the backend fails: then the
// record may or may not have been kept.
func (s *Store) Complete(ctx context.Context, key, token string, rec *store.Record, retention time.Duration) error {
	if token == "" {
		return errors.New("idemkey: postgres: complete: empty owner token")
	}
	args, err := recordArgs(key, token, rec, retention)
	if err != nil {
		return err
	}
	return s.owned(ctx, "complete", s.sql.complete, map[int]error{1: nil, 2: nil, 0: store.ErrNotOwner}, args...)
}

// Release deletes the claim held by token, in one round trip. It returns
// nil when key holds nothing (or a row whose life is over),
// store.ErrNotOwner when another token or a record holds it, and an error
// wrapping store.ErrUnavailable when the backend fails.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if token == "" {
		return errors.New("idemkey: postgres: release: empty owner token")
	}
	return s.owned(ctx, "release", s.sql.release, map[int]error{1: nil, 0: store.ErrNotOwner}, key, token)
}

// owned runs an owner-checked statement that answers a code: each code in
// answers is the call's result; 3 means the row changed under the
// statement, which then runs again.
func (s *Store) owned(ctx context.Context, op, sql string, answers map[int]error, args ...any) error {
	if err := ctx.Err(); err != nil {
		return unavailable(op, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	done, err := sqlcore.Retry(ctx, 0, func() (sqlcore.Outcome, error) {
		var code int
		if err := s.db.queryRow(ctx, sql, args...).Scan(&code); err != nil {
			if connLost(ctx, err) {
				return sqlcore.Lost, err
			}
			return sqlcore.Done, unavailable(op, err)
		}
		if err, ok := answers[code]; ok {
			return sqlcore.Done, err
		}
		if code != 3 {
			return sqlcore.Done, fmt.Errorf("idemkey: postgres: %s: unexpected answer %d", op, code)
		}
		return sqlcore.Again, nil
	})
	if !done {
		return unavailable(op, err)
	}
	return err
}

// Extend sets the remaining life of the claim held by token to ttl
// (rounded up to whole microseconds; must be positive), in one round trip.
// It returns store.ErrNotOwner when token does not hold a live claim, and
// an error wrapping store.ErrUnavailable when the backend fails.
func (s *Store) Extend(ctx context.Context, key, token string, ttl time.Duration) error {
	us, err := micros("claim TTL", ttl)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return unavailable("extend", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	n, err := s.db.exec(ctx, s.sql.extend, key, token, us)
	if err != nil && connLost(ctx, err) {
		n, err = s.db.exec(ctx, s.sql.extend, key, token, us)
	}
	if err != nil {
		return unavailable("extend", err)
	}
	if n == 0 {
		return store.ErrNotOwner
	}
	return nil
}

// recordArgs returns the arguments of completeSQL and keepTxSQL.
func recordArgs(key, token string, rec *store.Record, retention time.Duration) ([]any, error) {
	if rec == nil {
		return nil, errors.New("idemkey: postgres: nil record")
	}
	if rec.Status < 0 || rec.Status > 0x7fff {
		return nil, fmt.Errorf("idemkey: postgres: status %d out of range", rec.Status)
	}
	us, err := micros("retention", retention)
	if err != nil {
		return nil, err
	}
	h := sqlcore.EncodeHeader(rec.Header)
	body := rec.Body
	if body == nil {
		body = []byte{} // NULL is for a key in flight
	}
	var raw []byte // NULL: kept without one
	if rec.RawDigest != ([32]byte{}) {
		raw = rec.RawDigest[:]
	}
	// Room for one more: a transaction's keep adds the claim's life.
	args := make([]any, 11, 12)
	args[0], args[1], args[2], args[3], args[4] = key, token, rec.Fingerprint[:], int16(rec.Status), h
	args[5], args[6], args[7], args[8], args[9] = body, rec.BodyOmitted, rec.CreatedAt, rec.CompletedAt, us
	args[10] = raw
	return args, nil
}

// Sweep deletes the rows whose life is over, in batches of
// WithSweepBatch rows, each its own statement, until a batch finds fewer
// than that. It returns how many rows it deleted. Backend failures wrap
// store.ErrUnavailable. The background sweeper calls it every
// WithSweepInterval; services that turn that off call it themselves.
func (s *Store) Sweep(ctx context.Context) (int64, error) {
	n, err := sqlcore.SweepBatches(ctx, s.sweepBatch, func(ctx context.Context) (int64, int64, error) {
		n, err := s.db.exec(ctx, s.sql.sweep, s.sweepBatch)
		return n, n, err
	})
	if err != nil {
		return n, unavailable("sweep", err)
	}
	return n, nil
}

// unavailable wraps a backend failure so that errors.Is finds both
// store.ErrUnavailable and the cause.
func unavailable(op string, err error) error {
	return fmt.Errorf("idemkey: postgres: %s: %w: %w", op, store.ErrUnavailable, err)
}

// checkClaim checks a claim's token and returns its life in microseconds.
func checkClaim(c store.Claim) (int64, error) {
	if c.Token == "" {
		return 0, errors.New("idemkey: postgres: claim: empty owner token")
	}
	return micros("claim TTL", c.TTL)
}

// micros returns d in whole microseconds, rounded up.
func micros(what string, d time.Duration) (int64, error) {
	us, err := sqlcore.Micros(what, d)
	if err != nil {
		return 0, fmt.Errorf("idemkey: postgres: %w", err)
	}
	return us, nil
}
