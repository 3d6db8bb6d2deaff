package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

func TestInspectDeleteStats(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	ctx := context.Background()

	if _, ok, err := st.Inspect(ctx, newKey()); ok || err != nil {
		t.Fatalf("a key never used: found %v, %v", ok, err)
	}
	// A record.
	kept, c := newKey(), newClaim(3)
	st.Claim(ctx, kept, c)
	if err := st.Complete(ctx, kept, c.Token, record("kept", 3), time.Hour); err != nil {
		t.Fatal(err)
	}
	rw, ok, err := st.Inspect(ctx, kept)
	if err != nil || !ok || rw.State != store.Completed || rw.Record == nil || string(rw.Record.Body) != "kept" ||
		rw.Fingerprint != c.Fingerprint || rw.TTL <= 59*time.Minute || rw.Size <= 0 || rw.Transactional {
		t.Fatalf("the record: %+v %v %v", rw, ok, err)
	}
	// A transactional claim whose owner lives, then one whose owner is
	// gone: its key is free at once.
	live := newKey()
	tx := claimTx(t, st, live, newClaim(4), store.Claimed)
	rw, ok, err = st.Inspect(ctx, live)
	if err != nil || !ok || rw.State != store.InFlight || !rw.Transactional || rw.OwnerGone || rw.Record != nil || rw.CreatedAt.IsZero() {
		t.Fatalf("a live claim: %+v %v %v", rw, ok, err)
	}
	pid := backendPID(t, tx.NewContext(ctx))
	var killed bool
	pool.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", int32(pid)).Scan(&killed)
	if rw, ok, _ = st.Inspect(ctx, live); ok {
		t.Errorf("a claim whose owner's backend was terminated: %+v", rw)
	}
	claimTx(t, st, live, newClaim(4), store.Claimed).Rollback(ctx)
	// An expired claim, not swept.
	lapsed, lc := newKey(), newClaim(5)
	lc.TTL = time.Millisecond
	st.Claim(ctx, lapsed, lc)
	time.Sleep(5 * time.Millisecond)

	stats, err := st.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ts, _ := stats.Detail.(*postgres.TableStats)
	if ts == nil {
		t.Fatalf("stats %+v without *postgres.TableStats", stats)
	}
	if stats.Records+stats.InFlight+stats.Expired != 2 || stats.Records != 1 || stats.InFlight != 0 || stats.Expired != 1 || ts.Transactional != 0 ||
		ts.TotalBytes < ts.TableBytes+ts.IndexBytes || ts.IndexBytes == 0 || ts.OldestExpiry.IsZero() || stats.Bytes != ts.TotalBytes {
		t.Errorf("stats %+v %+v", stats, ts)
	}
	if want := (pgx.Identifier{table}).Sanitize(); st.Table() != want {
		t.Errorf("Table() = %s", st.Table())
	}

	// Delete removes the row it was shown, and nothing that replaced it.
	rw, _, _ = st.Inspect(ctx, kept)
	if ok, err := st.Delete(ctx, kept, rw); !ok || err != nil {
		t.Fatalf("delete: %v %v", ok, err)
	}
	if _, ok, _ := st.Inspect(ctx, kept); ok {
		t.Error("the deleted row is still there")
	}
	if ok, err := st.Delete(ctx, kept, rw); ok || err != nil {
		t.Errorf("a second delete: %v %v", ok, err)
	}
	k, c1 := newKey(), newClaim(6)
	st.Claim(ctx, k, c1)
	seen, _, _ := st.Inspect(ctx, k)
	st.Complete(ctx, k, c1.Token, record("now kept", 6), time.Hour)
	if ok, err := st.Delete(ctx, k, seen); ok || err != nil {
		t.Errorf("delete of a claim that was completed since: %v %v", ok, err)
	}

	// An unreadable record is reported, with what could be read.
	if _, err := pool.Exec(ctx, "UPDATE "+pgx.Identifier{table}.Sanitize()+" SET header = '\\x09'::bytea WHERE key = $1", k); err != nil {
		t.Fatal(err)
	}
	rw, ok, err = st.Inspect(ctx, k)
	if !ok || !errors.Is(err, postgres.ErrUnreadable) || rw.State != store.Completed {
		t.Errorf("an unreadable record: %+v %v %v", rw, ok, err)
	}
}
