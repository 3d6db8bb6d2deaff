package postgres_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/postgres"
)

// sessionHandler inserts a payment for the request's key through the
// request's transaction (pgx's or database/sql's), after running the
// statement in the X-Session header on it first, when there is one: a
// handler that changes its session inside the request's transaction.
// The payments table is named with its schema, so that the handler's
// own search_path does not matter to it.
type sessionHandler struct {
	table string // the payments table, schema-qualified and quoted
	sql   bool   // through SQLTx rather than Tx
	runs  atomic.Int64
}

func (h *sessionHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.runs.Add(1)
	ctx := r.Context()
	key, _ := idemkey.FromContext(ctx)
	var id int64
	var err error
	set := r.Header.Get("X-Session")
	if h.sql {
		tx := postgres.SQLTx(ctx)
		if set != "" {
			if _, err := tx.ExecContext(ctx, set); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		err = tx.QueryRowContext(ctx, "INSERT INTO "+h.table+" (key, made_by) VALUES ($1, 'h') RETURNING id", key.Value).Scan(&id)
	} else {
		tx := postgres.Tx(ctx)
		if set != "" {
			if _, err := tx.Exec(ctx, set); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		err = tx.QueryRow(ctx, "INSERT INTO "+h.table+" (key, made_by) VALUES ($1, 'h') RETURNING id", key.Value).Scan(&id)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d}`, id)
}

// sessionServer serves a sessionHandler behind the middleware on a store
// of one connection (pgx's face, or database/sql's), so that every request
// runs on the connection the one before it used. It returns the server,
// the handler and the payments table's unqualified name.
func sessionServer(t *testing.T, viaSQL bool) (*httptest.Server, *sessionHandler, payments) {
	t.Helper()
	shared := sharedPool(t)
	var st *postgres.Store
	var table string
	if viaSQL {
		db := sqlDB(t)
		db.SetMaxOpenConns(1)
		st, table = newSQLStore(t, db)
	} else {
		st, table = newStore(t, newPool(t, sharedURL(t), 1))
	}
	pay := newPayments(t, shared, table)
	h := &sessionHandler{table: "public." + pay.name, sql: viaSQL}
	m, err := middleware.New(st)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Required(middleware.Deadline(10 * time.Second))(h))
	t.Cleanup(srv.Close)
	return srv, h, pay
}

// TestSessionChangedByHandler: a handler changes its session inside the
// request's transaction (a session SET, which outlives the transaction on
// the pooled connection), on a pool of one, so the next requests run on
// that connection. Every key still runs once, a repeat replays the first
// answer, and a key the handler's change came with is replayed too.
func TestSessionChangedByHandler(t *testing.T) {
	changes := []string{
		"SET SESSION statement_timeout = 200",
		"SET SESSION idle_in_transaction_session_timeout = 200",
		"SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ UNCOMMITTED",
		"SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
		"SET SESSION lock_timeout = 1",
		"SET SESSION synchronous_commit = off",
		"SET SESSION ROLE postgres",
		"SET SESSION AUTHORIZATION DEFAULT",
	}
	for _, face := range []string{"pgx", "sql"} {
		t.Run(face, func(t *testing.T) {
			srv, h, pay := sessionServer(t, face == "sql")
			before := rand.Text()
			if a := post(client, srv.URL, before); a.status != 201 || a.replayed {
				t.Fatalf("a first request: %d replayed=%v %s", a.status, a.replayed, a.body)
			}
			for _, set := range changes {
				key := rand.Text()
				first := post(client, srv.URL, key, "X-Session", set)
				if first.status != 201 || first.replayed {
					t.Fatalf("%s: the changing request: %d %s", set, first.status, first.body)
				}
				// The next requests run on the changed connection.
				for _, k := range []string{key, before} {
					if a := post(client, srv.URL, k); a.status != 201 || !a.replayed {
						t.Fatalf("%s: a repeat: %d replayed=%v %s, want a replay", set, a.status, a.replayed, a.body)
					}
				}
				fresh := rand.Text()
				if a := post(client, srv.URL, fresh); a.status != 201 || a.replayed {
					t.Fatalf("%s: a new key after the change: %d replayed=%v %s", set, a.status, a.replayed, a.body)
				}
				if a := post(client, srv.URL, fresh); a.status != 201 || !a.replayed {
					t.Fatalf("%s: its repeat: %d replayed=%v %s", set, a.status, a.replayed, a.body)
				}
				for _, k := range []string{key, before, fresh} {
					if n := pay.count(t, k); n != 1 {
						t.Fatalf("%s: %d payments for a key, want 1", set, n)
					}
				}
			}
			t.Logf("%d runs for %d keys, each replayed", h.runs.Load(), 1+2*len(changes))
		})
	}
}

// TestSessionSearchPath: a handler sets its search_path inside the
// request's transaction, for the session or for the transaction only, to
// a schema without the store's table, or to a tenant's schema that has a
// table of the store's name (a service with one schema per tenant). The
// store names its table as its search_path did at New, unqualified, so the
// keep in that transaction does not reach the store's table: the request
// answers 503 and its writes roll back (with the SET: the connection's
// session is as it was). No key runs twice and a repeat of an earlier key
// still replays.
func TestSessionSearchPath(t *testing.T) {
	for _, face := range []string{"pgx", "sql"} {
		t.Run(face, func(t *testing.T) {
			srv, h, pay := sessionServer(t, face == "sql")
			shared := sharedPool(t)
			schema := "idemkey_tenant_" + strings.ToLower(rand.Text()[:8])
			ctx := context.Background()
			if _, err := shared.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { shared.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE") })
			before := rand.Text()
			if a := post(client, srv.URL, before); a.status != 201 || a.replayed {
				t.Fatalf("a first request: %d %s", a.status, a.body)
			}
			table := strings.TrimSuffix(strings.Trim(pay.name, `"`), "_payments")
			for i, set := range []string{
				"SET SESSION search_path = pg_catalog",
				"SET LOCAL search_path = " + schema,
				"SET SESSION search_path = " + schema,
				"shadow",
				"SET LOCAL search_path = " + schema,
				"SET SESSION search_path = " + schema,
			} {
				if set == "shadow" {
					if err := postgres.Migrate(ctx, shared, postgres.WithTable(schema+"."+table)); err != nil {
						t.Fatal(err)
					}
					continue
				}
				key := rand.Text()
				for try := range 2 {
					a := post(client, srv.URL, key, "X-Session", set)
					t.Logf("%d %s, try %d: %d", i, set, try, a.status)
					if a.status != http.StatusServiceUnavailable {
						t.Fatalf("%s: %d replayed=%v %s, want 503", set, a.status, a.replayed, a.body)
					}
					if n := pay.count(t, key); n != 0 {
						t.Fatalf("%s: %d payments after a 503, want 0", set, n)
					}
				}
				if a := post(client, srv.URL, before); a.status != 201 || !a.replayed {
					t.Fatalf("%s: a repeat of an earlier key: %d replayed=%v %s, want a replay", set, a.status, a.replayed, a.body)
				}
				if a := post(client, srv.URL, key); a.status != 201 || a.replayed {
					t.Fatalf("%s: the key without the change: %d replayed=%v %s, want a first run", set, a.status, a.replayed, a.body)
				}
				if a := post(client, srv.URL, key); a.status != 201 || !a.replayed {
					t.Fatalf("%s: its repeat: %d replayed=%v", set, a.status, a.replayed)
				}
				for _, k := range []string{before, key} {
					if n := pay.count(t, k); n != 1 {
						t.Fatalf("%s: %d payments for a key, want 1", set, n)
					}
				}
			}
			t.Logf("%d runs", h.runs.Load())
		})
	}
}
