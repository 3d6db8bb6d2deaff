package postgres_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/storetest"
)

// sqlDB opens a database/sql DB on the shared server, through pgx's
// driver, closed when the test ends.
func sqlDB(t testing.TB) *sql.DB {
	t.Helper()
	sharedPool(t) // skips, or fails under CI, without a server
	db, err := sql.Open("pgx", sharedURL(t))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	t.Cleanup(func() { db.Close() })
	return db
}

// newSQLStore returns a Store through database/sql on a fresh table, as
// newStore does for the pgx face.
func newSQLStore(t testing.TB, db *sql.DB, opts ...postgres.Option) (*postgres.Store, string) {
	t.Helper()
	table := newTable(t, sharedPool(t))
	opts = append([]postgres.Option{postgres.WithTable(table), postgres.WithSweepInterval(0),
		postgres.WithCallTimeout(10 * time.Second)}, opts...)
	st, err := postgres.NewDB(context.Background(), db, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, table
}

// TestSQLConformance runs the store suite in plain mode through
// database/sql.
func TestSQLConformance(t *testing.T) {
	st, _ := newSQLStore(t, sqlDB(t))
	storetest.Run(t, func(*testing.T) storetest.Harness {
		return storetest.Harness{Store: st}
	})
}

// TestSQLTxConformance runs the transactional suite on the database/sql
// face: the handler writes through SQLTx, and ends the transaction itself
// with its Commit or Rollback method.
func TestSQLTxConformance(t *testing.T) {
	db := sqlDB(t)
	st, table := newSQLStore(t, db)
	pay := newPayments(t, sharedPool(t), table)
	storetest.RunTx(t, func(*testing.T) storetest.TxHarness {
		return storetest.TxHarness{
			Store: st,
			Write: func(ctx context.Context, id string) error {
				_, err := postgres.SQLTx(ctx).ExecContext(ctx, "INSERT INTO "+pay.name+" (key, made_by) VALUES ($1, 'storetest')", id)
				return err
			},
			Written: func(ctx context.Context, id string) (n int, err error) {
				err = db.QueryRowContext(ctx, "SELECT count(*) FROM "+pay.name+" WHERE key = $1", id).Scan(&n)
				return n, err
			},
			End: func(ctx context.Context, commit bool) error {
				if commit {
					return postgres.SQLTx(ctx).Commit()
				}
				return postgres.SQLTx(ctx).Rollback()
			},
			Kill: func(ctx context.Context) error {
				var pid uint32
				if err := postgres.SQLTx(ctx).QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
					return err
				}
				_, err := db.ExecContext(ctx, "SELECT pg_terminate_backend($1)", pid)
				return err
			},
		}
	})
}

// TestSQLLateWritesUndone: a goroutine the handler left running keeps
// writing through the request's *sql.Tx while the store ends it without
// keeping anything (a 5xx's rollback, a commit refused). None of those
// writes commits: the key is free after, and its retry runs the handler
// again, so a write that landed would be made twice.
func TestSQLLateWritesUndone(t *testing.T) {
	db := sqlDB(t)
	st, table := newSQLStore(t, db)
	pay := newPayments(t, sharedPool(t), table)
	lateWritesUndone(t, st, pay, 10, pay.insertSQL)
}
