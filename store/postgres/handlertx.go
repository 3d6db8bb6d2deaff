package postgres

import (
	"context"
	"errors"
	"strconv"
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
// a TxStore's claim opened for the handler, in which the middleware keeps
// the response. The handler makes its writes through it, so that they and
// the kept response commit together or not at all. It returns nil when the
// request runs outside such a transaction (a route whose key is optional,
// called without one; a store that is not transactional).
//
// The transaction is a pgx.Tx with three differences. It begins lazily:
// BEGIN goes out in one round trip with the handler's first statement,
// and a handler that writes nothing never begins it. Its Commit and
// Rollback do nothing and return ErrTxManaged: answer a 5xx (or panic) to
// roll back. And it ends when the handler returns: later use returns
// pgx.ErrTxClosed. Never run COMMIT or ROLLBACK through it as SQL.
// Begin starts a savepoint, as pgx's does, whose Commit and Rollback work.
func Tx(ctx context.Context) pgx.Tx {
	h, _ := ctx.Value(txKey{}).(*handlerTx)
	if h == nil {
		return nil
	}
	return h
}

// handlerTx is the pgx.Tx the handler sees.
type handlerTx struct {
	conn   *pgx.Conn
	begin  string
	closed atomic.Bool
	opts   pgx.TxOptions // as begin says, for LargeObjects
	// broken is set when a begin the handler needed failed, or when a
	// statement failed before the transaction began (the server refused
	// it before BEGIN, sent with it, ran): Commit must not keep anything.
	broken atomic.Bool
	// began is set once BEGIN has run on the server. A connection that is
	// then found outside a transaction had it ended by something other
	// than the middleware (a COMMIT sent through Conn): its writes may be
	// committed, and the key must not be freed for a retry.
	began atomic.Bool
	// connTaken is set when the handler took the connection with Conn:
	// it is closed, not pooled, when the request ends.
	connTaken atomic.Bool
	// savepoints numbers the savepoints Begin makes.
	savepoints int
	// lo is a transaction begun by pgx itself, for LargeObjects.
	lo pgx.Tx
}

var _ pgx.Tx = (*handlerTx)(nil)

// close ends the handler's use of the transaction.
func (h *handlerTx) close() { h.closed.Store(true) }

// begun reports whether the transaction is open on the server (the
// connection is in a transaction block, failed or not).
func (h *handlerTx) begun() bool { return h.conn.PgConn().TxStatus() != 'I' }

// settle records what a statement sent with BEGIN in front of it left:
// the transaction begun, or, when it failed and nothing began, a broken
// transaction.
func (h *handlerTx) settle(err error) {
	if h.begun() {
		h.began.Store(true)
	} else if err != nil {
		h.broken.Store(true)
	}
}

// ensure begins the transaction when it has not begun, in a round trip of
// its own.
func (h *handlerTx) ensure(ctx context.Context) error {
	if h.closed.Load() {
		return pgx.ErrTxClosed
	}
	if h.begun() {
		return nil
	}
	if _, err := h.conn.Exec(ctx, h.begin); err != nil {
		h.broken.Store(true)
		return err
	}
	h.began.Store(true)
	return nil
}

// lazyOK reports whether a statement with these arguments can go out in a
// batch after BEGIN: a batch cannot take per-query execution modes or
// result formats.
func lazyOK(args []any) bool {
	if len(args) == 0 {
		return true
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		return false
	}
	return true
}

// Begin starts a savepoint: a pseudo nested transaction whose Commit
// releases it and whose Rollback rolls back to it.
func (h *handlerTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if h.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	h.savepoints++
	name := "idemkey_sp_" + strconv.Itoa(h.savepoints)
	sql := "SAVEPOINT " + name
	if !h.begun() {
		sql = h.begin + ";\nSAVEPOINT " + name
	}
	_, err := h.conn.Exec(ctx, sql)
	h.settle(err)
	if err != nil {
		return nil, err
	}
	return &savepointTx{h: h, name: name}, nil
}

// Commit does nothing and returns ErrTxManaged (pgx.ErrTxClosed once the
// handler has returned).
func (h *handlerTx) Commit(context.Context) error {
	if h.closed.Load() {
		return pgx.ErrTxClosed
	}
	return ErrTxManaged
}

// Rollback does nothing and returns ErrTxManaged (pgx.ErrTxClosed once the
// handler has returned), so that a deferred Rollback is harmless.
func (h *handlerTx) Rollback(context.Context) error {
	if h.closed.Load() {
		return pgx.ErrTxClosed
	}
	return ErrTxManaged
}

func (h *handlerTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if err := h.ensure(ctx); err != nil {
		return 0, err
	}
	return h.conn.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

// SendBatch sends b, with BEGIN in front of it when the transaction has
// not begun: still one round trip.
func (h *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if h.closed.Load() {
		return errBatch{pgx.ErrTxClosed}
	}
	if h.begun() || len(b.QueuedQueries) == 0 {
		return h.conn.SendBatch(ctx, b)
	}
	br, err := h.sendAfterBegin(ctx, b.QueuedQueries)
	if err != nil {
		return errBatch{err}
	}
	return br
}

// sendAfterBegin sends queries with BEGIN in front of them, in one round
// trip, and reads BEGIN's result. When that fails, the batch is closed and
// the transaction settled (broken, when nothing began).
func (h *handlerTx) sendAfterBegin(ctx context.Context, queries []*pgx.QueuedQuery) (pgx.BatchResults, error) {
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 1+len(queries))}
	b.QueuedQueries = append(b.QueuedQueries, &pgx.QueuedQuery{SQL: h.begin})
	b.QueuedQueries = append(b.QueuedQueries, queries...)
	br := h.conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		h.settle(err)
		return nil, err
	}
	h.began.Store(true)
	return br, nil
}

// LargeObjects returns the large objects of the transaction. pgx makes
// them only on a transaction it began itself: LargeObjects begins one with
// pgx (with the store's TxOptions) when the handler's has not begun, and
// otherwise sends pgx's BEGIN inside the open transaction, which
// PostgreSQL answers with a warning and ignores. Call it before any other statement to spare that round trip.
func (h *handlerTx) LargeObjects() pgx.LargeObjects {
	if h.lo == nil && !h.closed.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tx, err := h.conn.BeginTx(ctx, h.opts)
		if err != nil {
			h.broken.Store(true)
		} else {
			h.lo = tx
			h.began.Store(true)
		}
	}
	if h.lo == nil {
		return pgx.LargeObjects{}
	}
	return h.lo.LargeObjects()
}

func (h *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if h.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return h.conn.Prepare(ctx, name, sql)
}

// Exec runs sql in the transaction; when it has not begun, BEGIN goes out
// in the same round trip.
func (h *handlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if h.closed.Load() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	if h.begun() || !lazyOK(args) {
		if err := h.ensure(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return h.conn.Exec(ctx, sql, args...)
	}
	if len(args) == 0 {
		// pgx runs an Exec without arguments as a simple query, which may
		// hold several statements: BEGIN joins them, and the tag is the
		// last one's.
		tag, err := h.conn.Exec(ctx, h.begin+";\n"+sql)
		h.settle(err)
		return tag, err
	}
	br, err := h.sendAfterBegin(ctx, []*pgx.QueuedQuery{{SQL: sql, Arguments: args}})
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	h.settle(err)
	return tag, err
}

// Query runs sql in the transaction; when it has not begun, BEGIN goes
// out in the same round trip.
func (h *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if h.closed.Load() {
		return errRows{pgx.ErrTxClosed}, pgx.ErrTxClosed
	}
	if h.begun() || !lazyOK(args) {
		if err := h.ensure(ctx); err != nil {
			return errRows{err}, err
		}
		return h.conn.Query(ctx, sql, args...)
	}
	br, err := h.sendAfterBegin(ctx, []*pgx.QueuedQuery{{SQL: sql, Arguments: args}})
	if err != nil {
		return errRows{err}, err
	}
	rows, err := br.Query()
	if err != nil {
		rows.Close()
		br.Close()
		return errRows{err}, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// QueryRow runs sql in the transaction as Query does, for one row.
func (h *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := h.Query(ctx, sql, args...)
	return &oneRow{rows: rows, err: err}
}

// Conn returns the connection the transaction runs on, after beginning the
// transaction (bounded by 5 seconds), so that what the handler runs on it
// directly is part of the transaction too. The connection is closed when
// the request ends, so that nothing the handler runs on it later can
// commit on its own or land in another request's transaction. Never begin
// or commit a transaction on it (pgx.BeginFunc(ctx, conn, ...), or
// conn.Begin): PostgreSQL ignores a BEGIN inside a transaction, and the
// COMMIT that follows commits the request's transaction early. When that
// happens anyway the middleware keeps the key held (see the package
// documentation). Pass the pgx.Tx itself instead: its Begin is a
// savepoint.
func (h *handlerTx) Conn() *pgx.Conn {
	h.connTaken.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h.ensure(ctx)
	return h.conn
}

// batchRows are the rows of a query sent after BEGIN in one batch: closing
// them closes the batch, which frees the connection.
type batchRows struct {
	pgx.Rows
	br       pgx.BatchResults
	closed   bool
	closeErr error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if !r.closed {
		r.closed = true
		r.closeErr = r.br.Close()
	}
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.closeErr
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
