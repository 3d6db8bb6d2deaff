package datalayers_test

import (
	"context"
	"database/sql"
	"net/url"
	"testing"

	_ "github.com/lib/pq"

	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/storetest"
)

// libpqDB is PostgreSQL through lib/pq, the other database/sql driver
// store/postgres's NewDB is used with: the same server, tables and store,
// another driver under every data layer.
var libpqDB = func() *database {
	d := *postgresDB
	d.name, d.driver = "postgres-libpq", "postgres"
	d.open = func(raw, ns string, maxConns int) (*sql.DB, error) {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, err
		}
		q := u.Query()
		q.Set("search_path", ns) // lib/pq sends it as a run-time parameter
		u.RawQuery = q.Encode()
		db, err := sql.Open("postgres", u.String())
		if err != nil {
			return nil, err
		}
		db.SetMaxOpenConns(maxConns)
		return db, nil
	}
	return &d
}()

func init() { databases = append(databases, libpqDB) }

// TestLibpqStoreSuites runs the store's conformance and transactional
// suites through lib/pq.
func TestLibpqStoreSuites(t *testing.T) {
	e := newEnv(t, libpqDB)
	storetest.Run(t, func(*testing.T) storetest.Harness { return storetest.Harness{Store: e.st} })
	storetest.RunTx(t, func(*testing.T) storetest.TxHarness {
		return storetest.TxHarness{
			Store: e.st,
			Write: func(ctx context.Context, id string) error {
				_, err := postgres.SQLTx(ctx).ExecContext(ctx, "INSERT INTO payments (id, idem_key, amount, made_by) VALUES ($1, $1, 1, 'storetest')", id)
				return err
			},
			Written: func(ctx context.Context, id string) (n int, err error) {
				err = e.db.QueryRowContext(ctx, "SELECT count(*) FROM payments WHERE id = $1", id).Scan(&n)
				return n, err
			},
			End: func(ctx context.Context, commit bool) error {
				if commit {
					return postgres.SQLTx(ctx).Commit()
				}
				return postgres.SQLTx(ctx).Rollback()
			},
			Kill: func(ctx context.Context) error {
				var pid int
				if err := postgres.SQLTx(ctx).QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
					return err
				}
				_, err := e.db.ExecContext(ctx, "SELECT pg_terminate_backend($1)", pid)
				return err
			},
		}
	})
}
