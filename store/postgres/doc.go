// Package postgres is the idempotency store that keeps each record in a
// PostgreSQL table, through a pgx v5 pool, and keeps it in the handler's
// own transaction: the handler's writes and the kept response commit
// together or not at all. A process that dies between its business write
// and keeping the record cannot make a retry run the handler again,
// because there is no such moment: both are one COMMIT.
//
// # Using it
//
//	pool, err := pgxpool.New(ctx, "postgres://app@db/app?pool_max_conns=64")
//	err = postgres.Migrate(ctx, pool)           // or apply postgres.SchemaSQL with your migration tool
//	st, err := postgres.New(ctx, pool)          // checks the table and the server; starts the sweeper
//	defer st.Close()
//	idem, err := middleware.New(st)
//	r.With(idem.Required()).Post("/payments", createPayment)
//
//	func createPayment(w http.ResponseWriter, r *http.Request) {
//		tx := postgres.Tx(r.Context()) // the request's transaction
//		_, err := tx.Exec(r.Context(), "INSERT INTO payments (id, amount) VALUES ($1, $2)", id, amount)
//		if err != nil {
//			http.Error(w, "try again", http.StatusServiceUnavailable) // 5xx: rolled back, key released
//			return
//		}
//		w.WriteHeader(http.StatusCreated) // kept: the record commits with the insert, then this goes out
//	}
//
// The one rule for handlers: write through the request's transaction
// (Tx). A write made through the pool directly commits on its own, outside
// the request's transaction, and a retry after a crash can repeat it.
// Every covered request has one: on a route where the key is optional, a
// request without a key runs in a transaction too (its writes commit
// before the response goes out; nothing is kept), so the handler above is
// safe on Required and Optional routes alike.
//
// The handler never commits or rolls back: a kept status commits, with
// the record, before the response goes out; a 5xx, a transient 4xx (408,
// 409, 425, 429) or a panic rolls back and frees the key. A kept 4xx (400,
// 404, 422, ...) keeps its answer and undoes the handler's writes, since
// clients read a 4xx as "nothing happened" (WithClientErrorWrites keeps
// them): the whole transaction rolls back, and the record is then kept in
// a statement of its own, fenced as the claim was (no subtransaction: see
// below). If another request took the key in the moment between the two,
// that request wins: the 4xx is not kept, and its client gets 503. A COMMIT
// that fails, or whose reply is lost, answers 503: the retry then replays
// the record if it committed, or runs again if it did not. On such a route
// a flush is the commit (the record, with the body omitted, commits before
// the first byte goes out), and the transaction refuses statements after
// it: read the rows you stream before you flush.
//
// Helpers that take a *pgx.Conn get Tx(ctx).Conn(): statements run on it
// are in the transaction, and it is closed (not pooled) when the request
// ends. Never begin or commit a transaction on it (conn.Begin,
// pgx.BeginFunc(ctx, conn, ...)): PostgreSQL ignores that BEGIN, and the
// COMMIT after it commits the request's transaction early. Pass the pgx.Tx
// instead, whose Begin is a savepoint (the one subtransaction a request
// can have, and only when its handler asks for it). When the handler commits the
// request's transaction itself anyway, its claim commits with its writes:
// a kept answer is still kept (in a statement of its own), and after a 5xx
// or a panic the key stays held for 24 hours (repeats get 409; idemctl
// delete frees it), so that a retry cannot make the writes twice. A
// handler that rolls it back itself takes its claim with it: the key is
// free (a retry may run while the handler goes on), the answer is 503, and
// the transaction refuses the handler's later statements (pgx.ErrTxClosed),
// which would otherwise commit on their own. A statement sent on Conn()
// directly is beyond that guard. A hijacked connection rolls the transaction
// back: do not hijack on a transactional route. pgx may add methods to
// pgx.Tx in a minor release; the transaction Tx returns implements the
// interface at the pgx version in go.mod, and a newer pgx that adds one
// fails to build against it rather than misbehave.
//
// The Store is a plain store.Store too (Claim, Complete, Release, Extend:
// one statement and one round trip each), for services that want durable
// records without Redis; the middleware uses the transactional flow
// (ClaimTx) whenever the store has it.
//
// # database/sql: sqlc, GORM, Bun, sqlx, ent
//
// NewDB makes the same store on a *sql.DB of any PostgreSQL driver (pgx's
// stdlib, lib/pq), and the handler gets the request's transaction as a
// *sql.Tx with SQLTx, which every data layer on database/sql can write
// through:
//
//	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
//	db.SetMaxOpenConns(64)                 // one per request served at once
//	err = postgres.MigrateDB(ctx, db)
//	st, err := postgres.NewDB(ctx, db)
//
//	func createPayment(w http.ResponseWriter, r *http.Request) {
//		tx := postgres.SQLTx(r.Context())
//		_, err := tx.ExecContext(r.Context(), "INSERT INTO payments (id, amount) VALUES ($1, $2)", id, amount)
//		...
//	}
//
// The claim, the locks, the statements and every guarantee are the
// pgx face's; what differs is the round trips, as database/sql sends one
// statement at a time (see below), and that a *sql.Tx is a concrete type
// whose Commit and Rollback the handler can call. The handler need not:
// the middleware ends the transaction as it does on the pgx face. A
// handler that calls Commit commits its claim with its writes: a kept
// answer is then kept in a statement of its own, and after a 5xx, a panic
// or a crash the key stays held for 24 hours (repeats get 409) rather than
// let a retry make the writes twice; its writes are in whatever it
// answers, so a kept 4xx after it keeps them too. One that calls Rollback
// takes the claim with it: nothing is kept, the key is free and the answer
// is 503.
// Never send COMMIT or ROLLBACK as SQL through it.
//
// The transaction is begun with a context that ends at the claim's life:
// database/sql rolls it back then, which is how a live owner that stalls
// past its route's deadline lets go of the key on this face.
//
// # What a claim holds
//
// BEGIN and the claim go out in one round trip, and the claim holds only
// what ends with that transaction: two transaction-scoped advisory locks,
// on a hash of the table and key and on one of the key with the request's
// fingerprint, and the claim's row, not yet committed. A repeat finds the
// key's lock taken: when the second lock is taken too it is a repeat of
// the running request (409), else the key is held for another request
// (422). Nothing of a claim is held in a session, so the store works the
// same connected directly and behind a pooler in transaction mode, and
// when a request ends nothing of it is left on the server. No path opens a
// subtransaction (no SAVEPOINT, and no EXCEPTION block in the claim
// function), which stall PostgreSQL's replicas under load; only a handler
// that begins a nested transaction on Tx makes one.
//
// Why the claim writes its row, and the commit updates it. A first run
// writes two versions of the row: the claim's, uncommitted and seen by no
// one (the locks are what exclude other requests), and the record, an
// update that changes no indexed column (a heap-only update). Writing the
// record once, at the end, would need no row from the claim; but a
// handler that ends the request's transaction itself (a *sql.Tx's
// Commit, which database/sql lets any data layer call, or a COMMIT sent on
// Conn()) would then commit its writes with nothing of the claim, and
// let go of its locks: a retry arriving before the middleware sees it
// would find the key free and run again. The claim's row commits with
// such a COMMIT and holds the key (see the handler rules above), so no
// retry can run twice. A handler's COMMIT cannot be refused without a
// write the COMMIT must check, so the row stays.
//
// Repeats ask in the claim's round trip. A replay, 409 or 422 is answered
// by the claim itself: BEGIN and the claim in one round trip, its ROLLBACK
// sent after the answer and not waited for. Asking first, with one
// statement outside any transaction, and beginning only when the key is
// free, makes a replay cheaper for the database (about 86-135 µs of
// PostgreSQL CPU against 195-219, 2-CPU AMD EPYC, busy, load driver) but
// every first run a round trip and a statement dearer (about 740 µs of
// PostgreSQL CPU against 610, same runs): first runs are most of a
// service's keyed requests, so the claim comes first.
//
// A dead owner's transaction ends with its connection (a killed process,
// a dropped connection, pg_terminate_backend), and its locks and its
// uncommitted row with it: the next request claims the key at once. A live
// owner's transaction ends at its claim's life (the route's deadline plus
// middleware.ClaimMargin) at the latest: the claim sets statement_timeout
// and idle_in_transaction_session_timeout to that life for its
// transaction, the store closes the connection when the life is over, and
// the keep is fenced by the life on the database's clock, so a late commit
// never lands (the owner's client gets 503; the retry runs again, once). A
// client that vanishes without closing its connection (a machine powered
// off, a partition) keeps its transaction until the server notices: set
// tcp_keepalives_idle on the server.
//
// Every isolation level works (WithTxOptions): the claim is the
// transaction's first statement, and a claim that meets a record committed
// after its snapshot begins again (under REPEATABLE READ and SERIALIZABLE
// the INSERT reports it as a serialization failure), so the record is
// replayed, never run again. Under SERIALIZABLE, the commit may also fail
// with a serialization error of the handler's own making: the client gets
// 503 and its retry runs again.
//
// # How PostgreSQL is reached
//
//	direct connection            works
//	pooler in session mode       works
//	pooler in transaction mode   works (PgBouncer pool_mode=transaction, hosted poolers); see below
//	pooler in statement mode     does not: New fails (the pooler refuses transactions)
//
// Behind a transaction-mode pooler without support for prepared statements
// (PgBouncer before 1.21, or max_prepared_statements = 0), connect pgx
// with default_query_exec_mode=exec, cache_describe or simple_protocol (in
// the URL, or pgx.ConnConfig.DefaultQueryExecMode). New and NewDB (with
// pgx's database/sql driver; other drivers are not probed) find out when
// the pool is in a mode that names statements and its connections lose
// them between transactions, and refuse it with ErrPreparedStatements: a
// statement prepared by name on one connection, outside a transaction,
// must still be there for its next statement while a second connection
// holds a transaction open (behind PgBouncer, which hands out the server
// connection used last, the second gets the first's, and the first's next
// statement another). A pooler that hands the first connection its server
// connection again is not seen, nor one of a single server connection.
// The store's statements take the pool's mode, as the handler's do: in
// the modes above they name no prepared statement, and where the pool
// keeps them prepared they are planned once per connection (planned on
// every call, as exec mode does, the keep costs 0.14-0.2 ms and the claim's
// call 0.1 ms of planning per first run: EXPLAIN ANALYZE, PostgreSQL 15 on
// a busy 2-CPU AMD EPYC). Its default,
// cache_statement, names prepared statements on a server connection
// another client then gets ("prepared statement ... already exists"), and
// describe_exec fails under concurrency (its describe and its execute are
// two round trips, which may reach two server connections: "bind message
// supplies 1 parameters, but prepared statement "" requires 3"); both were
// seen through PgBouncer 1.18. With those modes the store names no
// prepared statement either; it takes no session lock and sets nothing for
// a session: every setting is local to a transaction. Each request's transaction holds one
// of the pooler's server connections for its handler's whole run: size the
// pooler's pool as the store's (below). A pooler that multiplexes the
// transaction's statements across server connections is not supported.
//
// Behind such a pooler, a handler must not prepare statements by name on
// the request's transaction: not with the pgx face's Prepare (the store
// closes that connection at the request's end, but the pooler keeps the
// server connection, statement and all), nor on the database/sql face with
// the *sql.Tx's PrepareContext or Stmt (or GORM's PrepareStmt), which
// database/sql closes only after the COMMIT, when the pooler may already
// have handed the server connection to another client. Unnamed statements
// (exec mode, as above) leave nothing behind.
//
// # Statements and round trips
//
//	path                                  round trips
//	ClaimTx: first run                     1  BEGIN, the claim (a call of the table's claim function)
//	handler's statements                   1 each
//	Tx.Commit                              1  pipeline: the fenced UPDATE that keeps the record, COMMIT
//	Tx.Commit, kept 4xx, writes undone     1  pipeline: ROLLBACK, the record kept in a fenced statement of its own
//	Tx.Rollback                            1  ROLLBACK
//	ClaimTx: replay, in flight             1  the same pipeline; its ROLLBACK is sent after, not waited for
//	claim of a lapsed row                  1  the same statement takes it over
//	Claim (plain): first run, replay       1
//	Complete, Release, Extend              1
//	Sweep                                  1 per batch
//
// Through database/sql (NewDB), one statement a round trip:
//
//	ClaimTx: first run                     2  BEGIN, the claim
//	Tx.Commit                              2  the fenced UPDATE, COMMIT (a kept 4xx whose writes are undone: ROLLBACK, the record)
//	Tx.Rollback                            1
//	ClaimTx: replay, in flight             2  BEGIN, the claim; its ROLLBACK is sent after, not waited for
//	a handler's own Commit, then the keep  1 more: the record kept in a statement of its own
//
// A transactional first run on the pgx face therefore costs three round
// trips and one transaction, as few as the same handler with a
// transaction of its own.
// Two claims racing on one key, one of them meeting a record committed
// after its snapshot, cost that one another round trip.
//
// # What is checked at New
//
// That the pool keeps its prepared statements between transactions, if it
// names any (above); that the table exists with the schema's columns and
// its claim function; that the server takes writes (a hot standby, or a
// server whose transactions are read-only by default, is refused with
// ErrReadOnly); and that the server's advisory locks are real: a transaction-scoped lock the store takes must
// be listed as held in pg_locks. CockroachDB answers pg_try_advisory_lock
// true whatever holds the lock, and is refused with ErrLocksNotReal.
// YugabyteDB has real advisory locks from 2.25 (behind a flag), and is not
// tested here. New also warns, through log/slog's default logger, when the
// pool is smaller than 10 connections. Start-up (New, NewDB, Migrate,
// MigrateDB) is bounded by its context, or by DefaultStartTimeout (10 s)
// when the context has no deadline, and its errors name the server and
// database. A database/sql DB does not say where it connects: NewDB and
// MigrateDB name what pgx's driver connection gives of its configuration,
// or, when it cannot connect, what its error says of where it tried; of
// another driver, what the server says of itself once a connection
// answered (inet_server_addr, current_database), and only the driver
// before.
//
// # Time budgets and errors
//
// Every Claim, ClaimTx (the wait for a free connection included),
// Complete, Release, Extend and Begin is bounded by WithCallTimeout (300
// ms by default), Commit and Rollback by WithCommitTimeout (1 s); the
// handler's statements by the handler's context, which the middleware ends
// at the route's deadline. At the deadline pgx closes the connection,
// which ends the transaction on the server. Every backend failure wraps
// store.ErrUnavailable, and the middleware answers 503; a claim that found
// no free connection also wraps ErrPoolExhausted. A statement that fails
// because its pooled connection died (the server restarted) runs again on
// another; every statement is safe to run twice.
//
// A call that ran out of time may still take effect: a commit sent to a
// server that then stalled can run when it resumes. The client got 503;
// its retry finds the record.
//
// # Pool sizing
//
// A transactional request holds one pool connection from its claim until
// its commit: for its handler's whole run. Size the pool (pgxpool's
// MaxConns, pool_max_conns in the URL; its default is 4 or the number of
// CPUs) for the requests served at once, plus what other code uses, and
// keep it under the server's max_connections (or the pooler's pool size)
// across every instance. A request that finds no free connection within
// the call's budget is answered 503 and its handler does not run. Replays
// and 409 answers hold a connection for their one round trip and the
// ROLLBACK after it; a repeat waiting with middleware.WithWait holds one
// while it waits. A handler that reads through the pool while it holds the
// request's transaction needs a second connection: at full load every
// connection is held by a handler waiting for another, until their
// deadlines end them. Read through the request's transaction too, or from
// a pool of its own.
//
// # The table and its claim function
//
// One row per idempotency key (SchemaSQL): the store key (a digest, never
// the raw key), the owner token, the fingerprint, when it was claimed and
// when it expires (both on the database's clock), and the kept response
// (NULL while in flight). Beside it, a PL/pgSQL function "<table>_claim"
// makes the claim: its statements are planned once per server session and
// kept, where the same claim as one statement costs the server about half
// a millisecond of planning on every call that is not kept prepared (pgx
// in exec mode, behind a transaction-mode pooler); it is the one place the
// claim is written. Migrate creates both for services without a migration
// tool; with goose, golang-migrate or Atlas, put SchemaSQL (or what Schema
// returns for another name) in a migration of your own. New fails, saying
// how to create or update them, when the table or the function is missing
// or of an earlier version.
//
// # Upgrading
//
// Migrate (or SchemaSQL applied again) brings a table made by an earlier
// version up to date in place, keeping its rows: it adds raw_digest, drops
// the unused lock_id and makes the claim function anew, each only when
// needed, under the migration's lock. Instances of the version before
// write lock_id: stop them before migrating (their requests answer 503
// once it is dropped; no key runs twice).
//
// # Expiry
//
// A row whose life is over is gone as far as the store is concerned; the
// sweeper deletes such rows in batches of WithSweepBatch (1000), oldest
// first by the index on expires_at, each batch a statement of its own that
// skips rows locked by another, every WithSweepInterval (1 minute) from
// every instance, or when Sweep is called. See docs/operations.md for
// autovacuum, bloat and sizes.
package postgres
