package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
)

// ErrPoolExhausted is the cause (inside an error wrapping
// store.ErrUnavailable) of a transactional claim that found no free pool
// connection within its time budget: every connection was held by a
// request whose handler still ran. The request was not run. Size the pool
// for the requests served at once (see the package documentation).
var ErrPoolExhausted = errors.New("idemkey: postgres: no free pool connection within the call's budget (every connection is held by a running request: size the pool for the requests served at once)")

// ClaimTx claims key in the transaction the handler will run in, on a
// connection it takes from the pool for the request: BEGIN and the claim
// go out in one round trip. When the answer is Claimed it returns that
// transaction; otherwise the transaction is rolled back, the connection
// goes back to the pool, and tx is nil.
//
// Everything the claim holds lives in that transaction: two
// transaction-scoped advisory locks (the key's, and the key's with the
// request's fingerprint) and the claim's row, not yet committed. They end
// with the transaction, on whatever server connection it ran (a pooler in
// transaction mode included): the record commits with the handler's writes
// or nothing does, and an owner whose process or connection dies is
// replaced at once. The transaction ends at the claim's life at the
// latest (the route's deadline plus middleware.ClaimMargin): the server
// cancels a statement that runs that long (statement_timeout) and ends a
// session idle that long inside it (idle_in_transaction_session_timeout),
// the store closes the connection when the life is over, and a commit
// after it keeps nothing.
//
// The connection is held until Commit or Rollback: size the pool for the
// requests served at once. The wait for a free connection counts against
// the call's time budget (WithCallTimeout); past it ClaimTx returns an
// error wrapping store.ErrUnavailable and ErrPoolExhausted.
func (s *Store) ClaimTx(ctx context.Context, key string, c store.Claim) (store.Result, store.Tx, error) {
	if _, err := checkClaim(c); err != nil {
		return store.Result{}, nil, err
	}
	if err := ctx.Err(); err != nil {
		return store.Result{}, nil, unavailable("claim", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.face.claimTx(ctx, key, c)
}

// face is how a request's transaction is run, chosen once by New (pgx,
// pgxFace) or NewDB (database/sql, sqlFace): its claim and its keyless
// Begin, each within the call's budget (ctx). Everything else is the
// Store's, the same on both.
type face interface {
	claimTx(ctx context.Context, key string, c store.Claim) (store.Result, store.Tx, error)
	begin(ctx context.Context) (store.Tx, error)
}

// pgxFace runs a request's transaction on a pgx pool.
type pgxFace struct {
	s    *Store
	pool *pgxpool.Pool
}

func (f pgxFace) claimTx(ctx context.Context, key string, c store.Claim) (store.Result, store.Tx, error) {
	s := f.s
	var lastErr error
	for range maxAttempts {
		conn, err := f.acquire(ctx)
		if err != nil {
			return store.Result{}, nil, err
		}
		r, ok, err := s.claimTx(ctx, conn, key, c)
		switch {
		case err != nil && (connLost(ctx, err) || retryable(err)):
			// The connection died (the transaction with it: nothing
			// landed), or the claim met a row committed after the
			// transaction's snapshot: begin again.
			s.end(conn)
			lastErr = err
			continue
		case err != nil:
			s.end(conn)
			return store.Result{}, nil, unavailable("claim", err)
		case !ok:
			s.end(conn)
			continue
		case r.kind == kindClaimed:
			tx := &requestTx{s: s, conn: conn, key: key, token: c.Token, life: c.TTL}
			if r.createdAt != nil {
				tx.claimedAt = *r.createdAt
			}
			tx.watch(c.TTL)
			return store.Result{State: store.Claimed, Fingerprint: c.Fingerprint}, tx, nil
		}
		s.end(conn)
		res, err := r.result(c)
		if err != nil {
			return store.Result{}, nil, fmt.Errorf("idemkey: postgres: claim: %w", err)
		}
		return res, nil, nil
	}
	return store.Result{}, nil, unavailable("claim", gaveUp(lastErr))
}

// claimTx sends BEGIN and the claim on conn, in one round trip, and reads
// the claim's answer.
//
// A claim that takes nothing leaves the transaction to roll back
// (Store.end, after the answer, not waited for). It cannot be spared: the
// one way a pipeline can end its transaction when the claim took nothing,
// and keep it when it took the key, is a statement that fails, and pgx
// forgets every prepared statement of a batch that met an error, so each
// replay would prepare the claim anew (measured: 7.6 ms a replay, against
// 0.7 ms).
func (s *Store) claimTx(ctx context.Context, conn *pgxpool.Conn, key string, c store.Claim) (row, bool, error) {
	b := &pgx.Batch{}
	b.Queue(s.begin)
	b.Queue(s.claimSQL, s.claimArgs(key, c, (holdLife+c.TTL).Microseconds())...)
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return row{}, false, err
	}
	rows, err := br.Query()
	if err != nil {
		return row{}, false, err
	}
	var r row
	ok := rows.Next()
	if ok {
		err = r.scan(rows)
	}
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		return row{}, false, err
	}
	return r, ok, br.Close()
}

// Begin opens a transaction with no claim, for a request without a key on
// a route where the key is optional: BEGIN, one round trip, on a
// connection held until Commit or Rollback. The handler gets it with Tx,
// as it would with a key.
func (s *Store) Begin(ctx context.Context) (store.Tx, error) {
	if err := ctx.Err(); err != nil {
		return nil, unavailable("begin", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.face.begin(ctx)
}

func (f pgxFace) begin(ctx context.Context) (store.Tx, error) {
	s := f.s
	conn, err := f.acquire(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, s.begin, pgx.QueryExecModeSimpleProtocol); err != nil {
		s.end(conn)
		return nil, unavailable("begin", err)
	}
	return &requestTx{s: s, conn: conn}, nil
}

// acquire takes a connection from the pool within ctx.
func (f pgxFace) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	conn, err := f.pool.Acquire(ctx)
	if err == nil {
		return conn, nil
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		st := f.pool.Stat()
		return nil, unavailable("claim", fmt.Errorf("%w (%d of %d held): %w", ErrPoolExhausted, st.AcquiredConns(), st.MaxConns(), err))
	}
	return nil, unavailable("claim", err)
}

// end rolls back whatever conn has open and gives it back to the pool, in
// the background: the request does not wait for it. A connection that
// fails this is closed, which ends its transaction on the server.
func (s *Store) end(conn *pgxpool.Conn) {
	if conn.Conn().PgConn().TxStatus() == 'I' && !conn.Conn().PgConn().IsBusy() {
		conn.Release()
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.commitTimeout)
		defer cancel()
		if conn.Conn().PgConn().IsBusy() {
			discard(conn)
			return
		}
		if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
			discard(conn)
			return
		}
		conn.Release()
	}()
}

// retryable reports a serialization failure or deadlock: the transaction
// may begin again.
func retryable(err error) bool {
	code := sqlState(err)
	return code == "40001" || code == "40P01"
}

// timeoutText is d in whole milliseconds, rounded up, as a setting's text.
func timeoutText(d time.Duration) string {
	return strconv.FormatInt((d + time.Millisecond - 1).Milliseconds(), 10)
}

// discard closes a pooled connection whose session state is unknown (it
// may hold an open transaction) and gives its slot back to the pool.
// Closing ends the server's session: its transaction rolls back and its
// locks are released.
func discard(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	conn.Conn().Close(ctx)
	conn.Release()
}

// requestTx is the store.Tx of one request: the pooled connection its
// transaction runs on, begun by ClaimTx (key set) or Begin (key "").
type requestTx struct {
	s     *Store
	conn  *pgxpool.Conn
	key   string
	token string
	life  time.Duration // the claim's
	// claimedAt is when the claim was made, on the database's clock.
	claimedAt time.Time

	mu      sync.Mutex
	handler *handlerTx
	ended   bool
	expired bool        // the watchdog closed the connection
	timer   *time.Timer // the watchdog
	lapses  time.Time   // when the claim's life is over (zero without a claim)
}

var _ store.Tx = (*requestTx)(nil)

// watch closes the connection when the claim's life is over and the
// transaction is still open: its owner stalled past the route's deadline
// (a handler that ignores its context), and the key must not stay held
// by it, nor its commit land after a retry could have run.
func (t *requestTx) watch(life time.Duration) {
	t.lapses = time.Now().Add(life)
	t.timer = time.AfterFunc(life, func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.ended {
			return
		}
		t.expired = true
		// Closing the socket is safe while another goroutine uses the
		// connection: its statements then fail, and the server ends the
		// session, rolling back.
		t.conn.Conn().PgConn().Conn().Close()
	})
}

// lapsed reports whether the claim's life is over by the clock.
func (t *requestTx) lapsed() bool { return !t.lapses.IsZero() && !time.Now().Before(t.lapses) }

// NewContext returns ctx carrying the transaction, which the handler gets
// back with Tx.
func (t *requestTx) NewContext(ctx context.Context) context.Context {
	t.mu.Lock()
	if t.handler == nil {
		t.handler = &handlerTx{conn: t.conn.Conn(), opts: t.s.txOptions}
	}
	h := t.handler
	t.mu.Unlock()
	return context.WithValue(ctx, txKey{}, h)
}

// end marks the transaction ended and stops the handler's use of it and
// the watchdog. It reports false when it had already ended.
func (t *requestTx) end() bool {
	t.mu.Lock()
	if t.ended {
		t.mu.Unlock()
		return false
	}
	t.ended = true
	if t.timer != nil {
		t.timer.Stop()
	}
	h := t.handler
	t.mu.Unlock()
	if h != nil {
		// Outside t.mu, which the watchdog takes to close the socket.
		h.close(t.s.commitTimeout)
	}
	return true
}

// Commit keeps rec in the transaction, fenced by the owner's token and the
// claim's life, and commits: one round trip, a pipeline of the fenced
// UPDATE and COMMIT. A kept 4xx whose writes are undone
// (WithClientErrorWrites(false)) rolls the transaction back instead and
// keeps its record in a statement of its own (keepAlone). It returns store.ErrNotOwner when the
// claim is no longer this request's (its life is over): the transaction
// is then rolled back and nothing is kept. Any other error means the
// commit failed or its outcome is unknown; it wraps store.ErrUnavailable.
// The call is bounded by WithCommitTimeout. The connection goes back to
// the pool, or is closed when its state is unknown.
//
// A transaction with no claim (Begin) commits the handler's writes and
// keeps nothing.
func (t *requestTx) Commit(ctx context.Context, rec *store.Record, retention time.Duration) error {
	if !t.end() {
		return errors.New("idemkey: postgres: commit: the transaction already ended")
	}
	if rec == nil {
		t.rollback(ctx)
		return errors.New("idemkey: postgres: nil record")
	}
	ctx, cancel := context.WithTimeout(ctx, t.s.commitTimeout)
	defer cancel()
	pc := t.conn.Conn().PgConn()
	switch {
	case t.expired || t.lapsed():
		// The claim's life is over: its transaction was ended, by the
		// watchdog or by the server (the idle timeout the claim set),
		// or is about to be, whether or not the watchdog has run yet (on
		// a busy machine its timer can fire late).
		discard(t.conn)
		return store.ErrNotOwner
	case pc.IsClosed():
		discard(t.conn)
		return unavailable("commit", errors.New("the transaction ended with its connection (the server went away)"))
	case pc.IsBusy():
		// The handler left a query unread (rows never closed): the
		// connection cannot run anything until it is.
		discard(t.conn)
		return unavailable("commit", errors.New("the handler left a query on the transaction unfinished"))
	case pc.TxStatus() == 'E':
		// A statement of the handler failed, and the handler answered as
		// if it had not: COMMIT would roll back. Keep nothing.
		t.rollback(ctx)
		return unavailable("commit", errors.New("the handler's transaction had failed; rolled back"))
	case pc.TxStatus() == 'I':
		return t.commitOutside(ctx, rec, retention)
	}
	if t.s.undo4xx && rec.Status >= 400 {
		return t.keepAlone(ctx, rec, retention)
	}
	b := &pgx.Batch{}
	if t.key != "" {
		args, err := recordArgs(t.key, t.token, rec, retention)
		if err != nil {
			// Nothing was sent: end the transaction as a failure.
			t.rollback(ctx)
			return err
		}
		b.Queue(t.s.sql.keepTx, append(args, t.life.Microseconds())...)
	}
	b.Queue("COMMIT")
	br := t.conn.SendBatch(ctx, b)
	if t.key != "" {
		var kept bool
		if err := br.QueryRow().Scan(&kept); err != nil {
			br.Close()
			t.rollback(ctx)
			if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "22P02" {
				// Fenced: the COMMIT was skipped and the transaction is
				// aborted. Nothing is kept.
				return store.ErrNotOwner
			}
			// The UPDATE failed (a serialization failure, the server
			// going away): nothing committed.
			return unavailable("commit", err)
		}
	}
	tag, err := br.Exec()
	if err == nil && tag.String() != "COMMIT" {
		err = fmt.Errorf("COMMIT answered %q", tag.String())
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		// Committed, but the connection is not in a state to trust.
		discard(t.conn)
		return nil
	}
	if err != nil {
		if _, ok := errors.AsType[*pgconn.PgError](err); ok || tag.String() == "ROLLBACK" {
			// The server refused the COMMIT (a deferred constraint, a
			// serialization failure): the transaction rolled back, and
			// the key with it.
			t.giveBack()
			return unavailable("commit", err)
		}
		// The outcome is unknown (the reply was lost): the connection is
		// not to be trusted. Closing it ends any transaction left open.
		discard(t.conn)
		return unavailable("commit", err)
	}
	t.giveBack()
	return nil
}

// keepAlone keeps the record of a 4xx whose writes are undone: it rolls
// the transaction back, its claim with it, and keeps rec in a statement of
// its own (keepAloneSQL), pipelined: one round trip, and no subtransaction.
// The statement is fenced as the claim was: when another request took the
// key once the rollback let it go (or a plain claim or a record came
// meanwhile, or the claim's life is over), that request wins, nothing is
// kept, and Commit returns store.ErrNotOwner. A request without a key
// only rolls back.
func (t *requestTx) keepAlone(ctx context.Context, rec *store.Record, retention time.Duration) error {
	if t.key == "" {
		if err := t.rollback(ctx); err != nil {
			return unavailable("commit", err)
		}
		return nil
	}
	args, err := recordArgs(t.key, t.token, rec, retention)
	if err != nil {
		t.rollback(ctx)
		return err
	}
	lock, fpLock := t.s.locks(t.key, rec.Fingerprint)
	b := &pgx.Batch{}
	b.Queue("ROLLBACK")
	b.Queue(t.s.sql.keepAlone, append(args, lock, t.claimedAt, t.life.Microseconds(), fpLock)...)
	br := t.conn.SendBatch(ctx, b)
	var kept int64
	_, err = br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&kept)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		// The outcome of the keep is unknown (or it failed): the
		// transaction is gone either way, and the connection is not to
		// be trusted.
		discard(t.conn)
		return unavailable("commit", err)
	}
	t.giveBack()
	if kept != 1 {
		return store.ErrNotOwner
	}
	return nil
}

// commitOutside keeps rec after the handler ended the transaction itself
// (a COMMIT or ROLLBACK sent through Conn): the claim's row committed with
// the handler's writes or rolled back with them. A committed claim gets
// its record, fenced by the owner's token, in a statement of its own: the
// writes are in, and the answer is theirs. A claim that rolled back took
// the writes with it: nothing is kept, and the key is free.
func (t *requestTx) commitOutside(ctx context.Context, rec *store.Record, retention time.Duration) error {
	if t.key == "" {
		t.giveBack()
		return nil
	}
	args, err := recordArgs(t.key, t.token, rec, retention)
	if err != nil {
		t.giveBack()
		return err
	}
	var code int
	if err := t.conn.QueryRow(ctx, t.s.sql.complete, args...).Scan(&code); err != nil {
		discard(t.conn)
		return unavailable("commit", err)
	}
	t.giveBack()
	switch code {
	case 1, 2:
		return nil
	case 0:
		return unavailable("commit", errors.New("the handler rolled the request's transaction back itself; nothing was kept"))
	}
	return unavailable("commit", fmt.Errorf("unexpected answer %d", code))
}

// giveBack returns the connection to the pool at the request's end, or
// closes it when the handler took it with Conn and may use it still.
func (t *requestTx) giveBack() {
	if t.handler != nil && t.handler.connTaken.Load() {
		discard(t.conn)
		return
	}
	t.conn.Release()
}

// errEndedOutside is what Rollback reports when the handler's own COMMIT
// committed the claim with its writes: the key is then held, not freed.
var errEndedOutside = errors.New("the handler committed the request's transaction itself (a COMMIT through Conn?); its writes are in, so the key is held for " + holdLife.String() + " instead of being freed for a retry")

// holdLife is the life of the claim's row in a request's transaction. The
// row is seen by no one while the transaction runs; it matters only when
// the handler commits the transaction itself: then its writes are in, and
// the key stays claimed that long (a repeat answers 409; an operator can
// free it sooner with idemctl delete) rather than run them again. It is
// the middleware's default retention.
const holdLife = 24 * time.Hour

// Rollback rolls the transaction back, in one round trip, bounded by
// WithCommitTimeout: the claim goes with it, and the key is free. When it
// fails the connection is closed, which rolls back on the server; the
// error wraps store.ErrUnavailable. When the handler had committed the
// transaction itself, its writes are in: the key stays held, and the
// error says so.
func (t *requestTx) Rollback(ctx context.Context) error {
	if !t.end() {
		return errors.New("idemkey: postgres: rollback: the transaction already ended")
	}
	ctx, cancel := context.WithTimeout(ctx, t.s.commitTimeout)
	defer cancel()
	pc := t.conn.Conn().PgConn()
	if t.key != "" && !t.expired && !pc.IsClosed() && !pc.IsBusy() && pc.TxStatus() == 'I' {
		var held bool
		if err := t.conn.QueryRow(ctx, t.s.sql.held, t.key, t.token).Scan(&held); err != nil {
			discard(t.conn)
			return unavailable("rollback", err)
		}
		t.giveBack()
		if held {
			return unavailable("rollback", errEndedOutside)
		}
		return nil
	}
	if err := t.rollback(ctx); err != nil {
		return unavailable("rollback", err)
	}
	return nil
}

// rollback rolls back when a transaction is open and gives the connection
// back; on failure it closes the connection.
func (t *requestTx) rollback(ctx context.Context) error {
	pc := t.conn.Conn().PgConn()
	if t.expired || pc.IsClosed() || pc.IsBusy() {
		discard(t.conn)
		if pc.IsBusy() {
			return errors.New("the handler left a query on the transaction unfinished")
		}
		return nil
	}
	if pc.TxStatus() != 'I' {
		if _, err := t.conn.Exec(ctx, "ROLLBACK"); err != nil {
			discard(t.conn)
			return err
		}
	}
	t.giveBack()
	return nil
}

var _ store.Waiter = (*Store)(nil)

// Wait waits for the transaction that holds key for c's request to end
// (its record kept and committed, or rolled back), on any instance, by
// waiting on that transaction's lock: it wakes the moment the owner's
// transaction ends, without polling. It holds a pool connection while it
// waits, until ctx ends at the latest. It returns false at once when no
// transaction holds the key for c's request (a claim committed in flight,
// which only its end of life or its owner settles: poll it).
func (s *Store) Wait(ctx context.Context, key string, c store.Claim) (bool, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Minute)
	}
	left := time.Until(deadline)
	if left <= 0 {
		return true, nil
	}
	_, l2 := s.locks(key, c.Fingerprint)
	var waited bool
	err := s.db.queryRow(ctx, waitSQL, l2, timeoutText(left)).Scan(&waited)
	if sqlState(err) == "55P03" {
		return true, nil // the time is up
	}
	if err != nil {
		if ctx.Err() != nil {
			return true, nil
		}
		return false, unavailable("wait", err)
	}
	return waited, nil
}
