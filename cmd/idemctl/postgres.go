package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// chooseStore returns the PostgreSQL URL to use, or "" for Redis:
// --database-url, or $DATABASE_URL when neither --redis nor $REDIS_URL
// names a Redis. Both flags, or both variables without a flag, are a
// usage error.
func chooseStore(redisFlag, dbFlag string, cluster bool) (string, error) {
	switch {
	case dbFlag != "" && (redisFlag != "" || cluster):
		return "", fmt.Errorf("%w: give --redis (with --cluster) or --database-url, not both", errUsage)
	case dbFlag != "":
		return dbFlag, nil
	case redisFlag != "" || cluster:
		return "", nil
	}
	db, rd := os.Getenv("DATABASE_URL"), os.Getenv("REDIS_URL")
	switch {
	case db != "" && rd != "":
		return "", fmt.Errorf("%w: both DATABASE_URL and REDIS_URL are set: choose with --database-url or --redis", errUsage)
	case db != "":
		return db, nil
	}
	return "", nil
}

// connectPostgres opens the store/postgres table on url, with no sweeper.
// The commands use one or two connections, which the pool opens as they
// are needed; its bound of ten only keeps quiet the store's warning about
// small pools, which is a service's concern (each of its requests holds a
// connection), not a command's.
func connectPostgres(ctx context.Context, url, table string) (*postgres.Store, func(), error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// The URL may hold a password: do not repeat it.
		return nil, nil, fmt.Errorf("%w: --database-url is not a valid postgres:// URL", errUsage)
	}
	cfg.MaxConns = 10
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	st, err := postgres.New(ctx, pool, postgres.WithTable(table), postgres.WithSweepInterval(0))
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return st, func() { st.Close(); pool.Close() }, nil
}

// pgSummary is what stats prints for a PostgreSQL store.
type pgSummary struct {
	Table string `json:"table"`
	// Rows counts every row; Records, InFlight and Expired split them
	// (Expired: their life is over and the sweeper has not deleted them
	// yet). Transactional counts the claims in flight made in a request's
	// transaction.
	Rows          int64 `json:"rows"`
	Records       int64 `json:"records"`
	InFlight      int64 `json:"in_flight"`
	Transactional int64 `json:"transactional"`
	Expired       int64 `json:"expired"`
	// TableBytes, IndexBytes and TotalBytes are the table's size on disk,
	// its indexes' and both; BytesPerRow is TotalBytes over Rows.
	TableBytes  int64   `json:"table_bytes"`
	IndexBytes  int64   `json:"index_bytes"`
	TotalBytes  int64   `json:"total_bytes"`
	BytesPerRow float64 `json:"bytes_per_row"`
	// DeadRows are row versions awaiting vacuum (an estimate).
	DeadRows       int64      `json:"dead_rows"`
	LastVacuum     *time.Time `json:"last_vacuum,omitempty"`
	LastAutovacuum *time.Time `json:"last_autovacuum,omitempty"`
	OldestExpiry   *time.Time `json:"oldest_expiry,omitempty"`
}

// printTableStats prints what Stats counted in a PostgreSQL store.
func (e *env) printTableStats(st store.Stats, ts *postgres.TableStats) error {
	s := pgSummary{Table: e.table, Rows: st.Records + st.InFlight + st.Expired, Records: st.Records, InFlight: st.InFlight,
		Transactional: ts.Transactional, Expired: st.Expired, TableBytes: ts.TableBytes,
		IndexBytes: ts.IndexBytes, TotalBytes: ts.TotalBytes, DeadRows: ts.DeadRows}
	if s.Rows > 0 {
		s.BytesPerRow = float64(ts.TotalBytes) / float64(s.Rows)
	}
	for _, t := range []struct {
		dst **time.Time
		src time.Time
	}{{&s.LastVacuum, ts.LastVacuum}, {&s.LastAutovacuum, ts.LastAutovacuum}, {&s.OldestExpiry, ts.OldestExpiry}} {
		if !t.src.IsZero() {
			v := t.src
			*t.dst = &v
		}
	}
	if e.json {
		return e.printJSON(s)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintf(tw, "table\t%s\n", s.Table)
	fmt.Fprintf(tw, "rows\t%d\n", s.Rows)
	fmt.Fprintf(tw, "records\t%d\n", s.Records)
	fmt.Fprintf(tw, "in flight\t%d (%d in a request's transaction)\n", s.InFlight, s.Transactional)
	fmt.Fprintf(tw, "expired\t%d (not swept yet; the store treats their keys as free)\n", s.Expired)
	perRow := ""
	if s.Rows > 0 {
		perRow = fmt.Sprintf(", %.0f per row", s.BytesPerRow)
	}
	fmt.Fprintf(tw, "size\t%d bytes (table %d, indexes %d)%s\n", s.TotalBytes, s.TableBytes, s.IndexBytes, perRow)
	fmt.Fprintf(tw, "dead rows\t%d (awaiting vacuum)\n", s.DeadRows)
	when := func(t *time.Time) string {
		if t == nil {
			return "never"
		}
		return t.UTC().Format(time.RFC3339)
	}
	fmt.Fprintf(tw, "last vacuum\t%s (autovacuum %s)\n", when(s.LastVacuum), when(s.LastAutovacuum))
	if s.OldestExpiry != nil {
		fmt.Fprintf(tw, "oldest expiry\t%s\n", when(s.OldestExpiry))
	}
	return nil
}
