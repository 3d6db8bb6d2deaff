package postgres

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// ErrTxManaged is what the request's transaction answers when the handler
// calls its Commit or Rollback: the middleware commits it, with the
// record, after the handler returns a response it keeps, and rolls it
// back after a 5xx or a panic. The call changes nothing.
var ErrTxManaged = errors.New("idemkey: postgres: the request's transaction is committed or rolled back by the middleware, not by the handler")

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
// The transaction is a pgx.Tx with two differences. Its Commit and
// Rollback do nothing and return ErrTxManaged: answer a 5xx (or panic) to
// roll back. And it ends when the handler returns, or when the handler
// ends it with COMMIT or ROLLBACK as SQL: later use returns
// pgx.ErrTxClosed, so that nothing the handler writes after commits on its
// own, outside the claim. Never run COMMIT or ROLLBACK through it as SQL. Begin
// starts a savepoint, as pgx's does, whose Commit and Rollback work.
func Tx(ctx context.Context) pgx.Tx {
	h, _ := ctx.Value(txKey{}).(*handlerTx)
	if h == nil {
		return nil
	}
	return h
}

// handlerTx is the pgx.Tx the handler sees: the request's transaction,
// begun with its claim, on the connection it runs on. pgx may add methods
// to pgx.Tx in a minor release; this type then needs them too, and the
// compile-time check below says so.
type handlerTx struct {
	conn *pgx.Conn
	// inUse is held for reading by each call that sends on conn, from its
	// check that the transaction is open to its return, and for writing
	// by close: once close returns, no call of the handler's (a goroutine
	// it left running) is still sending, nor will one, on a connection
	// the store then commits, rolls back and gives back to the pool.
	inUse  sync.RWMutex
	closed atomic.Bool
	opts   pgx.TxOptions // for LargeObjects
	// connTaken is set when the handler took the connection with Conn,
	// or prepared a named statement on it (which would outlive the
	// request on the server, and reach the pooler's next client): it is
	// closed, not pooled, when the request ends.
	connTaken atomic.Bool
	// savepoints numbers the savepoints Begin makes.
	savepoints int
	// lo is pgx's view of the transaction, for LargeObjects.
	lo pgx.Tx
}

var _ pgx.Tx = (*handlerTx)(nil)

// close ends the handler's use of the transaction, once the calls it has
// in progress have returned. One still running after wait has its
// connection's socket closed, which ends it: the server then rolls the
// transaction back, and the store's commit fails, rather than wait on it.
func (h *handlerTx) close(wait time.Duration) {
	stop := time.AfterFunc(wait, func() { h.conn.PgConn().Conn().Close() })
	h.inUse.Lock()
	stop.Stop()
	h.closed.Store(true)
	h.inUse.Unlock()
}

// open reports whether the handler may still use the transaction: it has
// not returned, and it has not ended the transaction itself (a COMMIT or
// ROLLBACK sent as SQL leaves the connection outside a transaction). After
// the handler's own ROLLBACK the claim is gone with it and a retry may be
// running the key: a statement sent now would commit on its own, outside
// any claim, so from then on every statement is refused with
// pgx.ErrTxClosed.
func (h *handlerTx) open() bool {
	if h.closed.Load() {
		return false
	}
	if h.conn.PgConn().TxStatus() == 'I' {
		h.closed.Store(true)
		return false
	}
	return true
}

// Begin starts a savepoint: a pseudo nested transaction whose Commit
// releases it and whose Rollback rolls back to it.
func (h *handlerTx) Begin(ctx context.Context) (pgx.Tx, error) {
	h.inUse.RLock()
	defer h.inUse.RUnlock()
	if !h.open() {
		return nil, pgx.ErrTxClosed
	}
	h.savepoints++
	name := "idemkey_sp_" + strconv.Itoa(h.savepoints)
	if _, err := h.conn.Exec(ctx, "SAVEPOINT "+name); err != nil {
		return nil, err
	}
	return &savepointTx{h: h, name: name}, nil
}

// Commit does nothing and returns ErrTxManaged (pgx.ErrTxClosed once the
// handler has returned).
func (h *handlerTx) Commit(context.Context) error {
	h.inUse.RLock()
	defer h.inUse.RUnlock()
	if !h.open() {
		return pgx.ErrTxClosed
	}
	return ErrTxManaged
}

// Rollback does nothing and returns ErrTxManaged (pgx.ErrTxClosed once the
// handler has returned), so that a deferred Rollback is harmless.
func (h *handlerTx) Rollback(context.Context) error {
	h.inUse.RLock()
	defer h.inUse.RUnlock()
	if !h.open() {
		return pgx.ErrTxClosed
	}
	return ErrTxManaged
}

func (h *handlerTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	h.inUse.RLock()
	defer h.inUse.RUnlock()
	if !h.open() {
		return 0, pgx.ErrTxClosed
	}
	return h.conn.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

func (h *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	h.inUse.RLock()
	defer h.inUse.RUnlock()
	if !h.open() {
		return errBatch{pgx.ErrTxClosed}
	}
	return h.conn.SendBatch(ctx, b)
}

// LargeObjects returns the large objects of the transaction. pgx makes
// them only on a transaction it began itself: the first call sends pgx's
// BEGIN inside the open transaction, which PostgreSQL answers with a
// warning and ignores, and the large objects then run in the request's
// transaction.
func (h *handlerTx) LargeObjects() pgx.LargeObjects {
	h.inUse.RLock()
	defer h.inUse.RUnlock()
	// What the handler does with them is sent on the connection outside
	// these checks: it is closed, not pooled, when the request ends.
	h.connTaken.Store(true)
	if h.lo == nil && h.open() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if tx, err := h.conn.BeginTx(ctx, h.opts); err == nil {
			h.lo = tx
		}
	}
	if h.lo == nil {
		return pgx.LargeObjects{}
	}
	return h.lo.LargeObjects()
}

func (h *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	h.inUse.RLock()
	defer h.inUse.RUnlock()
	if !h.open() {
		return nil, pgx.ErrTxClosed
	}
	if name != "" {
		h.connTaken.Store(true)
	}
	return h.conn.Prepare(ctx, name, sql)
}

func (h *handlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	h.inUse.RLock()
	defer h.inUse.RUnlock()
	if !h.open() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return h.conn.Exec(ctx, sql, args...)
}

func (h *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	h.inUse.RLock()
	defer h.inUse.RUnlock()
	if !h.open() {
		return errRows{pgx.ErrTxClosed}, pgx.ErrTxClosed
	}
	return h.conn.Query(ctx, sql, args...)
}

func (h *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	h.inUse.RLock()
	defer h.inUse.RUnlock()
	if !h.open() {
		return &oneRow{err: pgx.ErrTxClosed}
	}
	return h.conn.QueryRow(ctx, sql, args...)
}

// Conn returns the connection the transaction runs on: what the handler
// runs on it directly is part of the transaction too. The connection is
// closed when the request ends, so that nothing the handler runs on it
// later can commit on its own or land in another request's transaction.
// Never begin or commit a transaction on it (pgx.BeginFunc(ctx, conn,
// ...), or conn.Begin): PostgreSQL ignores a BEGIN inside a transaction,
// and the COMMIT that follows commits the request's transaction early.
// When that happens anyway the middleware keeps the key held (see the
// package documentation). Pass the pgx.Tx itself instead: its Begin is a
// savepoint.
func (h *handlerTx) Conn() *pgx.Conn {
	h.connTaken.Store(true)
	return h.conn
}

// oneRow is the pgx.Row of QueryRow.
type oneRow struct {
	rows pgx.Rows
	err  error
}

func (r *oneRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// errRows are the rows of a query that could not be sent.
type errRows struct{ err error }

func (errRows) Close()                                       {}
func (r errRows) Err() error                                 { return r.err }
func (errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                          { return r.err }
func (r errRows) Values() ([]any, error)                     { return nil, r.err }
func (errRows) RawValues() [][]byte                          { return nil }
func (errRows) Conn() *pgx.Conn                              { return nil }
func (errRows) TypeMap() *pgtype.Map                         { return nil }

// errBatch is the result of a batch that could not be sent.
type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return errRows(b), b.err }
func (b errBatch) QueryRow() pgx.Row                { return &oneRow{err: b.err} }
func (b errBatch) Close() error                     { return b.err }
func (errBatch) Tx() pgx.Tx                         { return nil }

// savepointTx is a savepoint inside the request's transaction.
type savepointTx struct {
	h      *handlerTx
	name   string
	closed bool
}

var _ pgx.Tx = (*savepointTx)(nil)

func (s *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if s.closed {
		return nil, pgx.ErrTxClosed
	}
	return s.h.Begin(ctx)
}

// Commit releases the savepoint.
func (s *savepointTx) Commit(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.h.Exec(ctx, "RELEASE SAVEPOINT "+s.name)
	return err
}

// Rollback rolls back to the savepoint.
func (s *savepointTx) Rollback(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.h.Exec(ctx, "ROLLBACK TO SAVEPOINT "+s.name)
	return err
}

func (s *savepointTx) CopyFrom(ctx context.Context, t pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if s.closed {
		return 0, pgx.ErrTxClosed
	}
	return s.h.CopyFrom(ctx, t, cols, src)
}

func (s *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if s.closed {
		return errBatch{pgx.ErrTxClosed}
	}
	return s.h.SendBatch(ctx, b)
}

func (s *savepointTx) LargeObjects() pgx.LargeObjects { return s.h.LargeObjects() }

func (s *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if s.closed {
		return nil, pgx.ErrTxClosed
	}
	return s.h.Prepare(ctx, name, sql)
}

func (s *savepointTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if s.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return s.h.Exec(ctx, sql, args...)
}

func (s *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if s.closed {
		return errRows{pgx.ErrTxClosed}, pgx.ErrTxClosed
	}
	return s.h.Query(ctx, sql, args...)
}

func (s *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if s.closed {
		return &oneRow{err: pgx.ErrTxClosed}
	}
	return s.h.QueryRow(ctx, sql, args...)
}

func (s *savepointTx) Conn() *pgx.Conn { return s.h.Conn() }
