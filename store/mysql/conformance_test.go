package mysql_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/idemkey/idemkey/store/mysql"
	"github.com/idemkey/idemkey/store/storetest"
)

// TestConformance runs the store suite in plain mode on the shared
// server, on a table of its own, in real time.
func TestConformance(t *testing.T) {
	st, _ := newStore(t, sharedDB(t))
	storetest.Run(t, func(*testing.T) storetest.Harness {
		return storetest.Harness{Store: st}
	})
}

// TestTxConformance runs the transactional suite: the handler writes
// through mysql.Tx, ends the transaction itself with the *sql.Tx's Commit
// or Rollback, and dies with a KILL of its session.
func TestTxConformance(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	pay := newPayments(t, db)
	storetest.RunTx(t, func(*testing.T) storetest.TxHarness {
		return storetest.TxHarness{
			Store: st,
			Write: func(ctx context.Context, id string) error { return pay.insert(ctx, mysql.Tx(ctx), id, "storetest") },
			Written: func(ctx context.Context, id string) (n int, err error) {
				err = db.QueryRowContext(ctx, "SELECT count(*) FROM `"+pay.name+"` WHERE k = ?", id).Scan(&n)
				return n, err
			},
			End: func(ctx context.Context, commit bool) error {
				if commit {
					return mysql.Tx(ctx).Commit()
				}
				return mysql.Tx(ctx).Rollback()
			},
			Kill: func(ctx context.Context) error {
				var id int64
				if err := mysql.Tx(ctx).QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
					return err
				}
				_, err := db.ExecContext(ctx, "KILL "+strconv.FormatInt(id, 10))
				return err
			},
		}
	})
}
