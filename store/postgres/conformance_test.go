package postgres_test

import (
	"context"

	"testing"

	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/storetest"
)

// TestConformance runs the store suite in plain mode on the shared
// server, on a table of its own.
func TestConformance(t *testing.T) {
	st, _ := newStore(t, sharedPool(t))
	storetest.Run(t, func(*testing.T) storetest.Harness {
		return storetest.Harness{Store: st}
	})
}

// TestTxConformance runs the transactional suite on the pgx face: the
// handler writes through Tx, and ends the transaction itself with COMMIT
// or ROLLBACK sent as SQL (which the package tells handlers never to do,
// and survives).
func TestTxConformance(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	storetest.RunTx(t, func(*testing.T) storetest.TxHarness {
		return storetest.TxHarness{
			Store: st,
			Write: func(ctx context.Context, id string) error { return pay.insert(ctx, id, "storetest") },
			Written: func(ctx context.Context, id string) (n int, err error) {
				err = pool.QueryRow(ctx, "SELECT count(*) FROM "+pay.name+" WHERE key = $1", id).Scan(&n)
				return n, err
			},
			End: func(ctx context.Context, commit bool) error {
				sql := "ROLLBACK"
				if commit {
					sql = "COMMIT"
				}
				_, err := postgres.Tx(ctx).Exec(ctx, sql)
				return err
			},
			Kill: func(ctx context.Context) error {
				var pid uint32
				if err := postgres.Tx(ctx).QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
					return err
				}
				_, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
				return err
			},
		}
	})
}
