package datalayers_test

import (
	"context"
	"database/sql"
)

// payment is what the handler writes, whatever the data layer.
type payment struct {
	ID     string
	Key    string
	Amount int64
	By     string
}

// layer is a data layer a service writes through. open readies it on
// the store's *sql.DB, once per server (as a service does at start); what
// it returns binds the layer to one request's transaction.
type layer struct {
	name string
	open func(d *database, db *sql.DB) (bind func(ctx context.Context, tx *sql.Tx) (writer, error), err error)
}

// writer is a data layer bound to a request's transaction.
type writer interface {
	// insert writes p through the transaction.
	insert(p payment) error
	// commit commits the transaction through the layer (the handler
	// ending it itself).
	commit() error
}

// layers are the data layers the tests run through.
var layers = []layer{
	{"database/sql", openPlain},
	{"sqlc", openSQLC},
}

func layerNamed(name string) (layer, bool) {
	for _, l := range layers {
		if l.name == name {
			return l, true
		}
	}
	return layer{}, false
}

// txWriter writes through a layer that runs its statements on the
// *sql.Tx, and commits the *sql.Tx itself: sqlc's queries have no
// transaction type.
type txWriter struct {
	ctx   context.Context
	tx    *sql.Tx
	write func(ctx context.Context, tx *sql.Tx, p payment) error
}

func (w txWriter) insert(p payment) error { return w.write(w.ctx, w.tx, p) }
func (w txWriter) commit() error          { return w.tx.Commit() }

func bindTx(write func(ctx context.Context, tx *sql.Tx, p payment) error) func(context.Context, *sql.Tx) (writer, error) {
	return func(ctx context.Context, tx *sql.Tx) (writer, error) {
		return txWriter{ctx: ctx, tx: tx, write: write}, nil
	}
}

// openPlain writes with database/sql alone: the reference.
func openPlain(d *database, _ *sql.DB) (func(context.Context, *sql.Tx) (writer, error), error) {
	query := d.bind("INSERT INTO payments (id, idem_key, amount, made_by) VALUES (?, ?, ?, ?)")
	return bindTx(func(ctx context.Context, tx *sql.Tx, p payment) error {
		_, err := tx.ExecContext(ctx, query, p.ID, p.Key, p.Amount, p.By)
		return err
	}), nil
}

// openSQLC writes through the queries sqlc generates: sqlcdb.New(db)
// once, and WithTx(tx) per request.
func openSQLC(d *database, db *sql.DB) (func(context.Context, *sql.Tx) (writer, error), error) {
	return bindTx(d.sqlc(db)), nil
}
