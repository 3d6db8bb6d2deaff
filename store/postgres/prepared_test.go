package postgres_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkey/idemkey/internal/pgtest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// TestPreparedStatementsBehindAPooler: behind PgBouncer in transaction
// mode without prepared-statement support, a pgx pool left in its
// default exec mode (cache_statement) names prepared statements that
// another client then meets on the same server connection: under
// concurrent requests some fail with "prepared statement ... already
// exists". New and NewDB find this out with a probe and refuse the pool
// with ErrPreparedStatements, saying what to set; in exec mode the same
// pooler is accepted and serves the same load without an error.
func TestPreparedStatementsBehindAPooler(t *testing.T) {
	direct := sharedPool(t)
	table := newTable(t, direct)
	b := pgtest.StartPgBouncer(t, pgtest.Shared(t), pgtest.PoolSize(4))
	ctx := context.Background()
	opts := []postgres.Option{postgres.WithTable(table), postgres.WithSweepInterval(0), postgres.WithCallTimeout(5 * time.Second)}

	open := func(url string) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 16
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	// load runs concurrent first runs and replays, each with a statement
	// of the handler's, and returns the errors met.
	load := func(st *postgres.Store) []error {
		var mu sync.Mutex
		var errs []error
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for range 10 {
					key := newKey()
					res, tx, err := st.ClaimTx(ctx, key, newClaim(1))
					if err == nil && res.State == store.Claimed {
						tctx := tx.NewContext(ctx)
						var one int
						if err = postgres.Tx(tctx).QueryRow(tctx, "SELECT 1").Scan(&one); err == nil {
							err = tx.Commit(ctx, record("ok", 1), time.Minute)
						} else {
							tx.Rollback(ctx)
						}
					}
					if err == nil {
						_, _, err = st.ClaimTx(ctx, key, newClaim(1))
					}
					if err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		return errs
	}

	cached := open(b.URL)
	st, err := postgres.New(ctx, cached, opts...)
	if err == nil {
		errs := load(st)
		st.Close()
		msg := ""
		if len(errs) > 0 {
			msg = errs[0].Error()
		}
		t.Fatalf("New accepted a pool in cache_statement mode behind a pooler without prepared statements; then %d of 160 requests failed (%s)", len(errs), msg)
	}
	if !errors.Is(err, postgres.ErrPreparedStatements) || !strings.Contains(err.Error(), "default_query_exec_mode") {
		t.Errorf("New: %v, want ErrPreparedStatements saying to set default_query_exec_mode", err)
	}
	cfg, err := pgxpool.ParseConfig(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg.ConnConfig)
	t.Cleanup(func() { db.Close() })
	if _, err := postgres.NewDB(ctx, db, opts...); !errors.Is(err, postgres.ErrPreparedStatements) {
		t.Errorf("NewDB: %v, want ErrPreparedStatements", err)
	}

	st, err = postgres.New(ctx, open(b.URL+"&default_query_exec_mode=exec"), opts...)
	if err != nil {
		t.Fatalf("New in exec mode: %v", err)
	}
	defer st.Close()
	if errs := load(st); len(errs) > 0 {
		t.Errorf("in exec mode, %d requests failed; the first: %v", len(errs), errs[0])
	}
	// Connected directly, the default mode is accepted.
	if st, err := postgres.New(ctx, direct, opts...); err != nil {
		t.Errorf("New on a direct pool: %v", err)
	} else {
		st.Close()
	}
}
