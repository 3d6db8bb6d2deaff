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
//	st, err := postgres.New(ctx, pool)          // checks the table; starts the sweeper
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
// The handler never commits or rolls back: a kept status (2xx, 3xx, 4xx
// but 408, 409, 425, 429) commits, with the record, before the response
// goes out; a 5xx or a panic rolls back and frees the key. A COMMIT that
// fails, or whose reply is lost, answers 503: the retry then replays the
// record if it committed, or runs again if it did not. On such a route a
// flush is the commit (the record, with the body omitted, commits before
// the first byte goes out), and the transaction refuses statements after
// it: read the rows you stream before you flush.
//
// Helpers that take a *pgx.Conn get Tx(ctx).Conn(): statements run on it
// are in the transaction, and it is closed (not pooled) when the request
// ends. Never begin a transaction on it (conn.Begin, pgx.BeginFunc(ctx,
// conn, ...)): PostgreSQL ignores that BEGIN, and the COMMIT after it
// commits the request's transaction early. Pass the pgx.Tx instead, whose
// Begin is a savepoint. When the middleware finds the transaction ended
// that way, the writes may be committed: a kept answer is still kept (in a
// transaction of its own), and after a 5xx or a panic the key is not freed
// but held in flight for 24 hours (repeats get 409; idemctl delete frees
// it), so that a retry cannot make the writes twice. A hijacked connection
// rolls the transaction back: do not hijack on a transactional route.
//
// The Store is a plain store.Store too (Claim, Complete, Release, Extend:
// one statement and one round trip each), for services that want durable
// records without Redis; the middleware uses the transactional flow
// (ClaimTx) whenever the store has it.
//
// # The table
//
// One row per idempotency key (SchemaSQL): the store key (a digest, never
// the raw key), the owner token, the fingerprint, when it was claimed and
// when it expires (both on the database's clock, so instances whose clocks
// disagree still agree), the advisory lock of a transactional claim, and
// the kept response (NULL while in flight). Migrate creates it for services
// without a migration tool; with goose, golang-migrate or Atlas, put
// SchemaSQL (or what Schema returns for another name) in a migration of
// your own. New fails with a message saying so when the table is missing.
//
// # Statements and round trips
//
//	path                                  round trips
//	Claim / ClaimTx: first run             1  INSERT ... ON CONFLICT DO NOTHING, and the row that took the key
//	Claim / ClaimTx: replay, in flight     1  the same statement
//	claim of a lapsed row, or of a key     2  the same, then UPDATE ... WHERE token = <the old one>
//	  whose owner's session is gone
//	handler's first statement              1  BEGIN goes in the same pipeline
//	Tx.Commit                              1  pipeline: fenced UPDATE (which unlocks), COMMIT
//	Tx.Rollback                            1  pipeline: ROLLBACK, DELETE of the claim, pg_advisory_unlock
//	Complete, Release, Extend              1
//	Sweep                                  1 per batch
//
// A claim's INSERT and its SELECT run on one snapshot: when two requests
// claim a key at the same moment and the other's INSERT commits after this
// statement's snapshot was taken, the INSERT waits for it and does
// nothing, and the SELECT cannot see its row. The statement then returns
// no row, and the store runs it again (one more round trip, only for
// requests that race on one key).
//
// A transactional first run therefore costs three round trips (claim,
// the handler's statement with BEGIN, the commit), as many as the same
// handler with a transaction of its own (BEGIN, its statement, COMMIT).
//
// # Crash takeover
//
// ClaimTx takes a pooled connection and keeps it for the request. The
// claim commits on its own (other requests must see the key in flight) and
// takes a session advisory lock on a random id stored in the row, inside
// the statement that inserts it: there is no moment when the row is
// visible and its lock free while its owner lives. The owner holds the
// lock until its transaction has committed or rolled back. A claim that
// finds the key in flight tries that lock without waiting: when it gets
// it (and lets it go at once), the owner's session is gone, so its
// transaction rolled back with it, and the key is taken over at once, not
// when its life ends. A killed process, a dropped connection and
// pg_terminate_backend all end the session; a client killed by SIGKILL is
// taken over within milliseconds. A live owner's claim is taken over only
// when its life (the route's deadline plus middleware.ClaimMargin) has
// ended; its late commit then finds another token on the row, keeps
// nothing and rolls back.
//
// The takeover relies on the owner's session ending with it: connect
// directly, or through a pooler in session mode. Behind a pooler in
// transaction mode (PgBouncer pool_mode=transaction, and proxies that
// multiplex the same way) session locks do not follow the request, and a
// probe could find a live owner's lock free: do not use ClaimTx there.
// A client that vanishes without closing its connection (a machine
// powered off, a network partition) keeps its session, and its lock, until
// the server notices: set tcp_keepalives_idle and
// idle_in_transaction_session_timeout on the server, or the claim is taken
// over only when its life ends.
//
// # Time budgets and errors
//
// Every Claim, ClaimTx (the wait for a free connection included),
// Complete, Release and Extend is bounded by WithCallTimeout (300 ms by
// default), Commit and Rollback by WithCommitTimeout (1 s); the handler's
// statements by the handler's context, which the middleware ends at the
// route's deadline. At the deadline pgx closes the connection, which ends
// the session on the server. Every backend failure wraps
// store.ErrUnavailable, and the middleware answers 503. A statement that
// fails because its pooled connection died (the server restarted) runs
// again on another; every statement is safe to run twice.
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
// keep it under the server's max_connections across every instance. A
// request that finds no free connection within the call's budget is
// answered 503 and its handler does not run. Replays and 409 answers hold
// a connection only for their one statement. A handler that reads through
// the pool while it holds the request's transaction needs a second
// connection: at full load every connection is held by a handler waiting
// for another, until their deadlines end them. Read through the request's
// transaction too, or from a pool of its own.
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
