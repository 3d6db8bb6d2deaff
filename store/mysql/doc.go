// Package mysql is the idempotency store that keeps each record in a MySQL
// or MariaDB table, through database/sql and github.com/go-sql-driver/mysql,
// and keeps it in the handler's own transaction: the handler's writes and
// the kept response commit together or not at all. A process that dies
// between its business write and keeping the record cannot make a retry
// run the handler again, because there is no such moment: both are one
// COMMIT. It targets MySQL 8 and MariaDB 10.6 and later, InnoDB tables.
//
// # Using it
//
//	dsn, err := mysql.DSN("mysql://app:secret@db:3306/app") // or a DSN of the driver's own
//	db, err := sql.Open("mysql", dsn)
//	db.SetMaxOpenConns(64)                        // see Pool sizing
//	err = mysql.Migrate(ctx, db)                  // or apply mysql.SchemaSQL with your migration tool
//	st, err := mysql.New(ctx, db)                 // checks the table and the server; starts the sweeper
//	defer st.Close()
//	idem, err := middleware.New(st)
//	r.With(idem.Required()).Post("/payments", createPayment)
//
//	func createPayment(w http.ResponseWriter, r *http.Request) {
//		tx := mysql.Tx(r.Context()) // the request's *sql.Tx
//		_, err := tx.ExecContext(r.Context(), "INSERT INTO payments (id, amount) VALUES (?, ?)", id, amount)
//		if err != nil {
//			http.Error(w, "try again", http.StatusServiceUnavailable) // 5xx: rolled back, key released
//			return
//		}
//		w.WriteHeader(http.StatusCreated) // kept: the record commits with the insert, then this goes out
//	}
//
// The store needs none of the driver's DSN parameters (parseTime,
// multiStatements, interpolateParams, clientFoundRows, loc): times are
// kept as microseconds since the epoch on the server's clock, and every
// statement of the store is one text query with its values written in.
//
// The one rule for handlers: write through the request's transaction
// (Tx), a *sql.Tx that sqlc, sqlx, GORM and Bun code can take. A write
// made through the pool directly commits on its own, outside the request's
// transaction, and a retry after a crash can repeat it. Every covered
// request has one: on a route where the key is optional, a request without
// a key runs in a transaction too (its writes commit before the response
// goes out; nothing is kept), so the handler above is safe on Required and
// Optional routes alike.
//
// The handler does not commit or roll back: a kept status commits, with
// the record, before the response goes out; a 5xx, a transient 4xx (408,
// 409, 425, 429) or a panic rolls back and frees the key. A kept 4xx (400,
// 404, 422, ...) keeps its answer and undoes the handler's writes, since
// clients read a 4xx as "nothing happened" (WithClientErrorWrites keeps
// them): the whole transaction rolls back, and the record is then written
// on its own, under the same fence, the claim's named locks still held
// (no path of the store takes a SAVEPOINT). No other request can take the
// key in between, as the session holds its locks throughout; if the
// claim's life ran out meanwhile (another request may then have taken
// the key, or may take it), the 4xx is simply not kept (store.ErrNotOwner;
// nothing of the request is committed, and that other request wins). A
// COMMIT
// that fails, or whose reply is lost, answers 503: the retry then replays
// the record if it committed, or runs again if it did not.
//
// A *sql.Tx is a concrete type: the handler can call its Commit or
// Rollback, and DDL (CREATE, ALTER, ...) and LOCK TABLES commit it
// implicitly. None of these makes a second run or loses a record. (After
// LOCK TABLES the store lets go of the tables, UNLOCK TABLES, which
// commits what the handler wrote under them for a kept answer; a 5xx
// rolls that back first. Take LOCK TABLES only if you must: it commits
// what the handler wrote before it, with the claim.) When the handler committed,
// its claim committed with its writes: a kept answer is still kept (in a
// statement of its own), and after a 5xx, a panic, or the process dying,
// the key stays held for 24 hours (repeats get 409; idemctl delete frees
// it), so that a retry cannot make the writes twice. When the handler
// rolled back, its claim went with its writes: the key is free, nothing is
// kept, the answer is 503, and the transaction refuses the handler's later
// statements (sql.ErrTxDone). Never send COMMIT, ROLLBACK or SET
// autocommit as SQL through it (database/sql does not see those: the
// statements after them would commit on their own), and leave the
// session's settings as they were: the connection goes back to the pool.
//
// The Store is a plain store.Store too (Claim, Complete, Release, Extend),
// for services that want durable records without Redis; the middleware
// uses the transactional flow (ClaimTx) whenever the store has it. Plain
// and transactional claims on one table never both hold a key.
//
// A transaction the server rolls back by itself (a deadlock's victim)
// takes the claim's row with it while database/sql still holds the
// *sql.Tx open, and each statement the handler sends after that commits
// on its own. The store notices at the request's end (the keep finds no
// row, or, before a rollback, a read of the row): it then holds the key, a claim in flight committed for 24 hours, as
// after the handler's own commit, and answers 503, rather than free it
// for a retry that would make those writes again.
//
// # What a claim holds
//
// A transactional claim holds the key with two named locks (GET_LOCK) on
// the session of the connection it takes for the request, and the claim's
// row, written in the request's transaction and not committed. The locks
// are on a hash of the database, the table and the key, and on one of the
// key with the request's fingerprint (named locks are the server's, shared
// by every database on it). Whoever holds the key's lock owns the key, and
// holds the other too. A repeat that finds the fingerprint's lock taken is
// the same request in flight (409); one that gets it but not the key's
// meets another request in flight (422), and lets go of what it took in
// the same statement. A live row (a kept record, or a plain claim in
// flight) is read before any lock is tried: a replay takes no lock.
//
// A dead owner's session ends with its connection (a killed process, a
// dropped connection, KILL): the server rolls its transaction back and
// lets go of its locks, and the next request claims the key at once
// (measured here: a few milliseconds from SIGKILL of the owner's process
// to the next claim). A live owner's claim ends at its life (the route's
// deadline plus middleware.ClaimMargin): the store then kills its session
// (KILL CONNECTION, from another pool connection), and the keep is fenced
// by the life on the server's clock, so a late commit never lands (the
// owner's client gets 503; the retry runs again, once). A client that
// vanishes without closing its connection (a machine powered off, a
// partition) keeps its session until the server notices: the killing
// instance is gone too, so lower wait_timeout and the TCP keepalive on the
// server if such claims must end sooner.
//
// Named locks live in a session, not in a transaction: the store needs
// every statement of a connection to reach the one server session, as a
// direct connection does. A proxy that spreads one client connection's
// statements over several server connections breaks that (New checks that
// a lock taken on one connection is seen held by it from another, and
// refuses a server where it is not with ErrLocksNotReal). When a request
// ends the store lets go of every named lock of its session (the key's
// first, then RELEASE_ALL_LOCKS, whose own order depends on the locks'
// names) before the connection goes back to the pool, or
// closes the connection and kills its session when it cannot.
//
// # Statements and round trips
//
//	path                              round trips
//	ClaimTx: first run                 4  the row read with both GET_LOCKs; SET autocommit = 0; START TRANSACTION; the claim's INSERT (or takeover UPDATE)
//	handler's statements               1 each without arguments; the driver sends one with arguments as prepare and execute (2) unless interpolateParams is set
//	Tx.Commit                          2  the fenced UPDATE that keeps the record, COMMIT; then 2 not waited for (see below)
//	Tx.Commit of a kept 4xx            3  ROLLBACK AND CHAIN of the whole transaction; the record written on its own (an INSERT … ON DUPLICATE KEY UPDATE fenced by the key's named lock and the claim's life); COMMIT; then 2 not waited for
//	Tx.Rollback                        3  a read that the claim's row is still the transaction's; ROLLBACK; one statement that lets go of the locks and checks the claim is not committed; then 2 not waited for (the *sql.Tx ended, autocommit turned back on)
//	ClaimTx: replay, in flight, reused 1  the row read, outside any transaction (and the locks tried, for a claim in flight); 2 on a session at READ UNCOMMITTED, whose live row is read again as committed
//	Claim (plain): first run           2  the same row read with the locks; the claim's INSERT or UPDATE, committed; then the locks let go of, not waited for
//	Claim (plain): replay, in flight   1
//	Complete, Release, Extend          1  (2 when the statement changes nothing: a read tells a resent call from a lost claim)
//	Sweep                              5 per batch: a READ COMMITTED transaction that selects with SKIP LOCKED and deletes
//
// No path sends SAVEPOINT (TestRoundTrips checks the statements on the
// wire). A first run is eight statements besides the handler's: the six
// it waits for (four to claim, two to commit) and two in the background.
// The hand-written pattern
// that keeps its record in the handler's transaction (BEGIN, a SELECT of
// the key, its INSERT, the record's UPDATE, COMMIT) sends five. The three
// more are what the guarantee costs through database/sql: autocommit off
// (a deadlock's victim must not commit the handler's later statements on
// their own), COMMIT sent as a bounded statement and the *sql.Tx then
// ended by database/sql's own ROLLBACK (Commit has no context), and the
// named locks let go of after the commit.
//
// The store sends COMMIT and ROLLBACK as statements bounded by the call's
// budget, because database/sql gives a transaction's Commit and Rollback
// no context and the driver sends them unbounded (against a stalled
// server they would never return). They are sent AND CHAIN, so that a
// statement the handler sends late through the *sql.Tx (from a goroutine
// still running) lands in a transaction that is rolled back, never
// committing on its own. After the answer goes out, the *sql.Tx is ended
// for database/sql with a ROLLBACK of that chained transaction, and the
// claim's locks are let go of (the key's, then RELEASE_ALL_LOCKS, in the
// statement that turns autocommit back on): the two round trips not waited for.
//
// Autocommit is off while a request's transaction runs (SET autocommit =
// 0 before it begins). A transaction the server rolls back by itself (a
// deadlock's victim) takes the claim's row with it while the session
// keeps its locks; with autocommit on, each statement the handler sent
// after that would commit on its own, and a session that then ended (the
// watchdog's KILL at the claim's life, a statement past its context that
// closes the connection) would free the key with those writes in. With it
// off they open a transaction of their own, which ends with the session.
//
// WithTxOptions with an isolation level adds one (SET TRANSACTION before
// START TRANSACTION). A record whose body is over 64 KiB is kept by a
// prepared statement: one more. A transactional first run therefore costs
// eight statements besides the handler's own (six waited for), six more
// than the same handler with a transaction of its own (START TRANSACTION
// and COMMIT); the hand-written pattern that keeps its own record in that
// transaction (bench's my-typical) sends five.
//
// # Isolation
//
// Every level works (WithTxOptions; by default the server's, REPEATABLE
// READ unless configured otherwise): the claim holds the key's lock before
// it writes, so no two transactions write one key's row, and its row is
// written by primary key only (an INSERT when no row was there, an UPDATE
// of the lapsed row otherwise), which takes no gap lock. Under SERIALIZABLE
// the handler's own reads lock what they read; a commit that fails answers
// 503 and the retry runs again.
//
// The claim's first read runs before any lock, outside the request's
// transaction, at the session's level (the server's default, or one the
// DSN sets), not at WithTxOptions'. At READ UNCOMMITTED that read can see
// a record whose COMMIT has not landed, and may never land: a completed
// record is trusted only once committed, so at that level a live row is
// read again with a locking read that does not wait (LOCK IN SHARE MODE
// NOWAIT on MariaDB, FOR SHARE NOWAIT on MySQL), which sees the row as
// its last commit left it; a row a transaction still holds is answered in
// flight. That costs replays and 409s one more round trip at READ
// UNCOMMITTED only.
//
// # Galera and Group Replication
//
// Named locks are local to one server. On a Galera cluster (MariaDB Galera
// Cluster, Percona XtraDB Cluster) two requests on two nodes could both
// hold a key: New refuses a node of one (wsrep_on is ON) with ErrGalera.
// MySQL Group Replication in multi-primary mode has the same flaw and is
// not supported (it is not detected: do not use it with this store);
// single-primary mode is fine when every instance of the service writes to
// the primary. A failover to a replica loses the locks with the old
// primary's sessions, as a crash does: claims in flight are taken over,
// their uncommitted writes gone with them.
//
// # Durability
//
// A record is as durable as the COMMIT that keeps it: with
// innodb_flush_log_at_trx_commit other than 1 a server crash can lose the
// last second of commits, records and the handler's writes together (so
// the retry runs again, once, and finds no trace of the first run), and a
// failover to a replica that had not received them does the same.
//
// # What is checked at New
//
// That the *sql.DB may open two connections at once (the check of the
// named locks and every watchdog's KILL need one beside the request's),
// that the table exists with the schema's columns (else an error that says
// to run Migrate or apply SchemaSQL), that it takes writes (a read-only
// server or session, read_only, super_read_only, transaction_read_only or
// tx_read_only, innodb_read_only, is refused with ErrReadOnly, where every
// request would answer 503), that named locks are real and shared
// (ErrLocksNotReal), and that the server is not a Galera node (ErrGalera).
// The errors name the server (as it names itself, @@hostname and @@port)
// and the database. New also warns, through log/slog's default logger,
// when the pool is limited to fewer than 10 connections.
//
// New and Migrate are bounded by their context; when it has no deadline,
// by DefaultStartTimeout (10 s): a server that accepts the connection and
// never answers fails start-up with an error that says so, rather than
// hang it. (A *sql.DB does not say where it connects, so that error can
// name the server only as the DSN's address.)
//
// # Time budgets and errors
//
// Every Claim, ClaimTx (the wait for a free connection included),
// Complete, Release, Extend and Begin is bounded by WithCallTimeout (300
// ms by default), Commit and Rollback by WithCommitTimeout (1 s); the
// handler's statements by the handler's context, which the middleware ends
// at the route's deadline (the driver then closes the connection, and the
// store kills its session). Every backend failure wraps
// store.ErrUnavailable, and the middleware answers 503; a claim that found
// no free connection also wraps ErrPoolExhausted. A call whose connection
// died (a server restart) starts again on another; every statement is
// safe to run twice. A plain Complete, Release or Extend never waits for a
// row a request's transaction holds (one that took over a lapsed claim):
// it fails at once on MariaDB (SET STATEMENT innodb_lock_wait_timeout = 0),
// after a second on MySQL (SET_VAR), and answers from the row's committed
// state.
//
// A call that ran out of time may still take effect: a commit sent to a
// server that then stalled can run when it resumes. The client got 503;
// its retry finds the record.
//
// # Pool sizing
//
// A transactional request holds one pool connection from its claim until
// its commit: for its handler's whole run. Size the pool
// (db.SetMaxOpenConns; database/sql's default is unlimited, which the
// server's max_connections then bounds) for the requests served at once,
// plus what other code uses, and keep it under max_connections across
// every instance. A request that finds no free connection within the
// call's budget is answered 503 and its handler does not run. Replays and
// 409 answers hold a connection for their one round trip; a repeat waiting
// with middleware.WithWait holds one while it waits. Ending a live owner
// at its life takes one more connection for the KILL. A handler that reads
// through the pool while it holds the request's transaction needs a second
// connection: at full load every connection is held by a handler waiting
// for another, until their deadlines end them. Read through the request's
// transaction too, or from a pool of its own.
//
// # The table
//
// One row per idempotency key (SchemaSQL): the store key (a digest, never
// the raw key), the owner token, the fingerprint, when it was claimed and
// when it expires (microseconds on the server's clock), and the kept
// response (NULL while in flight). Migrate creates it for services without
// a migration tool; with goose, golang-migrate or Atlas, put SchemaSQL (or
// what Schema returns for another name) in a migration of your own.
//
// # Expiry
//
// A row whose life is over is gone as far as the store is concerned; the
// sweeper deletes such rows in batches of WithSweepBatch (1000), oldest
// first by the index on expires_us, each batch a READ COMMITTED
// transaction of its own that skips rows another transaction holds, every
// WithSweepInterval (1 minute) from every instance, or when Sweep is
// called.
package mysql
