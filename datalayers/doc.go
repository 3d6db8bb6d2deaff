// Package datalayers shows the request's transaction used through the
// data layers services bring, on database/sql: sqlc's database/sql
// output, GORM, Bun, sqlx, and plain database/sql for reference. The
// middleware runs on a store that keeps the idempotency record in the
// handler's own transaction (store/postgres's NewDB); the handler gets
// that transaction as a *sql.Tx and writes a payment through the data
// layer, so the payment and the kept answer commit together or not at
// all.
//
// The package has no API: it is its tests. For each database and each
// data layer they check, through the middleware:
//
//   - 32 concurrent requests with one key make one payment; the others
//     are answered 409 or replay the first answer, and a later replay
//     returns the same body;
//   - a process killed (SIGKILL) after its handler's write, before the
//     commit, leaves no payment: the retry on another process runs at
//     once (201, not a replay) and its payment is the only one;
//   - a handler that commits the transaction itself through the data
//     layer and then answers 500 leaves the key held: the retry gets 409,
//     and its payment is the only one.
//
// How each layer takes the transaction, per request (tx is
// postgres.SQLTx(r.Context())):
//
//	sqlc    queries.WithTx(tx).CreatePayment(ctx, params)   (queries := db.New(sqlDB), once)
//	GORM    gorm.Open(gormpg.New(gormpg.Config{Conn: tx}), &gorm.Config{SkipDefaultTransaction: true})
//	Bun     bunDB.NewInsert().Conn(tx).Model(&p).Exec(ctx)  (bunDB := bun.NewDB(sqlDB, pgdialect.New()), once)
//	sqlx    q, args, err := xdb.BindNamed(query, p); tx.ExecContext(ctx, q, args...)  (xdb := sqlx.NewDb(sqlDB, "pgx"), once)
//
// The module is one of its own, so that none of these data layers reaches
// the requirements of idemkey's modules. The sqlc package (internal/sqlcdb)
// is written by hand in the shape sqlc generates; sqlc is not run here.
//
// The tests run on the shared PostgreSQL (DATABASE_URL, or
// postgres://postgres@127.0.0.1:5432/test), in a schema of each test's
// own, dropped at its end; they are skipped without a server, and fail
// without one when CI is set. The databases are a table: another engine
// with a store of the same kind is another entry.
package datalayers
