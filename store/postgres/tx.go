package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
)

// ErrLockTaken reports that a transactional claim could not take the
// advisory lock on the id it drew, because another session holds that id
// (another application's advisory lock, by a one-in-2^64 chance, every
// time). ClaimTx draws again before it returns it.
var ErrLockTaken = errors.New("idemkey: postgres: advisory lock id already held")

// ClaimTx claims key as Claim does, on a connection it takes from the pool
// for the request, and when the answer is Claimed or Mine returns the
// transaction the handler runs in; otherwise it returns the connection at
// once and tx is nil.
//
// The claim commits on its own before the handler runs, so that other
// requests see the key in flight, and holds a session advisory lock from
// inside the statement that inserts it until the transaction has committed
// or rolled back. A claim that finds the key in flight under such a lock
// tries it without waiting: when it is free, the owner's session is gone,
// and its transaction with it, so the key is taken over at once. A live
// owner's claim is taken over only when its life is over.
//
// The connection is held until Commit or Rollback: size the pool for the
// requests served at once. The wait for a free connection counts against
// the call's time budget (WithCallTimeout); past it ClaimTx returns an
// error wrapping store.ErrUnavailable.
func (s *Store) ClaimTx(ctx context.Context, key string, c store.Claim) (store.Result, store.Tx, error) {
	ttl, err := checkClaim(c)
	if err != nil {
		return store.Result{}, nil, err
	}
	if err := ctx.Err(); err != nil {
		return store.Result{}, nil, unavailable("claim", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return store.Result{}, nil, unavailable("claim", fmt.Errorf("no free connection: %w", err))
		}
		res, lock, err := s.claimTx(ctx, conn, key, c, ttl)
		if err != nil {
			// The claim may have landed, with its lock: a connection
			// whose state is unknown never goes back to the pool.
			// Closing it ends the session and frees the lock, so a retry
			// takes the claim over.
			lost := conn.Conn().IsClosed() && connLost(ctx, err)
			discard(conn)
			if lost && attempt < maxAttempts {
				// A pooled connection that died (a server restart): on
				// another one, a claim that landed on it answers Mine.
				continue
			}
			return store.Result{}, nil, err
		}
		if res.State != store.Claimed && res.State != store.Mine {
			conn.Release()
			return res, nil, nil
		}
		return res, &requestTx{s: s, conn: conn, key: key, token: c.Token, lock: lock}, nil
	}
}

// claimTx runs the claim on conn and returns the answer and, when claimed,
// the lock id it holds.
func (s *Store) claimTx(ctx context.Context, conn *pgxpool.Conn, key string, c store.Claim, ttl int64) (store.Result, int64, error) {
	for range maxAttempts {
		lock := s.lockID()
		r, ok, err := queryClaim(ctx, conn, s.sql.claimTx, key, c.Token, c.Fingerprint[:], ttl, lock)
		if err != nil {
			return store.Result{}, 0, unavailable("claim", err)
		}
		if !ok {
			continue // raced a claim that committed after the snapshot
		}
		if r.inserted {
			if r.flag == nil || !*r.flag {
				// Someone holds the id drawn: give the row back and draw
				// again.
				if err := s.dropClaim(ctx, conn, key, c.Token, 0); err != nil {
					return store.Result{}, 0, unavailable("claim", err)
				}
				continue
			}
			return store.Result{State: store.Claimed, Fingerprint: c.Fingerprint}, lock, nil
		}
		gone := r.flag != nil && *r.flag
		mine := *r.token == c.Token
		state := store.Claimed
		switch {
		case r.lapsed():
		case r.status != nil:
			res, err := r.result()
			if err != nil {
				return store.Result{}, 0, fmt.Errorf("idemkey: postgres: claim: %w", err)
			}
			return res, 0, nil
		case mine && (gone || r.lockID == nil):
			// Our own claim (a resent ClaimTx) whose session is gone, or
			// made by Claim: hold a lock on it now.
			state = store.Mine
		case gone:
		default:
			res, err := r.result()
			if err != nil {
				return store.Result{}, 0, fmt.Errorf("idemkey: postgres: claim: %w", err)
			}
			return res, 0, nil
		}
		taken, locked, err := s.takeover(ctx, conn, key, c, ttl, *r.token, gone || state == store.Mine, &lock)
		if err != nil {
			return store.Result{}, 0, unavailable("claim", err)
		}
		if !taken {
			continue // another request took it over first, or it was swept
		}
		if !locked {
			if err := s.dropClaim(ctx, conn, key, c.Token, 0); err != nil {
				return store.Result{}, 0, unavailable("claim", err)
			}
			continue
		}
		return store.Result{State: state, Fingerprint: c.Fingerprint}, lock, nil
	}
	return store.Result{}, 0, unavailable("claim", errors.New("the key kept changing while it was claimed"))
}

// dropClaim deletes the claim held by token and, when lock is not 0,
// releases the lock, in one round trip.
func (s *Store) dropClaim(ctx context.Context, conn *pgxpool.Conn, key, token string, lock int64) error {
	b := &pgx.Batch{}
	b.Queue(s.sql.releaseTx, key, token)
	if lock != 0 {
		b.Queue(unlockSQL, lock)
	}
	return conn.SendBatch(ctx, b).Close()
}

// discard closes a pooled connection whose session state is unknown (it
// may hold a lock or an open transaction) and gives its slot back to the
// pool. Closing ends the server's session: its transaction rolls back and
// its locks are released.
func discard(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	conn.Conn().Close(ctx)
	conn.Release()
}

// requestTx is the store.Tx of one claimed request: the pooled connection
// its claim was made on, which holds the claim's advisory lock, and the
// transaction the handler writes through.
type requestTx struct {
	s     *Store
	conn  *pgxpool.Conn
	key   string
	token string
	lock  int64

	mu      sync.Mutex
	handler *handlerTx
	ended   bool
	// outside is set by Commit and Rollback, before they send anything,
	// when the handler's transaction had been ended outside the middleware
	// (endedOutside): the key is then held, never freed.
	outside bool
}

var _ store.Tx = (*requestTx)(nil)

// NewContext returns ctx carrying the transaction, which the handler gets
// back with Tx.
func (t *requestTx) NewContext(ctx context.Context) context.Context {
	t.mu.Lock()
	if t.handler == nil {
		t.handler = &handlerTx{conn: t.conn.Conn(), begin: t.s.begin, opts: t.s.txOptions}
	}
	h := t.handler
	t.mu.Unlock()
	return context.WithValue(ctx, txKey{}, h)
}

// end marks the transaction ended and stops the handler's use of it. It
// reports false when it had already ended.
func (t *requestTx) end() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return false
	}
	t.ended = true
	t.outside = t.endedOutside()
	if t.handler != nil {
		t.handler.close()
	}
	return true
}

// Commit keeps rec in the transaction, fenced by the owner's token,
// releases the advisory lock and commits: one round trip, a pipeline of
// the fenced UPDATE (which unlocks) and COMMIT (with BEGIN first when the
// handler never used the transaction). It returns store.ErrNotOwner when
// the claim is no longer this request's: the transaction is then rolled
// back and nothing is kept. Any other error means the commit failed or its outcome is
// unknown; it wraps store.ErrUnavailable. The call is bounded by
// WithCommitTimeout. The connection goes back to the pool, or is closed
// when its state is unknown.
func (t *requestTx) Commit(ctx context.Context, rec *store.Record, retention time.Duration) error {
	if !t.end() {
		return errors.New("idemkey: postgres: commit: the transaction already ended")
	}
	args, err := recordArgs(t.key, t.token, rec, retention)
	if err != nil {
		// Nothing was sent: end the transaction as a failure.
		t.rollback(ctx)
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, t.s.commitTimeout)
	defer cancel()
	pc := t.conn.Conn().PgConn()
	b := &pgx.Batch{}
	switch st := pc.TxStatus(); {
	case pc.IsBusy():
		// The handler left a query unread (rows never closed): the
		// connection cannot run anything until it is.
		t.rollback(ctx)
		return unavailable("commit", errors.New("the handler left a query on the transaction unfinished"))
	case t.handler != nil && t.handler.broken.Load():
		t.rollback(ctx)
		return unavailable("commit", errors.New("the handler's transaction could not begin; rolled back"))
	case st == 'E':
		// A statement of the handler failed, and the handler answered as
		// if it had not: COMMIT would roll back. Keep nothing.
		t.rollback(ctx)
		return unavailable("commit", errors.New("the handler's transaction had failed; rolled back"))
	case st == 'I':
		// The handler wrote nothing: the record is the transaction.
		b.Queue(t.s.begin)
	}
	begin := b.Len() == 1
	b.Queue(t.s.sql.keepTx, append(args, t.lock)...)
	b.Queue("COMMIT")
	br := t.conn.SendBatch(ctx, b)
	if begin {
		if _, err := br.Exec(); err != nil {
			br.Close()
			discard(t.conn)
			return unavailable("commit", err)
		}
	}
	var unlocked bool
	if err := br.QueryRow().Scan(&unlocked); err != nil {
		br.Close()
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "22P02" {
			// Fenced: the COMMIT was skipped, the transaction is
			// aborted, and the lock is still held. Roll back and let go.
			if err := t.finish(ctx, false, true); err != nil {
				return unavailable("commit", err)
			}
			return store.ErrNotOwner
		}
		// The UPDATE failed (a serialization failure, the server going
		// away) before it could unlock: nothing committed. Roll back and
		// free the key, so that a retry runs again; a connection that
		// fails this is closed.
		t.rollback(ctx)
		return unavailable("commit", err)
	}
	tag, err := br.Exec()
	if err == nil && tag.String() != "COMMIT" {
		err = fmt.Errorf("COMMIT answered %q", tag.String())
	}
	if err != nil {
		br.Close()
		if _, ok := errors.AsType[*pgconn.PgError](err); ok || tag.String() == "ROLLBACK" {
			// The server refused the COMMIT (a deferred constraint, a
			// serialization failure): the transaction rolled back, and
			// the lock was let go already. Delete the claim, so that
			// plain claims find the key free too.
			t.finish(ctx, true, false)
			return unavailable("commit", err)
		}
		// The outcome is unknown (the reply was lost): the connection is
		// not to be trusted. Closing it ends any transaction left open
		// and frees the lock.
		discard(t.conn)
		return unavailable("commit", err)
	}
	if err := br.Close(); err != nil || !unlocked {
		// Committed, but the connection is not in a state to trust
		// (or held no lock, which it should have): close it.
		discard(t.conn)
		return nil
	}
	t.giveBack()
	return nil
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

// endedOutside reports whether the handler's transaction began and was
// then ended by something other than the middleware: a COMMIT or ROLLBACK
// the handler sent on its connection. Its writes may have committed.
func (t *requestTx) endedOutside() bool {
	return t.handler != nil && t.handler.began.Load() && t.conn.Conn().PgConn().TxStatus() == 'I'
}

// errEndedOutside is what Commit and Rollback report when they had to hold
// the key because the handler's transaction was ended outside the
// middleware.
var errEndedOutside = errors.New("the handler's transaction was committed or rolled back outside the middleware (a COMMIT through Conn?); its writes may be committed, so the key is held for " + holdLife.String() + " instead of being freed for a retry")

// holdLife is how long a key whose transaction ended outside the
// middleware stays claimed: a repeat answers 409 meanwhile. It is the
// middleware's default retention; an operator can free the key sooner
// (idemctl delete).
const holdLife = 24 * time.Hour

// Rollback rolls the transaction back, deletes the claim and releases the
// advisory lock, in one round trip, bounded by WithCommitTimeout. When it
// fails the connection is closed, which rolls back and frees the lock on
// the server, so that the next request with the key takes the claim over
// at once; the error wraps store.ErrUnavailable.
func (t *requestTx) Rollback(ctx context.Context) error {
	if !t.end() {
		return errors.New("idemkey: postgres: rollback: the transaction already ended")
	}
	ctx, cancel := context.WithTimeout(ctx, t.s.commitTimeout)
	defer cancel()
	if err := t.rollback(ctx); err != nil {
		return unavailable("rollback", err)
	}
	return nil
}

// rollback rolls back (when a transaction is open), deletes the claim and
// unlocks; on failure it closes the connection.
func (t *requestTx) rollback(ctx context.Context) error {
	if t.conn.Conn().PgConn().IsBusy() {
		discard(t.conn)
		return errors.New("the handler left a query on the transaction unfinished")
	}
	return t.finish(ctx, true, true)
}

// finish ends the request on its connection in one round trip (two after
// a failed statement): ROLLBACK when a transaction is open, the deletion
// of the claim when release is set, and the unlock when locked is. Then it
// gives the connection back to the pool, or closes it when anything
// failed.
func (t *requestTx) finish(ctx context.Context, release, locked bool) error {
	outside := release && t.outside
	b := &pgx.Batch{}
	switch t.conn.Conn().PgConn().TxStatus() {
	case 'T':
		b.Queue("ROLLBACK")
	case 'E':
		// In a failed transaction the server refuses to parse anything
		// but the statement that ends it, and the statements below may
		// not be prepared on this connection yet: ROLLBACK first, on its
		// own, in the simple protocol.
		if _, err := t.conn.Exec(ctx, "ROLLBACK"); err != nil {
			discard(t.conn)
			return err
		}
	}
	switch {
	case outside:
		// Not free for a retry: what the handler wrote may be committed.
		b.Queue(t.s.sql.holdTx, t.key, t.token, holdLife.Microseconds())
	case release:
		b.Queue(t.s.sql.releaseTx, t.key, t.token)
	}
	if locked {
		b.Queue(unlockSQL, t.lock)
	}
	if b.Len() == 0 {
		t.giveBack()
		return nil
	}
	br := t.conn.SendBatch(ctx, b)
	var err error
	n := b.Len()
	if locked {
		n--
	}
	for range n {
		if _, err = br.Exec(); err != nil {
			break
		}
	}
	unlocked := true
	if err == nil && locked {
		err = br.QueryRow().Scan(&unlocked)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil && !unlocked {
		err = errors.New("the advisory lock was not held")
	}
	if err != nil {
		discard(t.conn)
		return err
	}
	t.giveBack()
	if outside {
		return errEndedOutside
	}
	return nil
}
