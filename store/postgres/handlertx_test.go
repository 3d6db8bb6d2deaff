package postgres_test

import (
	"context"
	"crypto/rand"
	"errors"
	"github.com/jackc/pgx/v5/pgxpool"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// handlerTx claims a fresh key and returns the handler's context and
// transaction.
func handlerTx(t *testing.T, st *postgres.Store) (string, store.Tx, context.Context, pgx.Tx) {
	t.Helper()
	key := newKey()
	tx := claimTx(t, st, key, newClaim(1), store.Claimed)
	ctx := tx.NewContext(context.Background())
	h := postgres.Tx(ctx)
	if h == nil {
		t.Fatal("no transaction in the handler's context")
	}
	return key, tx, ctx, h
}

func TestTxFromContext(t *testing.T) {
	if postgres.Tx(context.Background()) != nil {
		t.Error("a transaction in a context without one")
	}
}

// TestHandlerTxStatements runs each kind of statement as the handler's
// first (BEGIN goes with it) and checks that everything it did is in the
// one transaction: rolled back together, or committed together.
func TestHandlerTxStatements(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	ins := "INSERT INTO " + pay.name + " (key, made_by) VALUES "
	first := map[string]func(ctx context.Context, h pgx.Tx, key string) error{
		"ExecWithArgs": func(ctx context.Context, h pgx.Tx, key string) error {
			_, err := h.Exec(ctx, ins+"($1, 'a')", key)
			return err
		},
		"ExecWithoutArgsTwoStatements": func(ctx context.Context, h pgx.Tx, key string) error {
			tag, err := h.Exec(ctx, ins+"('"+key+"', 'a'); "+ins+"('"+key+"', 'b')")
			if err == nil && tag.RowsAffected() != 1 {
				t.Errorf("tag %q, want the last statement's", tag)
			}
			return err
		},
		"ExecWithExecMode": func(ctx context.Context, h pgx.Tx, key string) error {
			_, err := h.Exec(ctx, ins+"($1, 'a')", pgx.QueryExecModeSimpleProtocol, key)
			return err
		},
		"Query": func(ctx context.Context, h pgx.Tx, key string) error {
			rows, err := h.Query(ctx, ins+"($1, 'a') RETURNING made_by", key)
			if err != nil {
				return err
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err == nil && (len(got) != 1 || got[0] != "a") {
				t.Errorf("Query rows %q", got)
			}
			return err
		},
		"QueryRow": func(ctx context.Context, h pgx.Tx, key string) error {
			var who string
			err := h.QueryRow(ctx, ins+"($1, 'a') RETURNING made_by", key).Scan(&who)
			if err == nil && who != "a" {
				t.Errorf("QueryRow %q", who)
			}
			return err
		},
		"SendBatch": func(ctx context.Context, h pgx.Tx, key string) error {
			b := &pgx.Batch{}
			b.Queue(ins+"($1, 'a')", key)
			var who string
			b.Queue("SELECT made_by FROM "+pay.name+" WHERE key = $1", key).QueryRow(func(r pgx.Row) error { return r.Scan(&who) })
			err := h.SendBatch(ctx, b).Close()
			if err == nil && who != "a" {
				t.Errorf("the batch did not see its own insert: %q", who)
			}
			return err
		},
		"CopyFrom": func(ctx context.Context, h pgx.Tx, key string) error {
			_, err := h.CopyFrom(ctx, pgx.Identifier{table + "_payments"}, []string{"key", "made_by"}, pgx.CopyFromRows([][]any{{key, "a"}}))
			return err
		},
		"Savepoint": func(ctx context.Context, h pgx.Tx, key string) error {
			sp, err := h.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, ins+"($1, 'a')", key); err != nil {
				return err
			}
			if err := sp.Commit(ctx); err != nil {
				return err
			}
			// A rolled-back savepoint leaves nothing, and the
			// transaction goes on.
			sp, err = h.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, ins+"($1, 'undone')", key); err != nil {
				return err
			}
			return sp.Rollback(ctx)
		},
		"Conn": func(ctx context.Context, h pgx.Tx, key string) error {
			_, err := h.Conn().Exec(ctx, ins+"($1, 'a')", key)
			return err
		},
	}
	for name, f := range first {
		t.Run(name, func(t *testing.T) {
			for _, commit := range []bool{false, true} {
				key, tx, ctx, h := handlerTx(t, st)
				if err := f(ctx, h, key); err != nil {
					t.Fatal(err)
				}
				// A second statement, after the transaction began.
				if _, err := h.Exec(ctx, ins+"($1, 'z')", key); err != nil {
					t.Fatal(err)
				}
				var n int
				if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pay.name+" WHERE key = $1", key).Scan(&n); err != nil || n != 0 {
					t.Fatalf("%d rows visible outside the transaction before it ended (%v)", n, err)
				}
				if commit {
					if err := tx.Commit(context.Background(), record("ok", 1), time.Minute); err != nil {
						t.Fatal(err)
					}
				} else if err := tx.Rollback(context.Background()); err != nil {
					t.Fatal(err)
				}
				got := pay.madeBy(t, key)
				switch {
				case !commit && len(got) != 0:
					t.Errorf("after the rollback: %q", got)
				case commit && (len(got) < 2 || got[0] != "a" || got[len(got)-1] != "z"):
					t.Errorf("after the commit: %q, want the first statement's and the second's", got)
				}
			}
		})
	}
}

// TestHandlerTxControl: the handler can neither commit nor roll back the
// request's transaction, and cannot use it once it ended.
func TestHandlerTxControl(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	key, tx, ctx, h := handlerTx(t, st)
	if err := pay.insert(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	if err := h.Commit(ctx); !errors.Is(err, postgres.ErrTxManaged) {
		t.Errorf("the handler's Commit: %v, want ErrTxManaged", err)
	}
	if err := h.Rollback(ctx); !errors.Is(err, postgres.ErrTxManaged) {
		t.Errorf("the handler's Rollback: %v, want ErrTxManaged", err)
	}
	// Neither changed anything: the write is still there to commit.
	if err := tx.Commit(context.Background(), record("ok", 1), time.Minute); err != nil {
		t.Fatal(err)
	}
	if n := pay.count(t, key); n != 1 {
		t.Fatalf("%d payments", n)
	}
	for name, err := range map[string]error{
		"Exec":      func() error { _, err := h.Exec(ctx, "SELECT 1"); return err }(),
		"Query":     func() error { _, err := h.Query(ctx, "SELECT 1"); return err }(),
		"QueryRow":  h.QueryRow(ctx, "SELECT 1").Scan(new(int)),
		"SendBatch": h.SendBatch(ctx, &pgx.Batch{}).Close(),
		"Begin":     func() error { _, err := h.Begin(ctx); return err }(),
		"Commit":    h.Commit(ctx),
		"Rollback":  h.Rollback(ctx),
	} {
		if !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("%s after the transaction ended: %v, want pgx.ErrTxClosed", name, err)
		}
	}
}

// TestHandlerTxRowsLeftOpen: the handler returns with rows unread. The
// commit fails, and the next transactional claim takes the key over as
// soon as the server has seen the connection close, and its lock with it.
func TestHandlerTxRowsLeftOpen(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	key, tx, ctx, h := handlerTx(t, st)
	if err := pay.insert(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Query(ctx, "SELECT generate_series(1, 100000)"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(context.Background(), record("ok", 1), time.Minute); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("commit with rows left open: %v, want store.ErrUnavailable", err)
	}
	if res, _ := claimWhenFree(t, st, key, newClaim(1)); res.State != store.Claimed {
		t.Fatalf("the next claim: %v, want the key taken over", res.State)
	}
	if n := pay.count(t, key); n != 0 {
		t.Errorf("%d payments", n)
	}
}

func TestTxOptionsIsolation(t *testing.T) {
	pool := sharedPool(t)
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		st, _ := newStore(t, pool, postgres.WithTxOptions(pgx.TxOptions{IsoLevel: iso}))
		_, tx, ctx, h := handlerTx(t, st)
		var got string
		if err := h.QueryRow(ctx, "SHOW transaction_isolation").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != string(iso) {
			t.Errorf("isolation %q, want %q", got, iso)
		}
		if err := tx.Commit(context.Background(), record("ok", 1), time.Minute); err != nil {
			t.Fatalf("%s: %v", iso, err)
		}
	}
}

// TestHandlerTxFailedStatement: a statement of the handler fails, and the
// handler answers as if it had not. Nothing is kept, the commit fails, and
// the key is free for a retry. That holds for a statement that fails as it
// runs, first or after a write, and for a first statement that the server
// refused to parse or plan, so that BEGIN, which went with it, never ran
// either and the connection looks as if nothing happened.
func TestHandlerTxFailedStatement(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	type step = func(t *testing.T, ctx context.Context, h pgx.Tx, key string) error
	exec := func(sql string, args ...any) step {
		return func(_ *testing.T, ctx context.Context, h pgx.Tx, _ string) error {
			_, err := h.Exec(ctx, sql, args...)
			return err
		}
	}
	for name, run := range map[string]step{
		"runs and fails, first": exec("SELECT 1/0"),
		"runs and fails, after a write": func(t *testing.T, ctx context.Context, h pgx.Tx, key string) error {
			if err := pay.insert(ctx, key, "a"); err != nil {
				t.Fatal(err)
			}
			return exec("SELECT 1/0")(t, ctx, h, key)
		},
		"refused first, Exec with arguments":    exec("INSERT INTO idemkey_no_such_table VALUES ($1)", 1),
		"refused first, Exec without arguments": exec("INSERT INTO nowhere VALUE 1"),
		"refused first, Query": func(_ *testing.T, ctx context.Context, h pgx.Tx, _ string) error {
			var n int
			return h.QueryRow(ctx, "SELECT n FROM idemkey_no_such_table WHERE n = $1", 1).Scan(&n)
		},
		"refused first, SendBatch": func(_ *testing.T, ctx context.Context, h pgx.Tx, _ string) error {
			b := &pgx.Batch{}
			b.Queue("INSERT INTO idemkey_no_such_table VALUES ($1)", 1)
			return h.SendBatch(ctx, b).Close()
		},
	} {
		t.Run(name, func(t *testing.T) {
			key, tx, ctx, h := handlerTx(t, st)
			if err := run(t, ctx, h, key); err == nil {
				t.Fatal("the statement did not fail")
			}
			err := tx.Commit(context.Background(), record("ok", 1), time.Minute)
			if !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("commit after a failed statement: %v, want store.ErrUnavailable", err)
			}
			if n := pay.count(t, key); n != 0 {
				t.Errorf("%d payments", n)
			}
			claimTx(t, st, key, newClaim(1), store.Claimed)
		})
	}
}

// TestHandlerTxEndedOutsideTheMiddleware: the handler ends the request's
// transaction itself through its connection (pgx.BeginFunc on Conn() sends
// BEGIN, which PostgreSQL ignores inside a transaction, then COMMIT), so
// its writes are committed whatever the middleware does next. After a 5xx
// (Rollback) the key must not be freed for a retry, which would pay
// again: it stays claimed. After a kept answer (Commit) the record is
// kept, and a repeat replays it.
func TestHandlerTxEndedOutsideTheMiddleware(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	for _, keep := range []bool{false, true} {
		key, tx, ctx, h := handlerTx(t, st)
		if err := pay.insert(ctx, key, "first"); err != nil {
			t.Fatal(err)
		}
		err := pgx.BeginFunc(ctx, h.Conn(), func(inner pgx.Tx) error {
			_, err := inner.Exec(ctx, "INSERT INTO "+pay.name+" (key, made_by) VALUES ($1, 'inner')", key)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if keep {
			if err := tx.Commit(context.Background(), record("ok", 1), time.Minute); err != nil {
				t.Fatalf("commit: %v", err)
			}
			claimTx(t, st, key, newClaim(1), store.Completed)
		} else {
			if err := tx.Rollback(context.Background()); err == nil {
				t.Error("rollback of a transaction the handler had committed reported success")
			}
			claimTx(t, st, key, newClaim(1), store.InFlight)
		}
		if n := pay.count(t, key); n != 2 {
			t.Errorf("keep %v: %d payments, want the 2 the handler committed", keep, n)
		}
	}
}

// TestHandlerTxConnIsUnusableAfterTheEnd: a connection the handler took
// with Conn() is closed when the request's transaction ends, so that a
// write through it later cannot commit outside the record, or land in
// another request's transaction.
func TestHandlerTxConnIsUnusableAfterTheEnd(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	key, tx, ctx, h := handlerTx(t, st)
	conn := h.Conn()
	if err := tx.Commit(context.Background(), record("ok", 1), time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO "+pay.name+" (key, made_by) VALUES ($1, 'late')", key); err == nil {
		t.Error("a write through the handler's connection after the commit succeeded")
	}
	if n := pay.count(t, key); n != 0 {
		t.Errorf("%d late payments", n)
	}
}

// TestHandlerTxLargeObjectsKeepTheIsolationLevel: LargeObjects begins the
// transaction, when the handler has not, as the store is set to.
func TestHandlerTxLargeObjectsKeepTheIsolationLevel(t *testing.T) {
	pool := sharedPool(t)
	st, _ := newStore(t, pool, postgres.WithTxOptions(pgx.TxOptions{IsoLevel: pgx.Serializable}))
	_, tx, ctx, h := handlerTx(t, st)
	h.LargeObjects()
	var got string
	if err := h.QueryRow(ctx, "SHOW transaction_isolation").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != string(pgx.Serializable) {
		t.Errorf("isolation after LargeObjects %q, want %q", got, pgx.Serializable)
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestHandlerTxRolledBackByTheHandler: a handler that rolls the request's
// transaction back itself (ROLLBACK as SQL) takes its claim with it, so a
// retry may claim the key and run while the handler goes on. What the
// handler then writes through the transaction must not commit on its own,
// outside any claim: it is refused, and there is one payment, the retry's.
func TestHandlerTxRolledBackByTheHandler(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	key, tx, ctx, h := handlerTx(t, st)
	if err := pay.insert(ctx, key, "first"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	retry := claimTx(t, st, key, newClaim(1), store.Claimed)
	if err := pay.insert(retry.NewContext(context.Background()), key, "retry"); err != nil {
		t.Fatal(err)
	}
	if err := retry.Commit(context.Background(), record("retry", 1), time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := pay.insert(ctx, key, "after its own rollback"); !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("a write through the transaction after the handler's ROLLBACK: %v, want pgx.ErrTxClosed", err)
	}
	if err := tx.Commit(context.Background(), record("first", 1), time.Minute); err == nil {
		t.Error("the commit of a transaction the handler rolled back reported success")
	}
	if got := pay.madeBy(t, key); len(got) != 1 || got[0] != "retry" {
		t.Fatalf("payments %v, want the retry's alone", got)
	}
}

// TestHandlerTxPreparedStatementDoesNotOutliveTheRequest: a statement the
// handler prepares by name lives in the server session, which a pooler
// would hand to its next client: the connection is closed when the
// request ends, and no session of the database keeps the statement.
func TestHandlerTxPreparedStatementDoesNotOutliveTheRequest(t *testing.T) {
	pool := sharedPool(t)
	st, _ := newStore(t, pool)
	name := "idemkey_test_" + strings.ToLower(rand.Text())
	_, tx, ctx, h := handlerTx(t, st)
	if _, err := h.Prepare(ctx, name, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(context.Background(), record("ok", 1), time.Minute); err != nil {
		t.Fatal(err)
	}
	// Every connection left in the pool: none knows the statement.
	conns := make([]*pgxpool.Conn, 0, 40)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range pool.Stat().IdleConns() {
		c, err := pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		var n int
		if err := c.QueryRow(context.Background(), "SELECT count(*) FROM pg_prepared_statements WHERE name = $1", name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("a pooled connection still holds the handler's prepared statement")
		}
	}
}
