package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/mysql"
)

// isMySQL reports whether a --database-url names a MySQL or MariaDB
// server (mysql://, or mariadb://) rather than PostgreSQL.
func isMySQL(url string) bool {
	return strings.HasPrefix(url, "mysql://") || strings.HasPrefix(url, "mariadb://")
}

// connectMySQL opens the store/mysql table on url, with no sweeper. The
// commands use one or two connections; the bound of ten only keeps the
// store's warning about small pools (for services) quiet.
func connectMySQL(ctx context.Context, url, table string) (*mysql.Store, func(), error) {
	dsn, err := mysql.DSN(url)
	if err != nil {
		// The URL may hold a password: do not repeat it.
		return nil, nil, fmt.Errorf("%w: --database-url is not a valid mysql://user[:password]@host:port/database URL", errUsage)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, nil, err
	}
	db.SetMaxOpenConns(10)
	st, err := mysql.New(ctx, db, mysql.WithTable(table), mysql.WithSweepInterval(0))
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return st, func() { st.Close(); db.Close() }, nil
}

// mysqlSummary is what stats prints for a MySQL store.
type mysqlSummary struct {
	Table string `json:"table"`
	// Rows counts every row; Records, InFlight and Expired split them
	// (Expired: their life is over and the sweeper has not deleted them
	// yet). Claims held by a request's transaction have no committed row
	// and are not counted.
	Rows     int64 `json:"rows"`
	Records  int64 `json:"records"`
	InFlight int64 `json:"in_flight"`
	Expired  int64 `json:"expired"`
	// DataBytes, IndexBytes, FreeBytes and TotalBytes are InnoDB's sizes
	// of the table; BytesPerRow is TotalBytes over Rows.
	DataBytes    int64      `json:"data_bytes"`
	IndexBytes   int64      `json:"index_bytes"`
	FreeBytes    int64      `json:"free_bytes"`
	TotalBytes   int64      `json:"total_bytes"`
	BytesPerRow  float64    `json:"bytes_per_row"`
	OldestExpiry *time.Time `json:"oldest_expiry,omitempty"`
}

// printMySQLStats prints what Stats counted in a MySQL store.
func (e *env) printMySQLStats(st store.Stats, ts *mysql.TableStats) error {
	s := mysqlSummary{Table: e.table, Rows: ts.Rows, Records: st.Records, InFlight: st.InFlight, Expired: st.Expired,
		DataBytes: ts.DataBytes, IndexBytes: ts.IndexBytes, FreeBytes: ts.FreeBytes, TotalBytes: ts.TotalBytes}
	if s.Rows > 0 {
		s.BytesPerRow = float64(ts.TotalBytes) / float64(s.Rows)
	}
	if !ts.OldestExpiry.IsZero() {
		v := ts.OldestExpiry
		s.OldestExpiry = &v
	}
	if e.json {
		return e.printJSON(s)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintf(tw, "table\t%s\n", s.Table)
	fmt.Fprintf(tw, "rows\t%d\n", s.Rows)
	fmt.Fprintf(tw, "records\t%d\n", s.Records)
	fmt.Fprintf(tw, "in flight\t%d (committed; claims in a request's transaction are not rows yet)\n", s.InFlight)
	fmt.Fprintf(tw, "expired\t%d (not swept yet; the store treats their keys as free)\n", s.Expired)
	perRow := ""
	if s.Rows > 0 {
		perRow = fmt.Sprintf(", %.0f per row", s.BytesPerRow)
	}
	fmt.Fprintf(tw, "size\t%d bytes (data %d, indexes %d, free %d)%s\n", s.TotalBytes, s.DataBytes, s.IndexBytes, s.FreeBytes, perRow)
	if s.OldestExpiry != nil {
		fmt.Fprintf(tw, "oldest expiry\t%s\n", s.OldestExpiry.UTC().Format(time.RFC3339))
	}
	return nil
}
