package mysql_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// TestKeyLockLetGoFirst: a claim lets go of the key's named lock before
// its fingerprint's, so that no session ever holds the key's lock alone:
// a repeat of the request that met such a session would take the
// fingerprint's lock and not the key's, which reads as another request in
// flight (a false 422). A spy waits for the fingerprint's lock while the
// owner ends, by Rollback, Commit, or the Commit of a kept 4xx, and looks
// at the key's lock the moment it gets it: it must be free. The server's
// RELEASE_ALL_LOCKS lets go in an order that depends on the locks' names,
// the fingerprint's first for about half the keys.
func TestKeyLockLetGoFirst(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	ctx := context.Background()
	spy, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer spy.Close()
	var spyID int64
	if err := spy.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&spyID); err != nil {
		t.Fatal(err)
	}
	ends := []struct {
		name string
		end  func(tx store.Tx, c store.Claim) error
	}{
		{"Rollback", func(tx store.Tx, _ store.Claim) error { return tx.Rollback(ctx) }},
		{"Commit", func(tx store.Tx, c store.Claim) error { return tx.Commit(ctx, record(c.Fingerprint, 201), time.Hour) }},
		{"Commit4xx", func(tx store.Tx, c store.Claim) error { return tx.Commit(ctx, record(c.Fingerprint, 422), time.Hour) }},
	}
	const rounds = 300
	for _, e := range ends {
		t.Run(e.name, func(t *testing.T) {
			alone := 0
			for range rounds {
				key, c := newKey(), newClaim(1)
				res, tx, err := st.ClaimTx(ctx, key, c)
				if err != nil || res.State != store.Claimed {
					t.Fatalf("ClaimTx: %v %v", res.State, err)
				}
				kl, fl := st.Locks(key, c.Fingerprint)
				got := make(chan sql.NullInt64, 1)
				go func() {
					var took int
					var keyHolder sql.NullInt64
					err := spy.QueryRowContext(ctx, "SELECT GET_LOCK(?, 5), IS_USED_LOCK(?)", fl, kl).Scan(&took, &keyHolder)
					if err == nil && took != 1 {
						t.Errorf("the spy did not get the fingerprint's lock within 5 s")
					}
					if err == nil {
						_, err = spy.ExecContext(ctx, "DO RELEASE_ALL_LOCKS()")
					}
					if err != nil {
						t.Error(err)
					}
					got <- keyHolder
				}()
				waitUserLock(t, db, spyID)
				if err := e.end(tx, c); err != nil {
					t.Fatal(err)
				}
				if holder := <-got; holder.Valid {
					alone++
				}
			}
			if alone != 0 {
				t.Errorf("in %d of %d rounds the key's lock was still held when the fingerprint's was let go of", alone, rounds)
			}
		})
	}
}

// waitUserLock waits until the session id waits for a named lock.
func waitUserLock(t *testing.T, db *sql.DB, id int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var state sql.NullString
		err := db.QueryRow("SELECT STATE FROM information_schema.PROCESSLIST WHERE ID = ?", id).Scan(&state)
		if err != nil && err != sql.ErrNoRows {
			t.Fatal(err)
		}
		if strings.Contains(strings.ToLower(state.String), "lock") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %d does not wait for a named lock (state %q)", id, state.String)
		}
		time.Sleep(200 * time.Microsecond)
	}
}
