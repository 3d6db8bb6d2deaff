package postgres_test

import (
	"context"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkey/idemkey/store"
)

// TestBytesPerRecord measures what the table and its indexes hold per
// kept record, for the operations guide: 10,000 records of a typical
// payment answer (a 74-byte JSON body, Content-Type and Location), as
// pg_total_relation_size counts them after VACUUM.
func TestBytesPerRecord(t *testing.T) {
	if os.Getenv("IDEMKEY_MEASURE") == "" {
		t.Skip("a measurement: set IDEMKEY_MEASURE=1 to run it")
	}
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	ctx := context.Background()
	const n = 10000
	id := pgx.Identifier{table}.Sanitize()
	size := func() (total, heap, idx int64) {
		if _, err := pool.Exec(ctx, "VACUUM "+id); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, "SELECT pg_total_relation_size($1), pg_table_size($1), pg_indexes_size($1)", table).Scan(&total, &heap, &idx); err != nil {
			t.Fatal(err)
		}
		return
	}
	t0, h0, i0 := size()
	claims := make([]store.Claim, n)
	keys := make([]string, n)
	for i := range n {
		keys[i], claims[i] = newKey(), newClaim(1)
		if _, err := st.Claim(ctx, keys[i], claims[i]); err != nil {
			t.Fatal(err)
		}
	}
	t1, h1, i1 := size()
	body := []byte(`{"id":"pay_970e069a29885c46","amount":10,"currency":"EUR","user":"alice"}` + "\n")
	for i := range n {
		rec := record("", 1)
		rec.Body = body
		rec.Header = http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/pay_970e069a29885c46"}}
		if err := st.Complete(ctx, keys[i], claims[i].Token, rec, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	t2, h2, i2 := size()
	var row float64
	if err := pool.QueryRow(ctx, "SELECT avg(pg_column_size(r.*)) FROM "+id+" r").Scan(&row); err != nil {
		t.Fatal(err)
	}
	t.Logf("per claim in flight: %d bytes (table %d, indexes %d)", (t1-t0)/n, (h1-h0)/n, (i1-i0)/n)
	t.Logf("per kept record, after VACUUM: %d bytes (table %d, indexes %d); a record's row is %.0f bytes", (t2-t0)/n, (h2-h0)/n, (i2-i0)/n, row)
	if _, err := pool.Exec(ctx, "VACUUM FULL "+id); err != nil {
		t.Fatal(err)
	}
	t3, h3, i3 := size()
	t.Logf("per kept record, after VACUUM FULL: %d bytes (table %d, indexes %d)", t3/n, h3/n, i3/n)
}
