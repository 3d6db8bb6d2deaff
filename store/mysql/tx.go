package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/idemkey/idemkey/internal/sqlcore"
	"github.com/idemkey/idemkey/store"
)

// ErrPoolExhausted is the cause (inside an error wrapping
// store.ErrUnavailable) of a claim that found no free pool connection
// within its time budget: every connection was held by a request whose
// handler still ran. The request was not run. Size the pool for the
// requests served at once (see the package documentation).
var ErrPoolExhausted = errors.New("idemkey: mysql: no free pool connection within the call's budget (every connection is held by a running request: size the pool for the requests served at once)")

// holdLife is the life of the claim's row in a request's transaction. The
// row is seen by no one while the transaction runs; it matters only when
// the handler commits the transaction itself (or runs a statement that
// commits it, as DDL does): then its writes are in, and the key stays
// claimed that long (a repeat answers 409; an operator can free it sooner
// with idemctl delete) rather than run them again. It is the middleware's
// default retention.
const holdLife = 24 * time.Hour

// commitChain and rollbackChain end the request's transaction, sent as
// statements so that the call's budget bounds them. Each begins another
// transaction at once (AND CHAIN), which database/sql ends after with a
// ROLLBACK of its own (letGo): until then it still takes the handler's
// statements, and a statement that a goroutine of the handler sends late,
// in between, lands in that transaction and is rolled back with it, where
// a session left in autocommit would commit it on its own (after a
// rollback that freed the key, a retry would then make the write again).
const (
	commitChain   = "COMMIT AND CHAIN"
	rollbackChain = "ROLLBACK AND CHAIN"
)

// unlockTables lets go of the table locks a handler took with LOCK
// TABLES; when it holds some, it also commits what is open.
const unlockTables = "UNLOCK TABLES"

// txKey is the context key of a request's transaction.
type txKey struct{}

// Tx returns the transaction of the request whose context is ctx: the one
// the middleware opened for the handler on a Store, in which it keeps the
// response. The handler makes its writes through it, so that they and the
// kept response commit together or not at all. Every covered request runs
// in one, with a key or, on a route where the key is optional, without
// (then nothing is kept, and the writes commit before the response goes
// out). It returns nil only outside the middleware's flow: a method it
// does not cover (GET, by default), or a store that is not this package's.
//
// The handler does not commit or roll it back: the middleware commits it,
// with the record, after a response it keeps, and rolls it back after a
// 5xx or a panic. A handler that calls its Commit anyway commits its
// writes and the claim with them: a kept answer is still kept, and after a
// 5xx or a panic the key stays held (for 24 hours; repeats get 409) so
// that a retry cannot make the writes twice. A handler that calls its
// Rollback takes the claim with it: nothing is kept, the answer is 503,
// and the transaction refuses the handler's later statements
// (sql.ErrTxDone). Never run COMMIT, ROLLBACK or SET autocommit as SQL
// through it; DDL and LOCK TABLES commit implicitly, and count as a Commit.
func Tx(ctx context.Context) *sql.Tx {
	tx, _ := ctx.Value(txKey{}).(*sql.Tx)
	return tx
}

// ClaimTx claims key in the transaction the handler will run in, on a
// connection it takes from the pool for the request, and held until
// Commit or Rollback. Its first statement reads the key's row and, when no
// live row holds it, takes the claim's two named locks; then the
// transaction begins and the claim's row is written in it (not
// committed). When the answer is not Claimed the connection goes back to
// the pool at once, holding nothing, and tx is nil; a live row with c's
// own token is reported InFlight, as ClaimTx hands out a transaction only
// for a claim it made.
//
// The claim holds the two locks and the uncommitted row, all of which end
// with the connection's session: an owner whose process or connection
// dies is replaced at once. A live owner's session is killed at the
// claim's life (c.TTL), and the keep is fenced by that life on the
// server's clock, so a late commit never lands.
//
// The wait for a free connection counts against the call's time budget
// (WithCallTimeout); past it ClaimTx returns an error wrapping
// store.ErrUnavailable and ErrPoolExhausted.
func (s *Store) ClaimTx(ctx context.Context, key string, c store.Claim) (store.Result, store.Tx, error) {
	if _, err := checkClaim(key, c); err != nil {
		return store.Result{}, nil, err
	}
	callCtx, cancel, err := s.call(ctx, "claim")
	if err != nil {
		return store.Result{}, nil, err
	}
	defer cancel()
	life := microsOf(holdLife + c.TTL)
	var lastErr error
	for range sqlcore.Attempts {
		conn, err := s.conn(callCtx, "claim")
		if err != nil {
			return store.Result{}, nil, err
		}
		r, err := s.readClaim(callCtx, conn, key, c)
		// The claim's life is counted from here, which is after the
		// server's clock reading that its keep is fenced by (r.nowUS):
		// the watchdog never ends a session before that life is over.
		read := time.Now()
		if err != nil {
			s.discard(conn, 0)
			if connLost(callCtx, err) {
				lastErr = err
				continue
			}
			return store.Result{}, nil, unavailable("claim", err)
		}
		switch r.kind {
		case heldByThis:
			s.discard(conn, r.connID)
			lastErr = errors.New("a pooled connection held a named lock of the store")
			continue
		case changed:
			conn.Close()
			continue
		case gotBoth:
			tx, claimed, err := s.begin(ctx, callCtx, conn, r, read, key, c, life)
			switch {
			case err != nil && (connLost(callCtx, err) || isNumber(err, errLockDeadlock)):
				lastErr = err
				continue
			case err != nil:
				return store.Result{}, nil, unavailable("claim", err)
			case !claimed:
				continue // the row changed after the first statement: ask again
			}
			return store.Result{State: store.Claimed, Fingerprint: c.Fingerprint}, tx, nil
		}
		conn.Close()
		res, err := r.result(c)
		if err != nil {
			return store.Result{}, nil, fmt.Errorf("idemkey: mysql: claim: %w", err)
		}
		if res.State == store.Mine {
			// A committed row in flight under c's token (a plain claim
			// resent with it): ClaimTx hands out a transaction only for
			// a claim it made.
			res.State = store.InFlight
		}
		return res, nil, nil
	}
	return store.Result{}, nil, unavailable("claim", sqlcore.GaveUp(lastErr))
}

// begin begins the request's transaction on conn, whose session holds the
// claim's locks, and writes the claim's row in it. It reports false (the
// transaction rolled back, the locks let go of) when the row changed
// after the first statement read it. On an error the connection is closed
// and its session killed. The claim's life (c.TTL) runs from read, when
// the first statement had answered: the watchdog ends the session at that
// life, and a claim whose life is over before its row is written is not
// handed out.
func (s *Store) begin(ctx, callCtx context.Context, conn *sql.Conn, r claimRow, read time.Time, key string, c store.Claim, life int64) (*requestTx, bool, error) {
	// The transaction's context is the request's without its end: the
	// middleware ends the transaction, and database/sql would roll back
	// at the context's end, behind its back.
	if _, err := conn.ExecContext(callCtx, noAutocommit); err != nil {
		s.discard(conn, r.connID)
		return nil, false, err
	}
	txCtx, txCancel := context.WithCancel(context.WithoutCancel(ctx))
	tx, err := beginTx(callCtx, txCtx, txCancel, conn, s.txOptions)
	if err != nil {
		txCancel()
		s.discard(conn, r.connID)
		return nil, false, err
	}
	fail := func(err error) (*requestTx, bool, error) {
		tx.Rollback()
		txCancel()
		s.discard(conn, r.connID)
		return nil, false, err
	}
	res, err := tx.ExecContext(callCtx, s.claimWrite(r, key, c, life))
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if isNumber(err, errDupKey) {
		// A row was committed after the first statement read none (its
		// owner let go of the key just before this claim took it):
		// nothing was written; ask again.
		n, err = 0, nil
	}
	if err == nil && n == 1 && callCtx.Err() != nil {
		// The write landed, and the call's budget ended before its
		// answer was taken: the driver closes a connection whose
		// context ends while it waits, the claim's session with it, and
		// may have done so already. The claim is not handed out.
		err = context.Cause(callCtx)
	}
	left := c.TTL - time.Since(read)
	if err == nil && n == 1 && left <= 0 {
		// The claim's life ended while it was being made: its keep
		// would be fenced, and the handler would run for nothing.
		err = fmt.Errorf("the claim's life (%v) ended before its row was written", c.TTL)
	}
	if err != nil {
		return fail(err)
	}
	if n != 1 {
		// The caller asks again, on another connection: the locks are
		// let go of first, not in the background, or it would meet
		// them, held for itself, and answer in flight.
		if err := tx.Rollback(); err != nil {
			txCancel()
			s.discard(conn, r.connID)
			return nil, false, err
		}
		txCancel()
		kl, _ := s.locks(key, c.Fingerprint)
		if err := s.release(callCtx, conn, r.connID, kl); err != nil {
			return nil, false, err
		}
		return nil, false, nil
	}
	kl, _ := s.locks(key, c.Fingerprint)
	t := &requestTx{s: s, conn: conn, tx: tx, cancel: txCancel, key: key, kl: kl, token: c.Token, fp: c.Fingerprint, life: c.TTL,
		deadlineUS: r.nowUS + microsOf(c.TTL), connID: r.connID}
	t.watch(left)
	return t, true, nil
}

// beginTx begins the request's transaction on conn, with txCtx for its
// life (database/sql rolls it back when txCtx ends), and within callCtx:
// when the call's budget ends before the server has answered, txCtx is
// ended, which closes the connection.
func beginTx(callCtx, txCtx context.Context, txCancel context.CancelFunc, conn *sql.Conn, opts *sql.TxOptions) (*sql.Tx, error) {
	stop := context.AfterFunc(callCtx, txCancel)
	tx, err := conn.BeginTx(txCtx, opts)
	if !stop() {
		// The budget ended while START TRANSACTION ran.
		if err == nil {
			tx.Rollback()
		}
		return nil, context.Cause(callCtx)
	}
	return tx, err
}

// Begin opens a transaction with no claim, for a request without a key on
// a route where the key is optional: START TRANSACTION, on a connection
// held until Commit or Rollback (which rolls back a 4xx's writes, unless
// WithClientErrorWrites(true)). The handler gets it with Tx, as it would
// with a key.
func (s *Store) Begin(ctx context.Context) (store.Tx, error) {
	callCtx, cancel, err := s.call(ctx, "begin")
	if err != nil {
		return nil, err
	}
	defer cancel()
	conn, err := s.conn(callCtx, "begin")
	if err != nil {
		return nil, err
	}
	txCtx, txCancel := context.WithCancel(context.WithoutCancel(ctx))
	tx, err := beginTx(callCtx, txCtx, txCancel, conn, s.txOptions)
	if err != nil {
		txCancel()
		s.discard(conn, 0)
		return nil, unavailable("begin", err)
	}
	return &requestTx{s: s, conn: conn, tx: tx, cancel: txCancel}, nil
}

// requestTx is the store.Tx of one request: the connection its session
// runs on and the transaction, begun by ClaimTx (key set) or Begin (key
// "").
type requestTx struct {
	s      *Store
	conn   *sql.Conn
	tx     *sql.Tx
	cancel context.CancelFunc // the transaction's context
	key    string
	kl     string // the key's named lock ("" with no key)
	token  string
	fp     [32]byte      // the claim's fingerprint
	life   time.Duration // the claim's
	// deadlineUS is when the claim's life ends, on the server's clock
	// (its claim's first statement's reading, plus the life).
	deadlineUS int64
	connID     int64 // the session's, for KILL

	mu      sync.Mutex
	ended   bool
	expired bool        // the watchdog killed the session
	timer   *time.Timer // the watchdog

	// handed: the connection went to letGo (giveBack), which ends the
	// transaction's context once it has rolled the transaction back.
	handed bool
}

// giveBack hands the connection to letGo, with tx (when the *sql.Tx is
// still to be told the transaction ended) and the transaction's context,
// which letGo ends after tx's ROLLBACK.
func (t *requestTx) giveBack(tx *sql.Tx) {
	t.handed = true
	t.s.letGo(t.conn, t.connID, t.kl, tx, t.cancel)
}

// drop rolls the transaction back as database/sql sees it and closes the
// connection, killing its session: nothing it holds is to be trusted.
func (t *requestTx) drop() {
	t.tx.Rollback()
	t.s.discard(t.conn, t.connID)
}

var _ store.Tx = (*requestTx)(nil)

// watch arms the watchdog: at the claim's life, a request that has not
// ended has its session killed (its owner stalled past the route's
// deadline, in a handler that ignores its context), so that the key is
// not held by it, nor its commit lands after a retry could have run. The
// KILL is sent from another pool connection, within WithCommitTimeout;
// when it cannot be, the keep's fence (the claim's life, on the server's
// clock) still refuses the late commit.
func (t *requestTx) watch(life time.Duration) {
	t.timer = time.AfterFunc(life, t.expire)
}

// expire is the watchdog's work.
func (t *requestTx) expire() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.ended {
		t.expired = true
		t.s.kill(t.connID)
	}
}

// NewContext returns ctx carrying the transaction, which the handler gets
// back with Tx.
func (t *requestTx) NewContext(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, t.tx)
}

// end marks the request ended and stops the watchdog. It reports false
// when it had already ended, and whether the watchdog had killed the
// session.
func (t *requestTx) end() (first, expired bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return false, t.expired
	}
	t.ended = true
	if t.timer != nil {
		t.timer.Stop()
	}
	return true, t.expired
}

// Commit keeps rec in the transaction, fenced by the owner's token and the
// claim's life on the server's clock, and commits: two round trips, the
// fenced UPDATE and COMMIT (three for a kept 4xx whose writes are undone:
// the whole transaction rolled back, then the record on its own, see
// commitAlone); the claim's locks are let go of after, in the background. It returns store.ErrNotOwner when the claim
// is no longer this request's (its life is over): the transaction is then
// rolled back and nothing is kept. Any other error means the commit failed
// or its outcome is unknown; it wraps store.ErrUnavailable. The call is
// bounded by WithCommitTimeout.
//
// When the handler ended the transaction itself (its Commit or Rollback,
// or DDL), the claim's row committed with its writes or rolled back with
// them: a committed claim gets its record in a statement of its own, and
// one that rolled back keeps nothing (an error says so) and frees the key.
//
// A transaction with no claim (Begin) commits the handler's writes and
// keeps nothing.
func (t *requestTx) Commit(ctx context.Context, rec *store.Record, retention time.Duration) error {
	first, expired := t.end()
	if !first {
		return errors.New("idemkey: mysql: commit: the transaction already ended")
	}
	defer func() {
		if !t.handed {
			t.cancel()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, t.s.commitTimeout)
	defer cancel()
	if expired {
		// The claim's life is over: its session was killed.
		t.drop()
		return store.ErrNotOwner
	}
	var (
		ret    int64
		header []byte
		err    error
	)
	if t.key != "" {
		if ret, header, err = checkRecord(t.token, rec, retention); err != nil {
			t.abort(ctx)
			return err
		}
	} else if rec == nil {
		t.abort(ctx)
		return errors.New("idemkey: mysql: nil record")
	}
	if t.key == "" && t.s.undo4xx && rec.Status >= 400 {
		// No claim to keep, and the writes are to be undone: a rollback,
		// as Begin sends nothing else.
		t.abort(ctx)
		return nil
	}
	if t.s.undo4xx && rec.Status >= 400 {
		return t.commitAlone(ctx, rec, header, ret)
	}
	if t.key != "" {
		stmt, args := t.s.sql.keep(t.key, t.token, rec, header, ret, microsOf(t.life))
		res, err := t.tx.ExecContext(ctx, stmt, args...)
		var n int64
		if err == nil {
			n, err = res.RowsAffected()
		}
		switch {
		case errors.Is(err, sql.ErrTxDone):
			return t.commitOutside(ctx, rec, header, ret)
		case isNumber(err, errTableNotLocked):
			// The handler took LOCK TABLES, which committed the
			// transaction up to it, the claim with it, as DDL does: it
			// counts as the handler's own commit. UNLOCK TABLES commits
			// what it wrote since, and the record is kept on its own.
			if _, err := t.tx.ExecContext(ctx, unlockTables); err != nil {
				t.drop()
				return unavailable("commit", err)
			}
			t.tx.Rollback()
			return t.commitOutside(ctx, rec, header, ret)
		case err != nil:
			// Nothing committed (or the connection is gone, and the
			// transaction with it).
			t.abort(ctx)
			return unavailable("commit", err)
		case n != 1 && t.rowLost(ctx):
			return t.lost(ctx, "commit")
		case n != 1:
			// Fenced: the claim's life is over. Keep nothing.
			t.abort(ctx)
			return store.ErrNotOwner
		}
	}
	if _, err := t.tx.ExecContext(ctx, commitChain); err != nil {
		if errors.Is(err, sql.ErrTxDone) {
			return t.commitOutside(ctx, rec, header, ret)
		}
		// Refused by the server (rolled back), or the reply was lost or
		// late (the outcome is unknown; the driver closed the
		// connection): either way the session is not to be trusted with
		// the claim's locks.
		t.drop()
		return unavailable("commit", err)
	}
	t.giveBack(t.tx)
	return nil
}

// commitAlone keeps rec, a kept 4xx whose writes are undone: the request's
// transaction rolls back whole (its claim's row with it: no savepoint),
// and the record is written in the transaction the rollback chains,
// fenced by the claim's named lock, which the session still holds, and by
// its life, then committed. Three round trips, as a keep's two and the
// rollback. The rollback also undoes what the handler wrote after a
// statement that committed the transaction (DDL, LOCK TABLES) or after
// the server rolled it back by itself (a deadlock's victim); what such a
// statement committed stays, and the record is then kept over the claim
// it committed.
func (t *requestTx) commitAlone(ctx context.Context, rec *store.Record, header []byte, ret int64) error {
	_, err := t.tx.ExecContext(ctx, rollbackChain)
	switch {
	case errors.Is(err, sql.ErrTxDone):
		return t.commitOutside(ctx, rec, header, ret)
	case err != nil:
		t.drop()
		return unavailable("commit", err)
	}
	stmt, args := t.s.sql.keepAlone(t.key, t.kl, t.token, rec, header, ret, t.deadlineUS)
	res, err := t.tx.ExecContext(ctx, stmt, args...)
	if isNumber(err, errTableNotLocked) {
		// Tables the handler locked (LOCK TABLES) refuse the record's:
		// let go of them (what was written under them is rolled back).
		if _, err = t.tx.ExecContext(ctx, unlockTables); err == nil {
			res, err = t.tx.ExecContext(ctx, stmt, args...)
		}
	}
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	switch {
	case err != nil:
		t.drop()
		return unavailable("commit", err)
	case n == 0:
		// Fenced: the claim's life is over. Keep nothing.
		t.abort(ctx)
		return store.ErrNotOwner
	}
	if _, err := t.tx.ExecContext(ctx, commitChain); err != nil {
		t.drop()
		return unavailable("commit", err)
	}
	t.giveBack(t.tx)
	return nil
}

// commitOutside keeps rec after the handler ended the transaction itself
// (its Commit or Rollback, or a statement that commits implicitly): the
// claim's row committed with the handler's writes or rolled back with
// them. A committed claim gets its record, fenced by the owner's token, in
// a statement of its own: the writes are in, and the answer is theirs. A
// claim that rolled back took the writes with it: nothing is kept, and the
// key is free.
func (t *requestTx) commitOutside(ctx context.Context, rec *store.Record, header []byte, ret int64) error {
	if t.key == "" {
		t.giveBack(nil)
		return nil
	}
	// Tables the handler locked (LOCK TABLES) would refuse the record's
	// table; what it wrote since is rolled back or committed by now.
	if _, err := t.conn.ExecContext(ctx, unlockTables); err != nil {
		t.s.discard(t.conn, t.connID)
		return unavailable("commit", err)
	}
	stmt, args := t.s.sql.keep(t.key, t.token, rec, header, ret, -1)
	res, err := t.conn.ExecContext(ctx, stmt, args...)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err == nil {
		// Autocommit is off: the record, and whatever the handler sent
		// after its own end, are in a transaction of their own. They
		// commit when the claim committed with the handler's writes (the
		// key is this request's); else that transaction followed the
		// claim's rollback, and goes the same way.
		end := "ROLLBACK"
		if n == 1 {
			end = "COMMIT"
		}
		_, err = t.conn.ExecContext(ctx, end)
	}
	if err != nil {
		t.s.discard(t.conn, t.connID)
		return unavailable("commit", err)
	}
	if err := t.s.release(ctx, t.conn, t.connID, t.kl); err != nil && n != 1 {
		return unavailable("commit", err)
	}
	if n != 1 {
		return unavailable("commit", errors.New("the handler rolled the request's transaction back itself; nothing was kept"))
	}
	return nil
}

// errEndedOutside is what Rollback reports when the handler's own commit
// committed the claim with its writes: the key is then held, not freed.
var errEndedOutside = errors.New("the handler committed the request's transaction itself (its Commit, or DDL); its writes are in, so the key is held for " + holdLife.String() + " instead of being freed for a retry")

// Rollback rolls the transaction back and lets go of the claim's locks:
// three round trips bounded by WithCommitTimeout, a read that the claim's
// row is still the transaction's, ROLLBACK, and one statement that lets go
// of the locks and checks that the claim is not committed. The key is then free. When it fails the connection is
// closed and its session killed, which rolls back on the server; the error
// wraps store.ErrUnavailable. When the handler had committed the
// transaction itself (its Commit, or DDL), its writes are in: the key
// stays held, and the error says so.
func (t *requestTx) Rollback(ctx context.Context) error {
	first, expired := t.end()
	if !first {
		return errors.New("idemkey: mysql: rollback: the transaction already ended")
	}
	defer func() {
		if !t.handed {
			t.cancel()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, t.s.commitTimeout)
	defer cancel()
	if expired {
		t.drop()
		return nil
	}
	if t.key != "" && t.rowLost(ctx) {
		return t.lost(ctx, "rollback")
	}
	if _, err := t.tx.ExecContext(ctx, rollbackChain); err != nil && !errors.Is(err, sql.ErrTxDone) {
		t.drop()
		return unavailable("rollback", err)
	}
	if t.key == "" {
		t.giveBack(t.tx)
		return nil
	}
	var held bool
	var released sql.NullInt64
	err := t.conn.QueryRowContext(ctx, t.s.sql.heldRelease(t.key, t.kl, t.token)).Scan(&held, &released)
	if isNumber(err, errTableNotLocked) {
		// The handler took LOCK TABLES, which committed the transaction
		// up to it, the claim with it (as DDL does); what it wrote since
		// is rolled back. The tables are let go of, and the claim read.
		if _, err = t.tx.ExecContext(ctx, unlockTables); err == nil {
			err = t.conn.QueryRowContext(ctx, t.s.sql.heldRelease(t.key, t.kl, t.token)).Scan(&held, &released)
		}
	}
	if err != nil {
		t.drop()
		return unavailable("rollback", err)
	}
	t.giveBack(t.tx) // the locks went with the statement above; the next one turns autocommit back on
	if held {
		return unavailable("rollback", errEndedOutside)
	}
	return nil
}

// errLost is what Commit and Rollback report for a request whose
// transaction the server rolled back by itself.
var errLost = errors.New("the server rolled the request's transaction back by itself (a deadlock's victim?), its claim with it; what the handler sent after that may have committed on its own, so the key is held for " + holdLife.String() + " instead of being freed for a retry")

// rowLost reports whether the request's transaction no longer holds the
// claim's row although neither the store nor the handler ended it: the
// server rolled it back by itself (a deadlock's victim). database/sql
// still holds the *sql.Tx open then, and each statement the handler sent
// after it committed on its own, outside any transaction.
func (t *requestTx) rowLost(ctx context.Context) bool {
	var mine bool
	err := t.tx.QueryRowContext(ctx, t.s.sql.mine(t.key, t.token)).Scan(&mine)
	return err == nil && !mine
}

// lost ends a request whose transaction the server rolled back by itself
// (rowLost): the key is held, a claim in flight committed for holdLife,
// as after the handler's own commit, rather than freed for a retry that
// could make again what the handler wrote since. It reports errLost.
func (t *requestTx) lost(ctx context.Context, op string) error {
	_, err := t.tx.ExecContext(ctx, "ROLLBACK") // plainly, then the hold in a transaction of its own
	if err == nil {
		_, err = t.conn.ExecContext(ctx, t.s.sql.hold(t.key, t.token, t.fp, microsOf(holdLife+t.life)))
	}
	if err == nil {
		_, err = t.conn.ExecContext(ctx, "COMMIT")
	}
	if err != nil {
		t.drop()
		return unavailable(op, fmt.Errorf("%w; holding the key failed: %w", errLost, err))
	}
	t.giveBack(t.tx)
	return unavailable(op, errLost)
}

// abort rolls the transaction back and lets go of the claim's locks; on
// failure it closes the connection and kills its session.
func (t *requestTx) abort(ctx context.Context) {
	if _, err := t.tx.ExecContext(ctx, rollbackChain); err != nil && !errors.Is(err, sql.ErrTxDone) {
		t.drop()
		return
	}
	t.giveBack(t.tx)
}

var _ store.Waiter = (*Store)(nil)

// Wait waits for the request that holds key for c's request (its
// fingerprint) to end, on any instance, by waiting for its fingerprint's
// named lock (GET_LOCK with the time left) and letting go of it at once:
// it wakes the moment the owner's session lets go of its locks, after its
// commit or rollback, without polling. It holds a pool connection while it
// waits, until ctx ends at the latest; a wait that ctx cuts short (the
// client hung up) has its session killed, which would otherwise go on
// waiting on the server for the rest of its time. It returns false at
// once, in one round trip, when no session holds that lock (a plain claim
// committed in flight, which only its end settles: poll it); a wait takes
// one more.
func (s *Store) Wait(ctx context.Context, key string, c store.Claim) (bool, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Minute)
	}
	if time.Until(deadline) <= 0 {
		return true, nil
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return true, nil
		}
		return false, unavailable("wait", err)
	}
	_, fl := s.locks(key, c.Fingerprint)
	q := "'" + fl + "'"
	var free bool
	var connID int64
	err = conn.QueryRowContext(ctx, "SELECT CASE WHEN GET_LOCK("+q+", 0) <=> 1 THEN IF(RELEASE_LOCK("+q+") IS NULL, 1, 1) ELSE 0 END, CONNECTION_ID()").Scan(&free, &connID)
	if err == nil && !free {
		left := time.Until(deadline)
		if left <= 0 {
			conn.Close()
			return true, nil
		}
		secs := strconv.FormatFloat(left.Seconds(), 'f', 3, 64)
		var answer int64
		err = conn.QueryRowContext(ctx, "SELECT CASE WHEN GET_LOCK("+q+", "+secs+") <=> 1 THEN IF(RELEASE_LOCK("+q+") IS NULL, 1, 1) ELSE 2 END").Scan(&answer)
	}
	if err != nil {
		s.discard(conn, connID)
		if ctx.Err() != nil {
			return true, nil
		}
		return false, unavailable("wait", err)
	}
	conn.Close()
	return !free, nil
}
