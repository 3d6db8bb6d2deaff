package datalayers_test

import (
	"context"
	"database/sql"

	"github.com/jmoiron/sqlx"
	"github.com/uptrace/bun"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
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
	{"gorm", openGORM},
	{"bun", openBun},
	{"sqlx", openSQLX},
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
// transaction type, and Bun's and sqlx's cannot be made from a *sql.Tx.
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

// sqlxPayment is the payment with the column names sqlx binds by.
type sqlxPayment struct {
	ID     string `db:"id"`
	Key    string `db:"idem_key"`
	Amount int64  `db:"amount"`
	By     string `db:"made_by"`
}

// openSQLX writes through sqlx: its named query bound by the *sqlx.DB
// made once on the store's *sql.DB (for its driver's placeholders), run
// on the transaction. A sqlx.Tx cannot be made from a *sql.Tx (its driver
// name is unexported): the request's *sql.Tx runs the bound query.
func openSQLX(d *database, db *sql.DB) (func(context.Context, *sql.Tx) (writer, error), error) {
	xdb := sqlx.NewDb(db, d.driver)
	const query = "INSERT INTO payments (id, idem_key, amount, made_by) VALUES (:id, :idem_key, :amount, :made_by)"
	return bindTx(func(ctx context.Context, tx *sql.Tx, p payment) error {
		q, args, err := xdb.BindNamed(query, sqlxPayment(p))
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, q, args...)
		return err
	}), nil
}

// bunPayment is the payment as a Bun model.
type bunPayment struct {
	bun.BaseModel `bun:"table:payments"`

	ID     string `bun:"id,pk"`
	Key    string `bun:"idem_key,notnull"`
	Amount int64  `bun:"amount,notnull"`
	By     string `bun:"made_by,notnull"`
}

// openBun writes through Bun: a *bun.DB made once on the store's *sql.DB,
// each query run on the request's transaction with Conn (a *sql.Tx is a
// bun.IConn). A bun.Tx cannot be made from a *sql.Tx: the handler commits
// the *sql.Tx itself.
func openBun(d *database, db *sql.DB) (func(context.Context, *sql.Tx) (writer, error), error) {
	bdb := bun.NewDB(db, d.bun())
	return bindTx(func(ctx context.Context, tx *sql.Tx, p payment) error {
		_, err := bdb.NewInsert().Conn(tx).Model(&bunPayment{ID: p.ID, Key: p.Key, Amount: p.Amount, By: p.By}).Exec(ctx)
		return err
	}), nil
}

// gormPayment is the payment as a GORM model (table "payments", by
// GORM's naming).
type gormPayment struct {
	ID      string `gorm:"primaryKey"`
	IdemKey string
	Amount  int64
	MadeBy  string
}

func (gormPayment) TableName() string { return "payments" }

// gormWriter is a *gorm.DB opened on one request's transaction.
type gormWriter struct{ db *gorm.DB }

func (w gormWriter) insert(p payment) error {
	return w.db.Create(&gormPayment{ID: p.ID, IdemKey: p.Key, Amount: p.Amount, MadeBy: p.By}).Error
}

func (w gormWriter) commit() error { return w.db.Commit().Error }

// openGORM opens GORM on each request's transaction (its Conn), with a
// fresh gorm.Config each time (gorm.Open writes into the one it is
// given, so one shared by concurrent requests would race).
// SkipDefaultTransaction spares GORM an attempt to begin a transaction of
// its own around each write, which it cannot on a *sql.Tx (it then goes
// on without one: the tests pass without the setting too). Its logger is
// off: the helper process speaks on its standard output.
//
// An Open per request is cheap next to a round trip. Measured here
// (without the race detector): the Open alone about 20 µs and 320
// allocations; with the model's schema parsed again on the first write,
// some 415 allocations more per request in all than a write on a
// *gorm.DB kept open, and no difference in time to be seen next to the
// insert's round trip (about 115 µs a request either way, over
// loopback). The Open opens no connection and sends nothing.
func openGORM(d *database, _ *sql.DB) (func(context.Context, *sql.Tx) (writer, error), error) {
	return func(ctx context.Context, tx *sql.Tx) (writer, error) {
		db, err := gorm.Open(d.gorm(tx), &gorm.Config{SkipDefaultTransaction: true, Logger: logger.Discard})
		if err != nil {
			return nil, err
		}
		return gormWriter{db.WithContext(ctx)}, nil
	}, nil
}
