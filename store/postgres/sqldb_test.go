package postgres_test

import (
	"context"
	"database/sql"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkey/idemkey/store"
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
	for _, tc := range []struct {
		name string
		end  func(tx store.Tx) error
	}{
		{"Rollback", func(tx store.Tx) error { return tx.Rollback(context.Background()) }},
		{"CommitRefused", func(tx store.Tx) error { return tx.Commit(context.Background(), nil, time.Hour) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for round := range 10 {
				key, c := newKey(), newClaim(1)
				tx := claimTx(t, st, key, c, store.Claimed)
				ctx := tx.NewContext(context.Background())
				var wrote atomic.Int64
				stopped := make(chan error, 1)
				go func() {
					for {
						if err := pay.insertSQL(ctx, key, "late"); err != nil {
							stopped <- err
							return
						}
						wrote.Add(1)
					}
				}()
				for wrote.Load() < 3 {
					time.Sleep(time.Millisecond)
				}
				tc.end(tx)
				err := <-stopped
				if n := pay.count(t, key); n != 0 {
					t.Fatalf("round %d: %d of the late writes committed (the writer stopped with %v), want 0", round, n, err)
				}
				claimTx(t, st, key, newClaim(1), store.Claimed).Rollback(context.Background())
			}
		})
	}
}
