package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkey/idemkey/store"
)

// sqlTxKey is the context key of a request's *sql.Tx.
type sqlTxKey struct{}

// SQLTx returns the transaction of the request whose context is ctx, on a
// Store made with NewDB: the one the middleware opened for the handler,
// in which it keeps the response. It is Tx for code on database/sql
// (sqlc's database/sql output, GORM, Bun, sqlx, ent): the handler makes
// its writes through it, so that they and the kept response commit
// together or not at all. It returns nil outside the middleware's flow,
// and on a Store made with New (use Tx).
//
// The handler need not end it: the middleware commits it, with the
// record, after a response it keeps, and rolls it back after a 5xx or a
// panic. A handler that calls its Commit anyway commits its claim with its
// writes: a kept answer is still kept, in a statement of its own, and
// after a 5xx or a panic the key stays held for 24 hours (repeats get
// 409) rather than let a retry make the writes twice. Its writes are in
// whatever it answers: a kept 4xx after its own commit keeps them too. One that
// calls its Rollback takes its claim with it: the key is free, nothing is
// kept and the answer is 503. Never send COMMIT or ROLLBACK as SQL through
// it.
func SQLTx(ctx context.Context) *sql.Tx {
	tx, _ := ctx.Value(sqlTxKey{}).(*sql.Tx)
	return tx
}

// sqlFace runs a request's transaction on a database/sql DB, begun with
// opts.
type sqlFace struct {
	s    *Store
	db   *sql.DB
	opts *sql.TxOptions
}

// claimTx is ClaimTx through database/sql, within ctx (the call's
// budget): BEGIN and the claim are a round trip each, as database/sql
// sends one statement at a time.
//
// The transaction is begun with a context of its own that ends at the
// claim's life: database/sql then rolls it back (after a statement in
// progress, which the claim's statement_timeout bounds by the same life),
// so that an owner that stalls past the route's deadline lets go of the
// key, and its commit keeps nothing.
func (f sqlFace) claimTx(ctx context.Context, key string, c store.Claim) (store.Result, store.Tx, error) {
	s := f.s
	var lastErr error
	for range maxAttempts {
		conn, err := f.db.Conn(ctx)
		if err != nil {
			return store.Result{}, nil, f.noConn(ctx, err)
		}
		t := &sqlRequestTx{s: s, conn: conn, key: key, token: c.Token, life: c.TTL, lapses: time.Now().Add(c.TTL)}
		t.ctx, t.cancel = context.WithDeadline(context.WithoutCancel(ctx), t.lapses)
		// The driver sends BEGIN under the transaction's context: the
		// call's budget ends it too, until the claim is made.
		inBudget := context.AfterFunc(ctx, t.cancel)
		t.tx, err = conn.BeginTx(t.ctx, f.opts)
		if err != nil {
			inBudget()
			t.finish()
			if connLost(ctx, err) {
				lastErr = err
				continue
			}
			return store.Result{}, nil, unavailable("claim", err)
		}
		var r row
		err = r.scan(t.tx.QueryRowContext(ctx, s.claimSQL, s.claimArgs(key, c, (holdLife+c.TTL).Microseconds())...))
		switch {
		case noRows(err):
			inBudget()
			go t.abandon() // raced a commit after the snapshot: ask again
			continue
		case err != nil && (connLost(ctx, err) || retryable(err)):
			inBudget()
			go t.abandon()
			lastErr = err
			continue
		case err != nil:
			inBudget()
			go t.abandon()
			return store.Result{}, nil, unavailable("claim", err)
		case r.kind == kindClaimed:
			if r.createdAt != nil {
				t.claimedAt = *r.createdAt
			}
			if !inBudget() {
				err = ctx.Err() // the budget ended the transaction
			}
			if err != nil {
				go t.abandon()
				return store.Result{}, nil, unavailable("claim", err)
			}
			return store.Result{State: store.Claimed, Fingerprint: c.Fingerprint}, t, nil
		}
		inBudget()
		go t.abandon()
		res, err := r.result(c)
		if err != nil {
			return store.Result{}, nil, fmt.Errorf("idemkey: postgres: claim: %w", err)
		}
		return res, nil, nil
	}
	return store.Result{}, nil, unavailable("claim", gaveUp(lastErr))
}

// begin is Begin through database/sql.
func (f sqlFace) begin(ctx context.Context) (store.Tx, error) {
	s := f.s
	conn, err := f.db.Conn(ctx)
	if err != nil {
		return nil, f.noConn(ctx, err)
	}
	t := &sqlRequestTx{s: s, conn: conn}
	t.ctx, t.cancel = context.WithCancel(context.WithoutCancel(ctx))
	inBudget := context.AfterFunc(ctx, t.cancel)
	t.tx, err = conn.BeginTx(t.ctx, f.opts)
	if err != nil {
		inBudget()
		t.finish()
		return nil, unavailable("begin", err)
	}
	if !inBudget() {
		go t.abandon()
		return nil, unavailable("begin", ctx.Err())
	}
	return t, nil
}

// noConn is the error of a request that found no connection within ctx.
func (f sqlFace) noConn(ctx context.Context, err error) error {
	if st := f.db.Stats(); ctx.Err() != nil && st.MaxOpenConnections > 0 && st.InUse >= st.MaxOpenConnections {
		return unavailable("claim", fmt.Errorf("%w (%d of %d held): %w", ErrPoolExhausted, st.InUse, st.MaxOpenConnections, err))
	}
	return unavailable("claim", err)
}

// sqlRequestTx is the store.Tx of one request on database/sql: the
// connection it holds, and the transaction begun on it by ClaimTx (key
// set) or Begin (key "").
type sqlRequestTx struct {
	s     *Store
	conn  *sql.Conn
	tx    *sql.Tx
	key   string
	token string
	life  time.Duration // the claim's
	// claimedAt is when the claim was made, on the database's clock.
	claimedAt time.Time
	// lapses is when the claim's life is over. ctx, the transaction's,
	// ends then, and database/sql then rolls the transaction back; the
	// driver sends COMMIT and ROLLBACK under it too, so ending it sooner
	// bounds them (bounded).
	lapses time.Time
	ctx    context.Context
	cancel context.CancelFunc

	mu    sync.Mutex
	ended bool
}

var _ store.Tx = (*sqlRequestTx)(nil)

// NewContext returns ctx carrying the transaction, which the handler gets
// back with SQLTx.
func (t *sqlRequestTx) NewContext(ctx context.Context) context.Context {
	return context.WithValue(ctx, sqlTxKey{}, t.tx)
}

// end marks the transaction ended; false when it had already.
func (t *sqlRequestTx) end() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return false
	}
	t.ended = true
	return true
}

// finish gives the connection back to the pool. Whatever the
// transaction left open ended before: database/sql rolls back a
// transaction whose context ends.
func (t *sqlRequestTx) finish() {
	t.cancel()
	t.conn.Close()
}

// abandon rolls back and gives the connection back: for a claim that took
// nothing, after its answer went out.
func (t *sqlRequestTx) abandon() {
	t.bounded(t.tx.Rollback)
	t.finish()
}

// bounded runs f, the transaction's Commit or Rollback, within the
// store's commit budget: database/sql gives them no context of their
// own, and its driver sends them under the transaction's, which ending
// cancels (pgx's driver then closes the connection: the server rolls back
// whatever was not committed).
func (t *sqlRequestTx) bounded(f func() error) error {
	stop := time.AfterFunc(t.s.commitTimeout, t.cancel)
	defer stop.Stop()
	return f()
}

// lapsed reports whether the claim's life is over: database/sql rolled
// the transaction back, or is about to.
func (t *sqlRequestTx) lapsed() bool { return t.key != "" && !time.Now().Before(t.lapses) }

// Commit keeps rec in the transaction, fenced by the owner's token and the
// claim's life, and commits: the fenced UPDATE and COMMIT, a round trip
// each. A kept 4xx whose writes are undone rolls back and keeps its record
// in a statement of its own, as the pgx face's does. It answers as the pgx face's Commit does. A handler
// that committed the transaction itself (its Commit method) committed the
// claim with its writes: the record is then kept in a statement of its
// own. One that rolled it back took the claim with it: nothing is kept.
func (t *sqlRequestTx) Commit(ctx context.Context, rec *store.Record, retention time.Duration) error {
	if !t.end() {
		return errors.New("idemkey: postgres: commit: the transaction already ended")
	}
	defer t.finish()
	if rec == nil {
		t.bounded(t.tx.Rollback)
		return errors.New("idemkey: postgres: nil record")
	}
	ctx, cancel := context.WithTimeout(ctx, t.s.commitTimeout)
	defer cancel()
	if t.lapsed() {
		t.bounded(t.tx.Rollback)
		return store.ErrNotOwner
	}
	if t.s.undo4xx && rec.Status >= 400 {
		return t.keepAlone(ctx, rec, retention)
	}
	if t.key != "" {
		args, err := recordArgs(t.key, t.token, rec, retention)
		if err != nil {
			t.bounded(t.tx.Rollback)
			return err
		}
		var kept bool
		err = t.tx.QueryRowContext(ctx, t.s.sql.keepTx, append(args, t.life.Microseconds())...).Scan(&kept)
		switch {
		case errors.Is(err, sql.ErrTxDone) && !t.lapsed():
			return t.commitOutside(ctx, rec, retention)
		case errors.Is(err, sql.ErrTxDone):
			return store.ErrNotOwner
		case sqlState(err) == "22P02":
			// Fenced: the claim is no longer this request's.
			t.bounded(t.tx.Rollback)
			return store.ErrNotOwner
		case err != nil:
			t.bounded(t.tx.Rollback)
			return unavailable("commit", err)
		}
	}
	err := t.bounded(t.tx.Commit)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sql.ErrTxDone) && t.key == "":
		return nil // the handler committed, or rolled back, itself
	case errors.Is(err, sql.ErrTxDone) || t.lapsed():
		// The claim's life ended between the keep and the COMMIT:
		// database/sql rolled back.
		return store.ErrNotOwner
	}
	// The server refused the COMMIT (a deferred constraint, a
	// serialization failure: rolled back, the key with it), or its
	// outcome is unknown (the reply was lost: the connection goes, which
	// ends whatever it had open).
	return unavailable("commit", err)
}

// keepAlone rolls back and keeps the record of a 4xx whose writes are
// undone in a statement of its own, fenced as the pgx face's is: a round
// trip each.
func (t *sqlRequestTx) keepAlone(ctx context.Context, rec *store.Record, retention time.Duration) error {
	err := t.bounded(t.tx.Rollback)
	switch {
	case errors.Is(err, sql.ErrTxDone) && t.lapsed():
		return store.ErrNotOwner
	case errors.Is(err, sql.ErrTxDone):
		return t.commitOutside(ctx, rec, retention)
	case err != nil:
		return unavailable("commit", err)
	case t.key == "":
		return nil
	}
	args, err := recordArgs(t.key, t.token, rec, retention)
	if err != nil {
		return err
	}
	lock, fpLock := t.s.locks(t.key, rec.Fingerprint)
	var kept int64
	if err := t.conn.QueryRowContext(ctx, t.s.sql.keepAlone, append(args, lock, t.claimedAt, t.life.Microseconds(), fpLock)...).Scan(&kept); err != nil {
		return unavailable("commit", err)
	}
	if kept != 1 {
		return store.ErrNotOwner
	}
	return nil
}

// commitOutside keeps rec after the handler ended the transaction itself,
// as the pgx face's does.
func (t *sqlRequestTx) commitOutside(ctx context.Context, rec *store.Record, retention time.Duration) error {
	if t.key == "" {
		return nil
	}
	args, err := recordArgs(t.key, t.token, rec, retention)
	if err != nil {
		return err
	}
	var code int
	if err := t.conn.QueryRowContext(ctx, t.s.sql.complete, args...).Scan(&code); err != nil {
		return unavailable("commit", err)
	}
	switch code {
	case 1, 2:
		return nil
	case 0:
		return unavailable("commit", errors.New("the handler rolled the request's transaction back itself; nothing was kept"))
	}
	return unavailable("commit", fmt.Errorf("unexpected answer %d", code))
}

// Rollback rolls the transaction back: the claim goes with it, and the
// key is free. When the handler had committed the transaction itself, its
// writes are in: the key stays held, and the error says so.
func (t *sqlRequestTx) Rollback(ctx context.Context) error {
	if !t.end() {
		return errors.New("idemkey: postgres: rollback: the transaction already ended")
	}
	defer t.finish()
	err := t.bounded(t.tx.Rollback)
	if errors.Is(err, sql.ErrTxDone) && t.key != "" && !t.lapsed() {
		// The handler ended it: did its claim commit?
		ctx, cancel := context.WithTimeout(ctx, t.s.commitTimeout)
		defer cancel()
		var held bool
		if err := t.conn.QueryRowContext(ctx, t.s.sql.held, t.key, t.token).Scan(&held); err != nil {
			return unavailable("rollback", err)
		}
		if held {
			return unavailable("rollback", errEndedOutside)
		}
		return nil
	}
	if err != nil && !errors.Is(err, sql.ErrTxDone) {
		// The connection failed: the server ends its session, and the
		// transaction with it.
		return unavailable("rollback", err)
	}
	return nil
}
