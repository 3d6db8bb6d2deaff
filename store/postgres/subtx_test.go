package postgres_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// statementLog is a pgx tracer that keeps the text of every statement
// sent, alone or in a batch.
type statementLog struct {
	mu   sync.Mutex
	sqls []string
}

func (l *statementLog) add(sql string) {
	l.mu.Lock()
	l.sqls = append(l.sqls, sql)
	l.mu.Unlock()
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.add(d.SQL)
	return ctx
}

func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *statementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (l *statementLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.add(d.SQL)
}

func (l *statementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// subtransactions returns the statements logged that open, end or roll
// back to a subtransaction.
func (l *statementLog) subtransactions() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var bad []string
	for _, s := range l.sqls {
		u := strings.ToUpper(strings.TrimSpace(s))
		if strings.HasPrefix(u, "SAVEPOINT") || strings.HasPrefix(u, "ROLLBACK TO") || strings.HasPrefix(u, "RELEASE") {
			bad = append(bad, s)
		}
	}
	return bad
}

// TestNoSubtransaction: no path of either face sends a statement that
// opens a subtransaction (a SAVEPOINT, or its ROLLBACK TO or RELEASE), as
// a pgx tracer sees every statement sent: first runs that keep a 2xx, a
// 4xx whose writes are undone and one whose writes are kept, a 5xx,
// replays, repeats in flight and of another request, keyless requests, and
// the plain store's calls; and the table's claim function has no
// EXCEPTION block (a subtransaction on every call).
func TestNoSubtransaction(t *testing.T) {
	url := sharedURL(t)
	ctx := context.Background()
	log := &statementLog{}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = log
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db := stdlib.OpenDB(*cfg.ConnConfig.Copy())
	t.Cleanup(func() { db.Close() })

	table := newTable(t, sharedPool(t))
	pay := newPayments(t, sharedPool(t), table)
	var src string
	if err := pool.QueryRow(ctx, "SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure($1)",
		table+"_claim(text, text, bytea, bigint, bigint, bigint, text)").Scan(&src); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.ToUpper(src), "EXCEPTION") {
		t.Errorf("the claim function has an EXCEPTION block:\n%s", src)
	}

	for _, face := range []string{"pgx", "database/sql"} {
		for _, writes := range []bool{false, true} {
			opts := []postgres.Option{postgres.WithTable(table), postgres.WithSweepInterval(0),
				postgres.WithCallTimeout(10 * time.Second), postgres.WithClientErrorWrites(writes)}
			var st *postgres.Store
			if face == "pgx" {
				st, err = postgres.New(ctx, pool, opts...)
			} else {
				st, err = postgres.NewDB(ctx, db, opts...)
			}
			if err != nil {
				t.Fatal(err)
			}
			insert := func(tctx context.Context, key string) {
				t.Helper()
				q := "INSERT INTO " + pay.name + " (key) VALUES ($1)"
				if tx := postgres.Tx(tctx); tx != nil {
					_, err = tx.Exec(tctx, q, key)
				} else {
					_, err = postgres.SQLTx(tctx).ExecContext(tctx, q, key)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			run := func(key string, status int) {
				t.Helper()
				c := newClaim(1)
				res, tx, err := st.ClaimTx(ctx, key, c)
				if err != nil || res.State != store.Claimed {
					t.Fatalf("%s: ClaimTx: %v %v", face, res.State, err)
				}
				insert(tx.NewContext(ctx), key)
				// A repeat while it runs, and another request.
				if res, _, err := st.ClaimTx(ctx, key, newClaim(1)); err != nil || res.State != store.InFlight {
					t.Fatalf("%s: repeat in flight: %v %v", face, res.State, err)
				}
				if res, _, err := st.ClaimTx(ctx, key, newClaim(2)); err != nil || res.State != store.InFlight {
					t.Fatalf("%s: another request: %v %v", face, res.State, err)
				}
				if status >= 500 {
					err = tx.Rollback(ctx)
				} else {
					rec := record("answer", 1)
					rec.Status = status
					err = tx.Commit(ctx, rec, time.Minute)
				}
				if err != nil {
					t.Fatalf("%s: end of %d: %v", face, status, err)
				}
			}
			for _, status := range []int{201, 404, 500} {
				key := newKey()
				run(key, status)
				if status < 500 {
					if res, _, err := st.ClaimTx(ctx, key, newClaim(1)); err != nil || res.State != store.Completed {
						t.Fatalf("%s: replay of %d: %v %v", face, status, res.State, err)
					}
				}
			}
			for _, status := range []int{201, 404} {
				tx, err := st.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				insert(tx.NewContext(ctx), "keyless")
				rec := record("answer", 1)
				rec.Status = status
				if err := tx.Commit(ctx, rec, time.Minute); err != nil {
					t.Fatal(err)
				}
			}
			key, c := newKey(), newClaim(1)
			if _, err := st.Claim(ctx, key, c); err != nil {
				t.Fatal(err)
			}
			if err := st.Complete(ctx, key, c.Token, record("plain", 1), time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := st.Release(ctx, newKey(), c.Token); err != nil {
				t.Fatal(err)
			}
			st.Close()
		}
	}
	if len(log.sqls) < 50 {
		t.Fatalf("the tracer saw %d statements: it does not see what the store sends", len(log.sqls))
	}
	if bad := log.subtransactions(); len(bad) > 0 {
		t.Errorf("statements that open a subtransaction were sent:\n%s", strings.Join(bad, "\n"))
	}
}

// TestKeptClientErrorLosesToAnotherRequest: a kept 4xx whose writes are
// undone rolls its transaction back before it keeps its record, and if
// another request takes the key in that moment, that request wins: here
// a session queued on the key's lock gets it the moment the rollback lets
// go, so the 4xx is not kept (Commit answers store.ErrNotOwner) and
// nothing of it is written; once that session ends, the key is free.
func TestKeptClientErrorLosesToAnotherRequest(t *testing.T) {
	pool := sharedPool(t)
	st, _ := newStore(t, pool)
	ctx := context.Background()
	key, c := newKey(), newClaim(1)
	tx := claimTx(t, st, key, c, store.Claimed)
	lock, _ := st.Locks(key, c.Fingerprint)

	other, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	if _, err := other.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	taken := make(chan error, 1)
	go func() {
		_, err := other.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lock)
		taken <- err
	}()
	// Wait until the other session is queued on the lock.
	for deadline := time.Now().Add(5 * time.Second); ; {
		var waiting bool
		if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = ($1::bigint & 4294967295)::oid)", lock).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the other session never queued on the key's lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
	rec := record("not found", 1)
	rec.Status = 404
	if err := tx.Commit(ctx, rec, time.Minute); !errors.Is(err, store.ErrNotOwner) {
		t.Errorf("the 4xx's commit while another request takes the key: %v, want store.ErrNotOwner", err)
	}
	if err := <-taken; err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	claimTx(t, st, key, newClaim(1), store.Claimed).Rollback(ctx)
}
