package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkey/idemkey/internal/pgtest"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// The PostgreSQL scenarios: the same request and answer, around a handler
// that also inserts one row (the payment) into a table, on a PostgreSQL
// cluster the driver starts for the run.
const (
	// scPgBare: the handler in a transaction of its own (BEGIN, INSERT,
	// COMMIT), no idempotency: the bar for what a key costs.
	scPgBare = "pg-bare"
	// scPgTypical: the hand-written pattern most services write: in one
	// transaction, SELECT the key's row (a replay answers from it),
	// INSERT it, run the handler's INSERT, UPDATE the row with the
	// response, COMMIT.
	scPgTypical = "pg-typical"
	// scPg: idemkey on store/postgres as a plain store: claim, the
	// handler's INSERT on its own, complete.
	scPg = "idemkey-pg"
	// scPgTx: idemkey on store/postgres in the transactional flow: the
	// handler's INSERT in the request's transaction, committed with the
	// record.
	scPgTx = "idemkey-pg-tx"
	// scPgSQL: scPgTx through database/sql (postgres.NewDB on pgx's
	// driver): the INSERT in the request's *sql.Tx.
	scPgSQL = "idemkey-pg-sql"
)

var pgScenarios = []string{scPgBare, scPgTypical, scPg, scPgTx, scPgSQL}

func usesPostgres(sc string) bool {
	switch sc {
	case scPgBare, scPgTypical, scPg, scPgTx, scPgSQL:
		return true
	}
	return false
}

// The tables the PostgreSQL scenarios use, created by the driver.
const pgSchema = `
CREATE TABLE bench_payments (
    id      bigserial PRIMARY KEY,
    key     text NOT NULL,
    run     bigint NOT NULL,
    bytes   int NOT NULL
);
CREATE TABLE bench_typical_keys (
    key          text PRIMARY KEY,
    request_hash text NOT NULL,
    status       int,
    content_type text,
    body         bytea,
    created_at   timestamptz NOT NULL DEFAULT now()
);`

// launchPostgres starts the run's cluster and creates the tables.
func launchPostgres(fsync bool) (*pgtest.Server, error) {
	settings := []string{"max_connections=400", "shared_buffers=256MB"}
	if fsync {
		// pgtest turns these off for tests; a database in production
		// has them on, and a commit then waits for its WAL to reach the
		// disk.
		settings = append(settings, "fsync=on", "full_page_writes=on")
	}
	srv, err := pgtest.Launch(settings...)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, srv.URL)
	if err == nil {
		defer pool.Close()
		_, err = pool.Exec(ctx, pgSchema)
	}
	if err == nil {
		err = postgres.Migrate(ctx, pool)
	}
	if err != nil {
		srv.Close()
		return nil, fmt.Errorf("creating the tables: %w", err)
	}
	return srv, nil
}

// newPgPool returns the pool every PostgreSQL scenario uses: sized to the
// driver's largest concurrency (a transactional request holds a connection
// for its handler's run), with trips counting its round trips (prepares
// included: the warm-up has made them, so the measured rounds have none).
func newPgPool(url string, size int, trips *trips) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(size)
	cfg.MinConns = int32(size)
	cfg.ConnConfig.Tracer = trips
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	// Dial every connection before serving, as pool_min_conns does for a
	// service that has been up a while: the table measures the steady
	// state, not the dialling of a cold pool.
	conns := make([]*pgxpool.Conn, 0, size)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range size {
		c, err := pool.Acquire(context.Background())
		if err != nil {
			pool.Close()
			return nil, err
		}
		conns = append(conns, c)
	}
	return pool, nil
}

// How a SQL scenario makes its insert.
type insertMode int

const (
	ownTx        insertMode = iota + 1 // a transaction of its own (pg-bare)
	autocommit                         // one statement on the pool (idemkey-pg)
	requestTx                          // the request's, from postgres.Tx (idemkey-pg-tx)
	typicalTx                          // pg-typical's, from the context
	requestSQLTx                       // the request's *sql.Tx, from postgres.SQLTx (idemkey-pg-sql)
)

// sqlApp is app with one insert, the payment, made by insert, before the
// same answer app gives: the handler of every SQL scenario.
type sqlApp struct {
	a      *app
	insert func(ctx context.Context, key string, run, n int64) error
}

const insertPayment = "INSERT INTO bench_payments (key, run, bytes) VALUES ($1, $2, $3)"

// typicalKey is the context key of pg-typical's transaction.
type typicalKey struct{}

func (p *sqlApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, err := io.Copy(io.Discard, r.Body)
	if err != nil {
		http.Error(w, "body", http.StatusBadRequest)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	run := p.a.runs.Add(1)
	if err := p.insert(r.Context(), key, run, n); err != nil {
		http.Error(w, "database: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	p.a.answer(w, key, run, n)
}

// errNoRequestTx is the insert's error when the middleware gave the
// handler no transaction.
var errNoRequestTx = errors.New("no request transaction")

// pgInsert is how a PostgreSQL scenario makes its insert: the way mode
// says, on pool.
func pgInsert(pool *pgxpool.Pool, mode insertMode) func(ctx context.Context, key string, run, n int64) error {
	return func(ctx context.Context, key string, run, n int64) error {
		var err error
		switch mode {
		case ownTx:
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, insertPayment, key, run, n)
				return err
			})
		case autocommit:
			_, err = pool.Exec(ctx, insertPayment, key, run, n)
		case requestTx:
			tx := postgres.Tx(ctx)
			if tx == nil {
				return errNoRequestTx
			}
			_, err = tx.Exec(ctx, insertPayment, key, run, n)
		case typicalTx:
			_, err = ctx.Value(typicalKey{}).(pgx.Tx).Exec(ctx, insertPayment, key, run, n)
		case requestSQLTx:
			tx := postgres.SQLTx(ctx)
			if tx == nil {
				return errNoRequestTx
			}
			_, err = tx.ExecContext(ctx, insertPayment, key, run, n)
		}
		return err
	}
}

// answer writes the SQL scenarios' 201: the payment made for key by run,
// from a body of n bytes.
func (a *app) answer(w http.ResponseWriter, key string, run, n int64) {
	var buf [512]byte
	b := append(buf[:0], `{"id":"pay_`...)
	b = strconv.AppendInt(b, run, 10)
	b = append(b, `","key":"`...)
	b = append(b, key...) // the driver's keys need no escaping
	b = append(b, `","bytes":`...)
	b = strconv.AppendInt(b, n, 10)
	b = append(b, `,"status":"created"}`...)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(b)
}

// pgTypical is the hand-written pattern: one transaction that reads the
// key's row, inserts it, runs the handler (whose insert joins the
// transaction), stores the response in the row and commits. Six round
// trips on a first run (BEGIN, SELECT, INSERT, the handler's INSERT,
// UPDATE, COMMIT), three on a replay (BEGIN, SELECT, ROLLBACK). A
// duplicate that arrives while the first runs waits on the row's lock,
// then fails on the key and answers 409.
type pgTypical struct {
	pool *pgxpool.Pool
	next http.Handler
}

func (t *pgTypical) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, body, ok := readKeyed(w, r)
	if !ok {
		return
	}
	fp := requestHash(r, body)
	hash := hex.EncodeToString(fp[:])
	ctx := r.Context()
	tx, err := t.pool.Begin(ctx)
	if err != nil {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var (
		h      string
		status *int
		ct     *string
		resp   []byte
	)
	err = tx.QueryRow(ctx, "SELECT request_hash, status, content_type, body FROM bench_typical_keys WHERE key = $1", key).
		Scan(&h, &status, &ct, &resp)
	switch {
	case err == nil && h != hash:
		http.Error(w, "key reused", http.StatusUnprocessableEntity)
		return
	case err == nil && status == nil:
		http.Error(w, "in flight", http.StatusConflict)
		return
	case err == nil:
		wh := w.Header()
		wh.Set("Content-Type", *ct)
		wh.Set("Idempotent-Replayed", "true")
		wh.Set("Content-Length", strconv.Itoa(len(resp)))
		w.WriteHeader(*status)
		w.Write(resp)
		return
	case !errors.Is(err, pgx.ErrNoRows):
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	if _, err := tx.Exec(ctx, "INSERT INTO bench_typical_keys (key, request_hash) VALUES ($1, $2)", key, hash); err != nil {
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "23505" {
			http.Error(w, "in flight", http.StatusConflict)
			return
		}
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	bw := &bufWriter{h: w.Header()}
	r = r.WithContext(context.WithValue(ctx, typicalKey{}, tx))
	r.Body = io.NopCloser(bytes.NewReader(body))
	t.next.ServeHTTP(bw, r)
	if bw.status == 0 {
		bw.status = http.StatusOK
	}
	if bw.status >= 500 {
		bw.send(w) // the deferred Rollback undoes the key row and the insert
		return
	}
	if _, err := tx.Exec(ctx, "UPDATE bench_typical_keys SET status = $2, content_type = $3, body = $4 WHERE key = $1",
		key, bw.status, w.Header().Get("Content-Type"), bw.body); err != nil {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	if err := tx.Commit(ctx); err != nil {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	bw.send(w)
}

// plainStore hides store/postgres's transactional side, so that the
// middleware uses it as a plain store (the idemkey-pg scenario).
type plainStore struct {
	store.Store
	store.Extender
}

// pgHandler builds the handler of PostgreSQL scenario sc around a.
func pgHandler(sc string, a *app, url string, poolSize int, trips *trips) (http.Handler, func(), error) {
	if sc == scPgSQL {
		return pgSQLHandler(a, url, poolSize, trips)
	}
	pool, err := newPgPool(url, poolSize, trips)
	if err != nil {
		return nil, nil, err
	}
	closeFn := pool.Close
	switch sc {
	case scPgBare:
		return &sqlApp{a: a, insert: pgInsert(pool, ownTx)}, closeFn, nil
	case scPgTypical:
		return &pgTypical{pool: pool, next: &sqlApp{a: a, insert: pgInsert(pool, typicalTx)}}, closeFn, nil
	}
	// At 64 connections the two cores are saturated and every scenario's
	// p99 reaches 200 to 300 ms (pg-typical's included); under the
	// default 300 ms claim budget a few tenths of a percent of idemkey's
	// claims ran out of it and were answered 503, their handler not run:
	// correct, but the table measures throughput, so the budget here is
	// 1 s, as a service this loaded would set it.
	st, err := postgres.New(context.Background(), pool, postgres.WithSweepInterval(0), postgres.WithCallTimeout(time.Second))
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return idemkeySQL(st, sc == scPg, func() { st.Close(); pool.Close() }, func(mode insertMode) http.Handler {
		return &sqlApp{a: a, insert: pgInsert(pool, mode)}
	})
}

// sqlStore is what idemkeySQL needs of a SQL store: its plain side (the
// extender included) and its transactional one.
type sqlStore interface {
	store.TxStore
	store.Extender
}

// idemkeySQL wraps the handler app(mode) in idemkey's middleware on st:
// as a plain store when plain (the handler's insert a statement of its
// own), else in the transactional flow (the insert in the request's
// transaction). closeFn closes st and its pool, also when this fails.
func idemkeySQL(st sqlStore, plain bool, closeFn func(), app func(insertMode) http.Handler) (http.Handler, func(), error) {
	var s store.Store = st
	mode := requestTx
	if plain {
		s, mode = plainStore{st, st}, autocommit
	}
	mw, err := middleware.New(s)
	if err != nil {
		closeFn()
		return nil, nil, err
	}
	return mw.Required()(app(mode)), closeFn, nil
}

// dialAll opens n connections of db at once and gives them back to its
// pool, so that no cell pays for dialling.
func dialAll(db *sql.DB, n int) error {
	ctx := context.Background()
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

// splitFunc splits scenarios into those f reports and the others, each in
// its order.
func splitFunc(scs []string, f func(string) bool) (in, others []string) {
	for _, sc := range scs {
		if f(sc) {
			in = append(in, sc)
		} else {
			others = append(others, sc)
		}
	}
	return in, others
}

// postgresVersion returns the server's version, or "".
func postgresVersion(url string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return ""
	}
	defer c.Close(ctx)
	var v string
	c.QueryRow(ctx, "SHOW server_version").Scan(&v)
	return v
}

// reportPostgres prints the PostgreSQL scenarios' table and targets,
// reports whether a check failed, and returns the targets measured.
func reportPostgres(w io.Writer, scs []string, connsList []int, phases []phase, results map[cellKey]*cellAgg) (bool, []ratioBar) {
	fmt.Fprintln(w, "PostgreSQL: the handler inserts one row; DB round trips counted by the server process, DB CPU is the cluster's")
	return reportSQL(w, scPgBare, scPgTypical, scPgTx, scs, connsList, phases, results, []target{
		{"idemkey-pg-tx / pg-typical", scPgTx, scPgTypical, fresh, 1.2},
		{"idemkey-pg-tx / pg-typical", scPgTx, scPgTypical, replay, 1.0},
		{"idemkey-pg-tx / pg-bare", scPgTx, scPgBare, fresh, 0.7},
		{"idemkey-pg-sql / idemkey-pg-tx", scPgSQL, scPgTx, fresh, 0.9},
		{"idemkey-pg-sql / idemkey-pg-tx", scPgSQL, scPgTx, replay, 0.9},
	})
}

// reportSQL prints the table of a database's scenarios, as ratios to its
// bare and typical ones, the targets ts, and the database's CPU per first
// run of the transactional scenario txSc against the typical one's (target:
// no more); it reports whether a check failed, and returns the targets
// measured.
func reportSQL(w io.Writer, bareSc, typicalSc, txSc string, scs []string, connsList []int, phases []phase, results map[cellKey]*cellAgg, ts []target) (bool, []ratioBar) {
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| conns | keys | scenario | req/s | x %s | x %s | p50 ms | p99 ms | server us/req | DB round trips/req | DB CPU us/req | checks |\n", bareSc, typicalSc)
	fmt.Fprintln(w, "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	failed := false
	for _, conns := range connsList {
		for _, ph := range phases {
			bare := results[cellKey{bareSc, conns, ph}]
			typ := results[cellKey{typicalSc, conns, ph}]
			for _, sc := range scs {
				c := results[cellKey{sc, conns, ph}]
				check := "ok"
				if c.errors > 0 {
					failed = true
					check = fmt.Sprintf("FAILED (%d): %v", c.errors, c.firstErr)
				}
				fmt.Fprintf(w, "| %d | %s | %s | %.0f | %s | %s | %.2f | %.2f | %.1f | %.2f | %.1f | %s |\n",
					conns, ph, sc, c.rate(), ratio(c, bare), ratio(c, typ),
					ms(c.hist.quantile(0.5)), ms(c.hist.quantile(0.99)),
					c.per(float64(c.serverCPU.Microseconds())),
					c.per(float64(c.pgTrips)), c.per(float64(c.pgCPU.Microseconds())), check)
			}
		}
	}
	printMemory(w, scs, connsList, phases, results)
	bars := measure(ts, scs, connsList, phases, results)
	printTargets(w, 28, bars)
	if slices.Contains(scs, txSc) && slices.Contains(scs, typicalSc) && slices.Contains(phases, fresh) {
		fmt.Fprintf(w, "\nDB CPU per first run, %s against %s (us/req; target: no more; * marks a miss):\n ", txSc, typicalSc)
		for _, conns := range connsList {
			tx, typ := results[cellKey{txSc, conns, fresh}], results[cellKey{typicalSc, conns, fresh}]
			a, b := tx.per(float64(tx.pgCPU.Microseconds())), typ.per(float64(typ.pgCPU.Microseconds()))
			mark := ""
			if a > b {
				mark = "*"
			}
			fmt.Fprintf(w, " %d conns %.0f against %.0f%s", conns, a, b, mark)
		}
		fmt.Fprintln(w)
	}
	return failed, bars
}

// pgSQLHandler is idemkey-pg-sql's: the store through database/sql, on
// pgx's driver with the same tracer and as many connections, each dialled
// before serving.
func pgSQLHandler(a *app, url string, poolSize int, trips *trips) (http.Handler, func(), error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, nil, err
	}
	cfg.Tracer = trips
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(poolSize)
	db.SetMaxIdleConns(poolSize)
	if err := dialAll(db, poolSize); err != nil {
		db.Close()
		return nil, nil, err
	}
	st, err := postgres.NewDB(context.Background(), db, postgres.WithSweepInterval(0), postgres.WithCallTimeout(time.Second))
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return idemkeySQL(st, false, func() { st.Close(); db.Close() }, func(insertMode) http.Handler {
		return &sqlApp{a: a, insert: pgInsert(nil, requestSQLTx)}
	})
}
