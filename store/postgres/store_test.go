package postgres_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

func TestNewErrors(t *testing.T) {
	pool := sharedPool(t)
	ctx := context.Background()
	if _, err := postgres.New(ctx, nil); err == nil {
		t.Error("New with a nil pool: no error")
	}
	_, err := postgres.New(ctx, pool, postgres.WithTable("idemkey_no_such_table"))
	if err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "Migrate") {
		t.Errorf("missing table: %v, want an error that says how to create it", err)
	}
	// A table that is not the store's.
	name := "idemkey_test_other_" + strings.ToLower(newKey()[len(store.KeyPrefix)+1:][:8])
	if _, err := pool.Exec(ctx, "CREATE TABLE "+name+" (key text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP TABLE "+name) })
	if _, err := postgres.New(ctx, pool, postgres.WithTable(name)); err == nil || !strings.Contains(err.Error(), "not the store's table") {
		t.Errorf("a table without the columns: %v", err)
	}
	// Every bad option is reported, each with the package's prefix.
	_, err = postgres.New(ctx, pool,
		postgres.WithTable("Bad-Name"),
		postgres.WithCallTimeout(0),
		postgres.WithCommitTimeout(-time.Second),
		postgres.WithSweepInterval(-1),
		postgres.WithSweepBatch(0),
		postgres.WithTxOptions(pgx.TxOptions{AccessMode: pgx.ReadOnly}),
		postgres.WithTxOptions(pgx.TxOptions{IsoLevel: "chaos"}),
		postgres.WithTxOptions(pgx.TxOptions{BeginQuery: "BEGIN"}),
		nil,
	)
	if err == nil {
		t.Fatal("bad options: no error")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 9 {
		t.Errorf("%d errors reported, want 9:\n%v", len(lines), err)
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "idemkey: postgres: ") {
			t.Errorf("error without the package prefix: %q", l)
		}
	}
}

// TestMissingTableNamesWhatToApply: when New and NewDB find no table, the
// error says what to apply with a migration tool: postgres.SchemaSQL for
// the default table (here missing from an empty schema the connections'
// search_path names), and postgres.Schema("<table>") for a table of
// another name, whose statements SchemaSQL's are not.
func TestMissingTableNamesWhatToApply(t *testing.T) {
	pool := sharedPool(t)
	ctx := context.Background()
	empty := "idemkey_test_empty_" + strings.ToLower(rand.Text()[:8])
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+empty); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP SCHEMA "+empty) })
	cfg := pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["search_path"] = empty
	cfg.MaxConns = 2
	inEmpty, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inEmpty.Close)
	inEmptyDB := stdlib.OpenDB(*cfg.ConnConfig.Copy())
	t.Cleanup(func() { inEmptyDB.Close() })
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })

	for _, c := range []struct {
		pool  *pgxpool.Pool
		db    *sql.DB
		table string // "" for the default
		apply string
	}{
		{inEmpty, inEmptyDB, "", "apply postgres.SchemaSQL with your migration tool"},
		{pool, db, "idemkey_no_such_table", `apply postgres.Schema("idemkey_no_such_table") with your migration tool`},
		{pool, db, empty + ".idemkey_records", `apply postgres.Schema("` + empty + `.idemkey_records") with your migration tool`},
	} {
		opts := []postgres.Option{postgres.WithSweepInterval(0)}
		if c.table != "" {
			opts = append(opts, postgres.WithTable(c.table))
		}
		_, err := postgres.New(ctx, c.pool, opts...)
		if err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), c.apply) {
			t.Errorf("New, table %q missing: %v, want an error that says to %s", c.table, err, c.apply)
		}
		_, err = postgres.NewDB(ctx, c.db, opts...)
		if err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), c.apply) {
			t.Errorf("NewDB, table %q missing: %v, want an error that says to %s", c.table, err, c.apply)
		}
	}
}

func TestSchema(t *testing.T) {
	got, err := postgres.Schema(postgres.DefaultTable)
	if err != nil || got != postgres.SchemaSQL {
		t.Errorf("Schema(default) differs from SchemaSQL (%v)", err)
	}
	got, err = postgres.Schema("app.idem")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(got, postgres.DefaultTable) || !strings.Contains(got, `"app"."idem"`) || !strings.Contains(got, `INDEX IF NOT EXISTS "idem_expires_at" ON "app"."idem"`) {
		t.Errorf("Schema(app.idem):\n%s", got)
	}
	for _, bad := range []string{"", "a.b.c", "Upper", "1abc", "semi;colon", strings.Repeat("a", 64)} {
		if _, err := postgres.Schema(bad); err == nil {
			t.Errorf("Schema(%q): no error", bad)
		}
	}
	// A schema-qualified table, made by Migrate (twice: it changes
	// nothing the second time) and used by New.
	pool := sharedPool(t)
	ctx := context.Background()
	schema := "idemkey_test_schema_" + strings.ToLower(newKey()[len(store.KeyPrefix)+1:][:8])
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	for range 2 {
		if err := postgres.Migrate(ctx, pool, postgres.WithTable(schema+".records")); err != nil {
			t.Fatal(err)
		}
	}
	st, err := postgres.New(ctx, pool, postgres.WithTable(schema+".records"), postgres.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if res, err := st.Claim(ctx, newKey(), newClaim(1)); err != nil || res.State != store.Claimed {
		t.Fatalf("claim: %v %v", res.State, err)
	}
}

// TestMigrateConcurrently: instances that start together all migrate,
// and none fails.
func TestMigrateConcurrently(t *testing.T) {
	pool := sharedPool(t)
	name := "idemkey_test_migrate_" + strings.ToLower(newKey()[len(store.KeyPrefix)+1:][:8])
	t.Cleanup(func() {
		pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+name+"; DROP FUNCTION IF EXISTS "+name+"_claim")
	})
	errs := make(chan error, 8)
	for range 8 {
		go func() { errs <- postgres.Migrate(context.Background(), pool, postgres.WithTable(name)) }()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func TestClaimValidation(t *testing.T) {
	st, _ := newStore(t, sharedPool(t))
	ctx := context.Background()
	for _, c := range []store.Claim{
		{Token: "", TTL: time.Second},
		{Token: "t", TTL: 0},
	} {
		if _, err := st.Claim(ctx, newKey(), c); err == nil || errors.Is(err, store.ErrUnavailable) {
			t.Errorf("Claim %+v: %v, want a usage error", c, err)
		}
		if _, _, err := st.ClaimTx(ctx, newKey(), c); err == nil || errors.Is(err, store.ErrUnavailable) {
			t.Errorf("ClaimTx %+v: %v, want a usage error", c, err)
		}
	}
	key, c := newKey(), newClaim(1)
	st.Claim(ctx, key, c)
	if err := st.Complete(ctx, key, c.Token, nil, time.Minute); err == nil {
		t.Error("Complete with a nil record: no error")
	}
	if err := st.Complete(ctx, key, c.Token, record("x", 1), 0); err == nil {
		t.Error("Complete with no retention: no error")
	}
	if err := st.Extend(ctx, key, c.Token, 0); err == nil {
		t.Error("Extend by 0: no error")
	}
}

// TestUnreadableHeader: a header block written by a later version is
// ErrUnreadable, which is not ErrUnavailable.
func TestUnreadableHeader(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	ctx := context.Background()
	key, c := newKey(), newClaim(1)
	st.Claim(ctx, key, c)
	if err := st.Complete(ctx, key, c.Token, record("x", 1), time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "UPDATE "+pgx.Identifier{table}.Sanitize()+" SET header = '\\x02'::bytea WHERE key = $1", key); err != nil {
		t.Fatal(err)
	}
	_, err := st.Claim(ctx, key, newClaim(1))
	if !errors.Is(err, postgres.ErrUnreadable) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("claim of an unreadable record: %v", err)
	}
	if _, _, err := st.ClaimTx(ctx, key, newClaim(1)); !errors.Is(err, postgres.ErrUnreadable) {
		t.Fatalf("ClaimTx of an unreadable record: %v", err)
	}
}
