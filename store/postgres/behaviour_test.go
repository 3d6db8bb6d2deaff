package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/pgtest"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// TestKeptClientErrorUndoesWrites: a handler that inserts and then answers
// a 4xx that is kept (400, 404, 422, and a 3xx for contrast). By default
// the answer is kept and its writes are undone (clients read a 4xx as
// "nothing happened"); WithClientErrorWrites(true) commits them; a 3xx
// always commits.
func TestKeptClientErrorUndoesWrites(t *testing.T) {
	pool := sharedPool(t)
	for _, commit := range []bool{false, true} {
		t.Run(fmt.Sprint("commit=", commit), func(t *testing.T) {
			st, table := newStore(t, pool, postgres.WithClientErrorWrites(commit))
			pay := newPayments(t, pool, table)
			srv := server(t, st, &payHandler{pay: pay, by: "h"}, 10*time.Second)
			for _, status := range []int{400, 404, 422, 302} {
				key := newKey()
				a := post(client, srv.URL, key, "X-Status", fmt.Sprint(status))
				if a.err != nil || a.status != status {
					t.Fatalf("%d: %d %v", status, a.status, a.err)
				}
				again := post(client, srv.URL, key, "X-Status", fmt.Sprint(status))
				if again.status != status || !again.replayed {
					t.Errorf("%d: the repeat got %d (replayed %v), want the kept answer", status, again.status, again.replayed)
				}
				want := 1
				if status >= 400 && !commit {
					want = 0
				}
				if n := pay.count(t, key); n != want {
					t.Errorf("%d answered (WithClientErrorWrites(%v)): %d payments, want %d", status, commit, n, want)
				}
			}
		})
	}
}

// TestKeylessRequestRunsInATransaction: on a route where the key is
// optional, a request without one still finds a transaction in its
// context (the README's handler runs unchanged): a 201 commits its write
// and keeps nothing, a 5xx rolls it back.
func TestKeylessRequestRunsInATransaction(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	m, err := middleware.New(st)
	if err != nil {
		t.Fatal(err)
	}
	h := &payHandler{pay: pay, by: "keyless"}
	srv := httptestServer(t, m.Optional()(h))
	send := func(status string) int {
		req, _ := http.NewRequest(http.MethodPost, srv, strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Status", status)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := send("201"); got != 201 {
		t.Fatalf("a keyless request: %d, want 201 (500 means the handler found no transaction)", got)
	}
	if got := send("503"); got != 503 {
		t.Fatalf("a keyless 5xx: %d", got)
	}
	// The payments' key column holds "" for a request without a key.
	if n := pay.count(t, ""); n != 1 {
		t.Errorf("%d payments, want the 201's alone", n)
	}
	if n := idle(pool).AcquiredConns(); n != 0 {
		t.Errorf("%d connections still held", n)
	}
	var rows int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&rows); err != nil || rows != 0 {
		t.Errorf("%d rows kept for keyless requests (%v), want none", rows, err)
	}
}

// TestEveryIsolationLevelRunsAKeyOnce: under READ COMMITTED, REPEATABLE
// READ and SERIALIZABLE, 32 requests race on one key, round after round:
// whoever claims inserts a payment and commits, and a claim that meets a
// record committed after its transaction's snapshot is answered from the
// record (or in flight), never run again. One payment per key.
func TestEveryIsolationLevelRunsAKeyOnce(t *testing.T) {
	pool := sharedPool(t)
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			st, table := newStore(t, pool, postgres.WithTxOptions(pgx.TxOptions{IsoLevel: iso}), postgres.WithCallTimeout(10*time.Second))
			pay := newPayments(t, pool, table)
			for round := range 5 {
				key := newKey()
				var wg sync.WaitGroup
				var mu sync.Mutex
				states := map[store.State]int{}
				for range 32 {
					wg.Go(func() {
						ctx := context.Background()
						res, tx, err := st.ClaimTx(ctx, key, newClaim(1))
						if err != nil {
							t.Errorf("claim: %v", err)
							return
						}
						mu.Lock()
						states[res.State]++
						mu.Unlock()
						if tx == nil {
							return
						}
						if err := pay.insert(tx.NewContext(ctx), key, "run"); err != nil {
							t.Errorf("insert: %v", err)
						}
						if err := tx.Commit(ctx, record("paid", 1), time.Minute); err != nil {
							t.Errorf("commit: %v", err)
						}
					})
				}
				wg.Wait()
				if n := pay.count(t, key); n != 1 {
					t.Fatalf("round %d: %d payments (%v), want 1", round, n, states)
				}
				if states[store.Claimed] != 1 {
					t.Fatalf("round %d: %v, want one claim", round, states)
				}
				res, _, err := st.ClaimTx(context.Background(), key, newClaim(1))
				if err != nil || res.State != store.Completed {
					t.Fatalf("round %d: after the race: %v %v", round, res.State, err)
				}
			}
			if n := sessionLocks(t, pool); n != 0 {
				t.Errorf("%d session advisory locks held", n)
			}
		})
	}
}

// httptestServer serves h on a test server closed when the test ends, and
// returns its URL.
func httptestServer(t *testing.T, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestPoolExhaustedIsReported: every pool connection is held by a running
// request; the next request is answered 503 with a detail that does not
// blame its key, and the event carries the cause, ErrPoolExhausted.
func TestPoolExhaustedIsReported(t *testing.T) {
	pool := newPool(t, sharedURL(t), 1)
	st, table := newStore(t, pool, postgres.WithCallTimeout(200*time.Millisecond))
	pay := newPayments(t, sharedPool(t), table)
	var mu sync.Mutex
	var events []middleware.Event
	h := &payHandler{pay: pay, by: "h", block: make(chan struct{})}
	srv := server(t, st, h, 10*time.Second, middleware.WithObserver(func(_ *http.Request, e middleware.Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}))
	first := make(chan answer, 1)
	go func() { first <- post(client, srv.URL, newKey(), "X-Block", "1") }()
	for deadline := time.Now().Add(5 * time.Second); pool.Stat().AcquiredConns() == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	a := post(client, srv.URL, newKey())
	close(h.block)
	<-first
	if a.status != http.StatusServiceUnavailable || strings.Contains(a.body, "key could not") {
		t.Fatalf("a request finding the pool exhausted: %d %s", a.status, a.body)
	}
	mu.Lock()
	defer mu.Unlock()
	found := false
	for _, e := range events {
		if e.Kind == middleware.EventStoreError && errors.Is(e.Err, postgres.ErrPoolExhausted) {
			found = true
		}
	}
	if !found {
		t.Errorf("no store-error event with ErrPoolExhausted among %v", events)
	}
}

// TestNewRefusesLocksThatAreNotReal: a server whose advisory lock
// functions answer true whatever holds the lock (as CockroachDB's do) is
// refused at New: stood in for here by functions of that name that come
// before pg_catalog in the search path.
func TestNewRefusesLocksThatAreNotReal(t *testing.T) {
	pool := sharedPool(t)
	ctx := context.Background()
	_, table := newStore(t, pool)
	schema := "idemkey_fake_" + strings.TrimPrefix(table, "idemkey_test_")
	q := pgx.Identifier{schema}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+q+"; CREATE FUNCTION "+q+".pg_try_advisory_xact_lock(bigint) RETURNS boolean LANGUAGE sql AS 'SELECT true'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP SCHEMA "+q+" CASCADE") })
	cfg := pool.Config()
	cfg.ConnConfig.RuntimeParams["search_path"] = schema + ", pg_catalog, public"
	fake, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	_, err = postgres.New(ctx, fake, postgres.WithTable(table), postgres.WithSweepInterval(0))
	if !errors.Is(err, postgres.ErrLocksNotReal) {
		t.Fatalf("New on a server whose locks are not real: %v, want ErrLocksNotReal", err)
	}
}

// TestWaitWakesWhenTheOwnerEnds: a repeat that waits on the first
// request's transaction is woken the moment it commits, or rolls back,
// without polling; a key no transaction holds is not waited on.
func TestWaitWakesWhenTheOwnerEnds(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	ctx := context.Background()
	for _, commit := range []bool{true, false} {
		key, c := newKey(), newClaim(1)
		tx := claimTx(t, st, key, c, store.Claimed)
		if err := pay.insert(tx.NewContext(ctx), key, "first"); err != nil {
			t.Fatal(err)
		}
		woke := make(chan time.Time, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if ok, err := st.Wait(wctx, key, newClaim(1)); !ok || err != nil {
				t.Errorf("wait: %v %v, want woken", ok, err)
			}
			woke <- time.Now()
		}()
		// The waiter is parked on the owner's lock (pg_locks shows it
		// waiting) before the owner ends.
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			var waiting int
			pool.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").Scan(&waiting)
			if waiting > 0 {
				break
			}
		}
		select {
		case <-woke:
			t.Fatal("the waiter returned while the owner still ran")
		default:
		}
		var ended time.Time
		if commit {
			if err := tx.Commit(ctx, record("paid", 1), time.Minute); err != nil {
				t.Fatal(err)
			}
		} else if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		ended = time.Now()
		t.Logf("commit %v: woken %v after the owner's end returned", commit, (<-woke).Sub(ended))
		want := store.Completed
		if !commit {
			want = store.Claimed
		}
		res, again, err := st.ClaimTx(ctx, key, newClaim(1))
		if err != nil || res.State != want {
			t.Fatalf("commit %v: the claim after waking: %v %v, want %v", commit, res.State, err, want)
		}
		if again != nil {
			again.Rollback(ctx)
		}
	}
	if ok, err := st.Wait(ctx, newKey(), newClaim(1)); ok || err != nil {
		t.Errorf("wait on a key nobody holds: %v %v, want false at once", ok, err)
	}
}

// TestMiddlewareWaitReplays: with WithWait, a repeat sent while the first
// request runs is answered with the first answer as soon as it commits,
// not 409.
func TestMiddlewareWaitReplays(t *testing.T) {
	pool := sharedPool(t)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	h := &payHandler{pay: pay, by: "h", block: make(chan struct{}), inserted: make(chan uint32, 1)}
	srv := server(t, st, h, 10*time.Second, middleware.WithWait(5*time.Second))
	key := newKey()
	first := make(chan answer, 1)
	go func() { first <- post(client, srv.URL, key, "X-Block", "1") }()
	<-h.inserted
	second := make(chan answer, 1)
	go func() { second <- post(client, srv.URL, key, "X-Block", "1") }()
	time.Sleep(50 * time.Millisecond) // let the repeat reach its wait
	close(h.block)
	a, b := <-first, <-second
	if a.status != 201 || b.status != 201 || !b.replayed || a.body != b.body {
		t.Fatalf("first %d %q, repeat %d (replayed %v) %q: want the repeat to replay the first", a.status, a.body, b.status, b.replayed, b.body)
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("%d runs", n)
	}
}

// TestMigrateInPlace: a table made by the previous version's schema
// (testdata/schema_earlier.sql: a lock_id column, no raw_digest, a claim
// function that does not return it) is refused by New, with a message that
// names the table and says how to bring it up to date; Migrate brings it up
// to date in place, keeping its rows, and twice changes nothing; the store
// then keeps and returns a record's raw digest.
func TestMigrateInPlace(t *testing.T) {
	pool := sharedPool(t)
	ctx := context.Background()
	table := newTable(t, pool)
	earlier, err := os.ReadFile("testdata/schema_earlier.sql")
	if err != nil {
		t.Fatal(err)
	}
	old := strings.ReplaceAll(string(earlier), postgres.DefaultTable, table)
	if _, err := pool.Exec(ctx, "DROP TABLE "+table+"; DROP FUNCTION "+table+"_claim; "+old); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+table+" (key, token, fingerprint, created_at, expires_at, status, body) VALUES ('kept', 't', $1, now(), now() + interval '1 hour', 201, 'old')", make([]byte, 32)); err != nil {
		t.Fatal(err)
	}
	_, err = postgres.New(ctx, pool, postgres.WithTable(table), postgres.WithSweepInterval(0))
	if err == nil || !strings.Contains(err.Error(), table) || !strings.Contains(err.Error(), "postgres.Migrate") || !strings.Contains(err.Error(), "postgres.Schema(") {
		t.Fatalf("New on the earlier table: %v, want an error naming the table, Migrate and Schema", err)
	}
	for range 2 {
		if err := postgres.Migrate(ctx, pool, postgres.WithTable(table)); err != nil {
			t.Fatal(err)
		}
	}
	var lockID bool
	if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'lock_id' AND NOT attisdropped)", table).Scan(&lockID); err != nil || lockID {
		t.Fatalf("lock_id still there: %v %v", lockID, err)
	}
	st, err := postgres.New(ctx, pool, postgres.WithTable(table), postgres.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if res, _, err := st.ClaimTx(ctx, "kept", newClaim(0)); err != nil || res.State != store.Completed || string(res.Record.Body) != "old" || res.Record.RawDigest != ([32]byte{}) {
		t.Fatalf("the earlier row: %+v %v", res, err)
	}
	key := newKey()
	tx := claimTx(t, st, key, newClaim(1), store.Claimed)
	rec := record("paid", 1)
	rec.RawDigest = [32]byte{7, 7, 7}
	if err := tx.Commit(ctx, rec, time.Minute); err != nil {
		t.Fatal(err)
	}
	res, _, err := st.ClaimTx(ctx, key, newClaim(1))
	if err != nil || res.State != store.Completed || res.Record.RawDigest != rec.RawDigest {
		t.Fatalf("the replay: %+v %v, want raw digest %x", res, err, rec.RawDigest[:3])
	}
	plain, pc := newKey(), newClaim(1)
	if _, err := st.Claim(ctx, plain, pc); err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, plain, pc.Token, rec, time.Minute); err != nil {
		t.Fatal(err)
	}
	if res, err := st.Claim(ctx, plain, newClaim(2)); err != nil || res.State != store.Completed || res.Record.RawDigest != rec.RawDigest {
		t.Fatalf("the plain replay: %+v %v", res, err)
	}
}

// TestNewConcurrently: instances that start together all pass New's check
// of the server's advisory locks (each draws a lock of its own: a fixed one
// made the others find it held, and refused a real server).
func TestNewConcurrently(t *testing.T) {
	pool := sharedPool(t)
	_, table := newStore(t, pool)
	errs := make(chan error, 16)
	for range 16 {
		go func() {
			st, err := postgres.New(context.Background(), pool, postgres.WithTable(table), postgres.WithSweepInterval(0))
			if err == nil {
				st.Close()
			}
			errs <- err
		}()
	}
	for range 16 {
		if err := <-errs; err != nil {
			t.Errorf("New: %v", err)
		}
	}
}

// TestStatementPoolerIsRefused: a pooler in statement mode refuses the
// transactions the store runs: New fails at start (its check of the
// server's locks is a transaction), rather than every request later.
func TestStatementPoolerIsRefused(t *testing.T) {
	b := pgtest.StartPgBouncer(t, pgtest.Shared(t), pgtest.PoolMode("statement"))
	table := newTable(t, sharedPool(t))
	pool := newPool(t, b.URL+"&default_query_exec_mode=exec", 4)
	st, err := postgres.New(context.Background(), pool, postgres.WithTable(table), postgres.WithSweepInterval(0))
	if err == nil {
		st.Close()
		t.Fatal("New through a pooler in statement mode succeeded")
	}
	t.Logf("New through a statement pooler: %v", err)
}
