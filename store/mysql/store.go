package mysql

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkey/idemkey/internal/option"
	"github.com/idemkey/idemkey/internal/sqlcore"
	"github.com/idemkey/idemkey/store"
)

// Store keeps claims and records in a MySQL or MariaDB table, one row per
// idempotency key, through database/sql. It is safe for concurrent use.
// The *sql.DB belongs to the caller, who closes it after closing the
// Store.
type Store struct {
	db            *sql.DB
	sql           statements
	schema, table string // the table's database and name, for lock names
	name          string // the table, for messages
	timeout       time.Duration
	commitTimeout time.Duration
	txOptions     *sql.TxOptions
	// undo4xx: a kept 4xx rolls the handler's writes back
	// (WithClientErrorWrites).
	undo4xx    bool
	sweepBatch int

	sweeper sqlcore.Sweeper
	// bg runs the work left to do in the background (letting go of a
	// claim's locks after its commit): Close waits for it.
	bg background
}

// background runs work in goroutines of its own, which close waits for.
// Work handed over once close has begun (a request ending while the Store
// closes lets go of its named locks) is waited for by its caller instead,
// for at most limit: with a server that answers, it is done when run
// returns, and a server that has stopped answering holds the caller no
// longer than a commit's budget.
type background struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
	limit  time.Duration
}

// run runs f in the background; once b is closed, it waits for f, at most
// b.limit.
func (b *background) run(f func()) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		done := make(chan struct{})
		go func() {
			defer close(done)
			f()
		}()
		t := time.NewTimer(b.limit)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
		}
		return
	}
	// Added under the lock close takes, so that no Add from zero races
	// close's Wait (which sync.WaitGroup forbids).
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		f()
	}()
}

// close waits for the work running in the background; later work runs in
// its caller.
func (b *background) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.wg.Wait()
}

var (
	_ store.Store    = (*Store)(nil)
	_ store.Extender = (*Store)(nil)
	_ store.TxStore  = (*Store)(nil)
)

// smallPool is the pool size under which New warns.
const smallPool = 10

// Limits of what the table's columns hold: a longer value is refused
// before it is sent, so that a server in a lax sql_mode never truncates it.
const (
	maxKey   = 100
	maxToken = 128
)

// New returns a Store on db. It checks, within ctx, that the table
// (WithTable; default DefaultTable) exists with the schema's columns (and
// says how to create it when it does not), that the table takes writes
// from db's sessions (else ErrReadOnly: a read-only server or session),
// that the server's named locks are real and shared by its sessions (else
// ErrLocksNotReal), and that the server is not a node of a Galera cluster
// (ErrGalera); its errors name the server and the database. When ctx has
// no deadline, the checks are bounded by DefaultStartTimeout (10 s), so
// that a server that accepts the connection and never answers fails
// start-up rather than hang it. It warns, through
// log/slog's default logger, when db's pool is limited to fewer than 10
// connections. It starts the background sweeper unless
// WithSweepInterval(0) is given; Close stops it. It returns an error for a
// nil db and for any invalid option.
//
// Size the pool for the requests served at once: a transactional request
// holds one connection for its handler's whole run (see the package
// documentation).
func New(ctx context.Context, db *sql.DB, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, errors.New("idemkey: mysql: nil *sql.DB")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if db.Stats().MaxOpenConnections == 1 {
		// The check of the named locks, and every watchdog's KILL, need
		// a second connection while one is held.
		return nil, errors.New("idemkey: mysql: the *sql.DB is limited to one connection (SetMaxOpenConns(1)): the store needs at least two, and one per request served at once")
	}
	budget := sqlcore.Budget(ctx)
	ctx, cancel := sqlcore.StartContext(ctx)
	defer cancel()
	srv, err := reach(ctx, db, budget)
	if err != nil {
		return nil, err
	}
	schema := cfg.schema
	if schema == "" {
		if srv.database == "" {
			return nil, fmt.Errorf("idemkey: mysql: the connection to %s has no database: name one in the DSN, or qualify the table (WithTable(\"database.%s\"))", srv.address, cfg.table)
		}
		schema = srv.database
	}
	s := &Store{
		db:            db,
		sql:           newStatements(cfg.schema, cfg.table),
		schema:        schema,
		table:         cfg.table,
		timeout:       cfg.CallTimeout,
		commitTimeout: cfg.CommitTimeout,
		bg:            background{limit: 2 * cfg.CommitTimeout}, // a ROLLBACK, then the locks let go of
		txOptions:     cfg.txOptions,
		undo4xx:       !cfg.ClientErrorWrites,
		sweepBatch:    cfg.SweepBatch,
	}
	s.name = s.sql.t
	s.sql.mariadb = strings.Contains(srv.version, "MariaDB")
	for _, check := range []func() error{
		func() error { return checkTable(ctx, db, s.sql.t) },
		func() error { return checkWrites(ctx, db, s.sql) },
		func() error { return checkGalera(ctx, db) },
		func() error { return checkLocks(ctx, db) },
	} {
		if err := check(); err != nil {
			return nil, srv.wrap(ctx, err)
		}
	}
	if n := db.Stats().MaxOpenConnections; n > 0 && n < smallPool {
		slog.Warn("idemkey: mysql: the pool is small for transactional requests: each holds a connection for its handler's whole run, so at most this many run at once, and the rest are answered 503 once the call's budget has passed waiting for one; size the pool for the requests served at once (db.SetMaxOpenConns)",
			"max_open_conns", n, "call_timeout", cfg.CallTimeout)
	}
	s.sweeper.Start(cfg.SweepInterval, s.Sweep, "idemkey: mysql: sweeping expired rows failed", "table", s.name)
	return s, nil
}

func newConfig(opts []Option) (config, error) {
	cfg := defaultConfig()
	if err := option.Apply("idemkey: mysql", &cfg, opts); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// Close stops the background sweeper and waits for a sweep in progress,
// and for the background work of requests that have ended, to finish. It
// does not close the *sql.DB. It is safe to call more than once.
func (s *Store) Close() error {
	s.sweeper.Stop()
	s.bg.close()
	return nil
}

// Table returns the name of the store's table, quoted as SQL needs it.
func (s *Store) Table() string { return s.name }

// locks returns the names of a claim's two named locks: the key's, and
// the key's with the request's fingerprint.
func (s *Store) locks(key string, fp [32]byte) (kl, fl string) {
	kl = sqlcore.LockName([]byte(s.schema), []byte(s.table), []byte(key))
	fl = sqlcore.LockName([]byte(s.schema), []byte(s.table), []byte(key), fp[:])
	return kl, fl
}

// claimRow is the answer of the claim's first statement.
type claimRow struct {
	token, fingerprint, rawDigest []byte
	createdUS, leftUS             sql.NullInt64
	status                        sql.NullInt64
	header, body                  []byte
	omitted                       sql.NullBool
	completedUS                   sql.NullInt64
	kind                          int64
	present                       bool
	connID                        int64
	isolation                     string
	nowUS                         int64 // when the statement ran, on the server's clock
}

// row are the destinations of the row's columns (rowColumns).
func (r *claimRow) row() []any {
	return []any{&r.token, &r.fingerprint, &r.rawDigest, &r.createdUS, &r.leftUS,
		&r.status, &r.header, &r.body, &r.omitted, &r.completedUS}
}

// readClaim runs the claim's first statement on conn.
func (s *Store) readClaim(ctx context.Context, conn *sql.Conn, key string, c store.Claim) (claimRow, error) {
	kl, fl := s.locks(key, c.Fingerprint)
	var r claimRow
	err := conn.QueryRowContext(ctx, s.sql.claim(key, kl, fl)).Scan(append(r.row(), &r.kind, &r.present, &r.connID, &r.isolation, &r.nowUS)...)
	if err != nil || r.kind != gotRow || r.isolation != readUncommitted {
		return r, err
	}
	// The session reads rows no one has committed: a record kept by a
	// transaction whose COMMIT has not landed (and may never land) is
	// not to be replayed, nor a claim written in one trusted. The row is
	// read again as committed; one a transaction holds is in flight.
	var live bool
	err = conn.QueryRowContext(ctx, s.sql.committed(key)).Scan(append(r.row(), &live)...)
	switch {
	case isNumber(err, errLockWaitTimeout) || isNumber(err, errLockNowait):
		r.kind = heldOther
		if bytes.Equal(r.fingerprint, c.Fingerprint[:]) {
			r.kind = heldSame
		}
		return r, nil
	case errors.Is(err, sql.ErrNoRows) || err == nil && !live:
		// What was read is gone, or lapsed: read it all again.
		r.kind = changed
		return r, nil
	}
	return r, err
}

// result is the answer of a claim that did not take the key: what its
// first statement found (sqlcore.Found.Result). A row this version cannot
// read is an error wrapping ErrUnreadable.
func (r *claimRow) result(c store.Claim) (store.Result, error) {
	f := sqlcore.Found{Kind: sqlcore.Row}
	switch r.kind {
	case heldSame:
		f.Kind = sqlcore.HeldSame
	case heldOther:
		f.Kind = sqlcore.HeldOther
	case gotRow:
		f.Token, f.Fingerprint, f.RawDigest = string(r.token), r.fingerprint, r.rawDigest
		f.CreatedAt = time.UnixMicro(r.createdUS.Int64)
		f.Remaining = time.Duration(r.leftUS.Int64) * time.Microsecond
		f.Kept, f.Status, f.Header, f.Body = r.status.Valid, int(r.status.Int64), r.header, r.body
		f.BodyOmitted = r.omitted.Valid && r.omitted.Bool
		if r.completedUS.Valid {
			f.CompletedAt = time.UnixMicro(r.completedUS.Int64)
		}
	default:
		return store.Result{}, fmt.Errorf("unexpected answer %d", r.kind)
	}
	res, err := f.Result(c)
	if err != nil {
		return store.Result{}, fmt.Errorf("%w: %w", ErrUnreadable, err)
	}
	return res, nil
}

// conn takes a connection from the pool within ctx.
func (s *Store) conn(ctx context.Context, op string) (*sql.Conn, error) {
	conn, err := s.db.Conn(ctx)
	if err == nil {
		return conn, nil
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		st := s.db.Stats()
		return nil, unavailable(op, fmt.Errorf("%w (%d of %d in use): %w", ErrPoolExhausted, st.InUse, st.MaxOpenConnections, err))
	}
	return nil, unavailable(op, err)
}

// claimWrite is the statement that claims key once its locks are held:
// an INSERT when the first statement found no row, a takeover of the
// lapsed row it found otherwise.
func (s *Store) claimWrite(r claimRow, key string, c store.Claim, lifeUS int64) string {
	if r.present {
		return s.sql.takeover(key, c.Token, c.Fingerprint, lifeUS)
	}
	return s.sql.insert(key, c.Token, c.Fingerprint, lifeUS)
}

// Claim claims key for c.Token with a life of c.TTL, or reports what holds
// it. On a connection held for the call, its first statement reads the
// key's row and, when no live row holds it, takes the claim's two named
// locks (see the package documentation); a second writes the claim, which
// commits at once; the locks are let go of after the answer, in the
// background. A replay and a claim in flight cost one round trip; a first
// run two (and one not waited for). A claim that meets another plain
// claim being made waits for it (up to 100 ms at a time, within the
// call's budget) to learn its fingerprint. Backend failures wrap
// store.ErrUnavailable; a row this version cannot read is ErrUnreadable.
// c.TTL is rounded up to whole microseconds and must be positive; c.Token
// must not be empty.
func (s *Store) Claim(ctx context.Context, key string, c store.Claim) (store.Result, error) {
	life, err := checkClaim(key, c)
	if err != nil {
		return store.Result{}, err
	}
	ctx, cancel, err := s.call(ctx, "claim")
	if err != nil {
		return store.Result{}, err
	}
	defer cancel()
	var lastErr error
	for attempt := 1; attempt <= sqlcore.Attempts; attempt++ {
		conn, err := s.conn(ctx, "claim")
		if err != nil {
			return store.Result{}, err
		}
		r, err := s.readClaim(ctx, conn, key, c)
		if err != nil {
			s.discard(conn, 0)
			if connLost(ctx, err) {
				lastErr = err
				continue
			}
			return store.Result{}, unavailable("claim", err)
		}
		switch r.kind {
		case heldByThis:
			s.discard(conn, r.connID)
			lastErr = errors.New("a pooled connection held a named lock of the store")
			continue
		case changed:
			conn.Close()
			continue
		case heldSame, heldOther:
			if wait := waitFor(ctx); attempt < sqlcore.Attempts && wait > 0 {
				// Most likely another plain claim being made: wait a
				// moment for it to let go, then ask again for its row.
				// (A transaction's owner holds the key far longer: then
				// the answer says only whether it is this request.) The
				// wait takes the locks in the claim's order, the
				// fingerprint's first: a session that holds the key's
				// lock holds its fingerprint's too, so that a claim
				// meeting the waiter never reads it as another request
				// in flight. Each lock gets half of the wait.
				kl, fl := s.locks(key, c.Fingerprint)
				secs := strconv.FormatFloat(wait.Seconds()/2, 'f', 3, 64)
				_, err := conn.ExecContext(ctx, "DO IF(GET_LOCK('"+fl+"', "+secs+") = 1,"+
					" IF(GET_LOCK('"+kl+"', "+secs+") = 1, RELEASE_LOCK('"+kl+"'), 0) + RELEASE_LOCK('"+fl+"'), 0)")
				if err != nil {
					// The statement may have taken a lock before it
					// failed, or go on waiting on the server past a
					// cancelled context: the session goes, not back to
					// the pool.
					s.discard(conn, r.connID)
				} else {
					conn.Close()
				}
				if err != nil && !connLost(ctx, err) {
					return store.Result{}, unavailable("claim", err)
				}
				continue
			}
			conn.Close()
		case gotBoth:
			res, err := conn.ExecContext(ctx, s.claimWrite(r, key, c, life))
			var n int64
			if err == nil {
				n, err = res.RowsAffected()
			}
			kl, _ := s.locks(key, c.Fingerprint)
			s.letGo(conn, r.connID, kl, nil, nil)
			if err != nil {
				if isNumber(err, errDupKey) || connLost(ctx, err) {
					lastErr = err
					continue
				}
				return store.Result{}, unavailable("claim", err)
			}
			if n == 1 {
				return store.Result{State: store.Claimed, Fingerprint: c.Fingerprint}, nil
			}
			continue // the row changed between the statements
		default:
			conn.Close()
		}
		res, err := r.result(c)
		if err != nil {
			return store.Result{}, fmt.Errorf("idemkey: mysql: claim: %w", err)
		}
		return res, nil
	}
	return store.Result{}, unavailable("claim", sqlcore.GaveUp(lastErr))
}

// waitFor is how long a plain claim that met a key being claimed waits
// for it: 100 ms, or a third of what is left of the call's budget; 0 when
// that is under 10 ms.
func waitFor(ctx context.Context) time.Duration {
	wait := 100 * time.Millisecond
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)/3)
	}
	if wait < 10*time.Millisecond {
		return 0
	}
	return wait
}

// letGo lets go of every named lock conn holds, the key's lock kl first
// (letGoOfLocks), and gives it back to the pool, in the background. A connection that fails this is closed, and
// its session killed, which releases its locks on the server. cancel,
// when not nil, ends tx's context once tx is rolled back, not before:
// database/sql rolls back a transaction whose context ends on a goroutine
// of its own, which could then run after the statement that lets go of
// the locks and turns autocommit on, which commits what is open.
func (s *Store) letGo(conn *sql.Conn, connID int64, kl string, tx *sql.Tx, cancel context.CancelFunc) {
	s.bg.run(func() {
		if cancel != nil {
			defer cancel()
		}
		if tx != nil {
			// The transaction was ended by a COMMIT or ROLLBACK sent as
			// a statement (bounded by the call's context, as the
			// driver's own are not), AND CHAIN: database/sql is told
			// now, with a ROLLBACK that ends the transaction the chain
			// began (empty, unless a late statement of the handler's
			// landed in it: then that is undone), so that the
			// connection can go back. A ROLLBACK that failed leaves that
			// transaction open, and the statement that lets go of the
			// locks turns autocommit on, which would commit it: such a
			// connection is closed and its session killed instead.
			if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
				s.discard(conn, connID)
				return
			}
		}
		ctx, stop := context.WithTimeout(context.Background(), s.commitTimeout)
		defer stop()
		s.release(ctx, conn, connID, kl)
	})
}

// release lets go of every named lock conn holds, the key's lock kl first,
// and gives it back to the pool; it closes a connection that fails this,
// and kills its session.
func (s *Store) release(ctx context.Context, conn *sql.Conn, connID int64, kl string) error {
	if _, err := conn.ExecContext(ctx, releaseLocks(kl)); err != nil {
		s.discard(conn, connID)
		return err
	}
	conn.Close()
	return nil
}

// discard closes conn, not to be pooled again: its session's state is not
// known (it may hold a transaction or a named lock). When connID is known
// the session is also killed from another connection, in the background:
// a server only notices a closed connection when it next reads from it,
// and a session still running a statement keeps its locks until then.
func (s *Store) discard(conn *sql.Conn, connID int64) {
	if connID > 0 {
		s.bg.run(func() { s.kill(connID) })
	}
	conn.Raw(func(any) error { return driver.ErrBadConn })
}

// kill ends the server session connID from another pool connection (its
// transaction rolls back and its named locks are let go of). A session
// that has ended already is no error: its id is never given to another.
func (s *Store) kill(connID int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.commitTimeout)
	defer cancel()
	_, err := s.db.ExecContext(ctx, "KILL CONNECTION "+intLit(connID))
	if err != nil && !isNumber(err, errNoSuchThread) {
		slog.Warn("idemkey: mysql: ending a claim's session failed; the server ends it when it notices its connection closed", "connection_id", connID, "error", err)
		return err
	}
	return nil
}

// MySQL's error numbers the store tells apart.
const (
	errDupKey          = 1062 // ER_DUP_ENTRY
	errNoSuchTable     = 1146 // ER_NO_SUCH_TABLE
	errBadField        = 1054 // ER_BAD_FIELD_ERROR
	errUnknownVariable = 1193 // ER_UNKNOWN_SYSTEM_VARIABLE
	errNoSuchThread    = 1094 // ER_NO_SUCH_THREAD
	errLockDeadlock    = 1213 // ER_LOCK_DEADLOCK
	errLockWaitTimeout = 1205 // ER_LOCK_WAIT_TIMEOUT
	errLockNowait      = 3572 // ER_LOCK_NOWAIT (MySQL 8: NOWAIT met a lock)
	errTableNotLocked  = 1100 // ER_TABLE_NOT_LOCKED (a statement outside the tables LOCK TABLES took)
	errReadOnlyOption  = 1290 // ER_OPTION_PREVENTS_STATEMENT (read_only, super_read_only)
	errReadOnlyTx      = 1792 // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
	errReadOnlyInnoDB  = 1874 // ER_INNODB_READ_ONLY (innodb_read_only)
)

// isNumber reports whether err is the server's error number n.
func isNumber(err error, n uint16) bool {
	me, ok := errors.AsType[*mysql.MySQLError](err)
	return ok && me.Number == n
}

// connLost reports whether err is a connection that failed (closed by the
// server, reset, cut short) while ctx is still live: then the call may
// start again on another connection. Every statement of the store is safe
// to run twice: a claim that landed answers Mine, a complete that landed
// answers as kept, a release that landed finds the key free.
func connLost(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if _, ok := errors.AsType[*mysql.MySQLError](err); ok {
		return false // the server answered
	}
	return sqlcore.Transport(err) || errors.Is(err, mysql.ErrInvalidConn)
}

// Complete replaces the claim held by token with rec, kept for retention
// (rounded up to whole microseconds; must be positive): one round trip
// (two when it keeps nothing, to tell a resent Complete from a lost
// claim). It returns nil without writing when key already holds a record
// kept under token, store.ErrNotOwner when token does not hold the claim,
// and an error wrapping store.ErrUnavailable when the backend fails: then
// the record may or may not have been kept.
func (s *Store) Complete(ctx context.Context, key, token string, rec *store.Record, retention time.Duration) error {
	ret, header, err := checkRecord(token, rec, retention)
	if err != nil {
		return err
	}
	ctx, cancel, err := s.call(ctx, "complete")
	if err != nil {
		return err
	}
	defer cancel()
	stmt, args := s.sql.keep(key, token, rec, header, ret, 0)
	return s.owned(ctx, "complete", s.sql.noWait(stmt), args, key, token, func(st rowState) (bool, error) {
		switch {
		case st.mine && st.kept && st.live:
			return false, nil // a resent Complete
		case st.mine && !st.kept && st.live:
			// The row changed between the statements, or another
			// transaction held it a moment (a claim that met it).
			return true, nil
		}
		return false, store.ErrNotOwner
	})
}

// Release deletes the claim held by token: one round trip (two when it
// deletes nothing). It returns nil when key holds nothing (or a row whose
// life is over), store.ErrNotOwner when another token or a record holds
// it, and an error wrapping store.ErrUnavailable when the backend fails.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if token == "" {
		return errors.New("idemkey: mysql: release: empty owner token")
	}
	ctx, cancel, err := s.call(ctx, "release")
	if err != nil {
		return err
	}
	defer cancel()
	return s.owned(ctx, "release", s.sql.noWait(s.sql.release(key, token)), nil, key, token, func(st rowState) (bool, error) {
		switch {
		case !st.found || !st.live:
			return false, nil
		case st.mine && !st.kept:
			return true, nil // the row changed between the statements, or was held a moment
		}
		return false, store.ErrNotOwner
	})
}

// Extend sets the remaining life of the claim held by token to ttl
// (rounded up to whole microseconds; must be positive), in one round trip.
// It returns store.ErrNotOwner when token does not hold a live claim, and
// an error wrapping store.ErrUnavailable when the backend fails.
func (s *Store) Extend(ctx context.Context, key, token string, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("idemkey: mysql: claim TTL %v, want > 0", ttl)
	}
	ctx, cancel, err := s.call(ctx, "extend")
	if err != nil {
		return err
	}
	defer cancel()
	return s.owned(ctx, "extend", s.sql.noWait(s.sql.extend(key, token, microsOf(ttl))), nil, key, token, func(st rowState) (bool, error) {
		if st.mine && !st.kept && st.live {
			return true, nil // held a moment by another transaction
		}
		return false, store.ErrNotOwner
	})
}

// owned runs stmt, a change to the row of key that token's claim fences,
// until it changes one row, which is success. When it changes none (or
// another transaction holds the row) settle reads the row's state and
// says whether to ask again after a pause, or what the call answers. A
// row held a moment by another transaction (a claim that met it, or the
// sweeper, whose scan of the expires_us index locks the live row where its
// range ends) is asked for again until ctx ends, not a fixed number of
// times: a Release that gave up would leave the key held for the rest of
// its claim's life. A lost connection asks again, at most sqlcore.Attempts
// times; any other failure wraps store.ErrUnavailable, naming op. ctx
// bounds it all.
func (s *Store) owned(ctx context.Context, op, stmt string, args []any, key, token string, settle func(rowState) (again bool, err error)) error {
	lost := 0
	attempt := func() (sqlcore.Outcome, error) {
		n, err := s.exec(ctx, stmt, args...)
		if isNumber(err, errLockWaitTimeout) {
			// Another transaction holds the row: see what it was.
			n, err = 0, nil
		}
		if err == nil && n == 1 {
			return sqlcore.Done, nil
		}
		var st rowState
		if err == nil {
			st, err = s.state(ctx, key, token)
		}
		if err != nil {
			if connLost(ctx, err) {
				lost++
				return sqlcore.Lost, err
			}
			return sqlcore.Done, unavailable(op, err)
		}
		again, err := settle(st)
		if !again {
			return sqlcore.Done, err
		}
		if err := ctx.Err(); err != nil {
			return sqlcore.Done, unavailable(op, fmt.Errorf("the key's row stayed held by another transaction until the call's budget ended: %w", err))
		}
		return sqlcore.Again, nil
	}
	for {
		done, err := sqlcore.Retry(ctx, 5*time.Millisecond, attempt)
		if done {
			return err
		}
		if lost >= sqlcore.Attempts {
			return unavailable(op, err)
		}
	}
}

// exec runs stmt on the pool and returns the rows it affected.
func (s *Store) exec(ctx context.Context, stmt string, args ...any) (int64, error) {
	res, err := s.db.ExecContext(ctx, stmt, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// rowState is what a key's row is to a token (statements.state).
type rowState struct{ found, mine, kept, live bool }

func (s *Store) state(ctx context.Context, key, token string) (rowState, error) {
	var st rowState
	err := s.db.QueryRowContext(ctx, s.sql.state(key, token)).Scan(&st.mine, &st.kept, &st.live)
	if errors.Is(err, sql.ErrNoRows) {
		return rowState{}, nil
	}
	st.found = err == nil
	return st, err
}

// Sweep deletes the rows whose life is over, in batches of WithSweepBatch
// rows, each a READ COMMITTED transaction of its own that skips rows
// another transaction holds, until a batch finds fewer than that. It
// returns how many rows it deleted. Backend failures wrap
// store.ErrUnavailable. The background sweeper calls it every
// WithSweepInterval; services that turn that off call it themselves.
func (s *Store) Sweep(ctx context.Context) (int64, error) {
	n, err := sqlcore.SweepBatches(ctx, s.sweepBatch, s.sweepBatchOnce)
	if err != nil {
		return n, unavailable("sweep", err)
	}
	return n, nil
}

// sweepBatchOnce deletes one batch: it returns how many rows it deleted
// and how many it found.
func (s *Store) sweepBatchOnce(ctx context.Context) (int64, int64, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, 0, err
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, s.sql.sweepSelect(s.sweepBatch))
	if err != nil {
		return 0, 0, err
	}
	var keys [][]byte
	for rows.Next() {
		var k []byte
		if err := rows.Scan(&k); err != nil {
			rows.Close()
			return 0, 0, err
		}
		keys = append(keys, k)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, 0, err
	}
	if len(keys) == 0 {
		return 0, 0, tx.Commit()
	}
	res, err := tx.ExecContext(ctx, s.sql.sweepDelete(keys))
	if err != nil {
		return 0, 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, 0, err
	}
	return n, int64(len(keys)), tx.Commit()
}

// call bounds a call by the store's budget (WithCallTimeout). A ctx that
// has ended already is an error wrapping store.ErrUnavailable, naming op.
func (s *Store) call(ctx context.Context, op string) (context.Context, context.CancelFunc, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, unavailable(op, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	return ctx, cancel, nil
}

// unavailable wraps a backend failure so that errors.Is finds both
// store.ErrUnavailable and the cause.
func unavailable(op string, err error) error {
	return fmt.Errorf("idemkey: mysql: %s: %w: %w", op, store.ErrUnavailable, err)
}

// checkClaim checks a claim and returns its life in microseconds.
func checkClaim(key string, c store.Claim) (int64, error) {
	switch {
	case c.Token == "":
		return 0, errors.New("idemkey: mysql: claim: empty owner token")
	case len(c.Token) > maxToken:
		return 0, fmt.Errorf("idemkey: mysql: claim: owner token of %d bytes, want at most %d", len(c.Token), maxToken)
	case key == "" || len(key) > maxKey:
		return 0, fmt.Errorf("idemkey: mysql: claim: key of %d bytes, want 1 to %d (a name store.KeyName makes)", len(key), maxKey)
	case c.TTL <= 0:
		return 0, fmt.Errorf("idemkey: mysql: claim TTL %v, want > 0", c.TTL)
	}
	return microsOf(c.TTL), nil
}

// checkRecord checks what Complete and Commit keep, and returns the
// retention in microseconds and the header block.
func checkRecord(token string, rec *store.Record, retention time.Duration) (int64, []byte, error) {
	switch {
	case token == "":
		return 0, nil, errors.New("idemkey: mysql: complete: empty owner token")
	case rec == nil:
		return 0, nil, errors.New("idemkey: mysql: nil record")
	case rec.Status < 0 || rec.Status > 0x7fff:
		return 0, nil, fmt.Errorf("idemkey: mysql: status %d out of range", rec.Status)
	case retention <= 0:
		return 0, nil, fmt.Errorf("idemkey: mysql: retention %v, want > 0", retention)
	}
	return microsOf(retention), sqlcore.EncodeHeader(rec.Header), nil
}
