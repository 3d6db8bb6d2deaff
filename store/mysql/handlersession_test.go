package mysql_test

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/store/mysql"
)

// sessionHandler runs the statement in the X-Session header on the
// request's transaction, then inserts a payment for the request's key and
// answers 201 (or X-Status): a handler that changes its session inside
// the request's transaction.
type sessionHandler struct {
	pay  payments
	runs atomic.Int64
	// afterInsert, when not nil, is called after the insert.
	afterInsert func(*http.Request)
}

func (h *sessionHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.runs.Add(1)
	ctx := r.Context()
	key, _ := idemkey.FromContext(ctx)
	tx := mysql.Tx(ctx)
	if set := r.Header.Get("X-Session"); set != "" {
		if _, err := tx.ExecContext(ctx, set); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	res, err := tx.ExecContext(ctx, "INSERT INTO `"+h.pay.name+"` (k, made_by) VALUES (?, 'h')", key.Value)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	id, _ := res.LastInsertId()
	if h.afterInsert != nil {
		h.afterInsert(r)
	}
	status := http.StatusCreated
	if s := r.Header.Get("X-Status"); s != "" {
		fmt.Sscan(s, &status)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"id":%d}`, id)
}

// TestSessionChangedByHandler: a handler changes its session inside the
// request's transaction, on a pool of two (the least the store takes), so the next requests run on
// the session it changed. Every key still runs once, a repeat replays the
// first answer, and a 5xx after the change still rolls back.
func TestSessionChangedByHandler(t *testing.T) {
	db := openDB(t, sharedURL(), 2)
	st, _ := newStore(t, db)
	var isolationVar string
	if err := db.QueryRow("SELECT IF(VERSION() LIKE '%MariaDB%', 'tx_isolation', 'transaction_isolation')").Scan(&isolationVar); err != nil {
		t.Fatal(err)
	}
	h := &sessionHandler{pay: newPayments(t, sharedDB(t))}
	srv := server(t, st, h, 10*time.Second)
	before := rand.Text()
	if a := post(srv.URL, before, payBody); a.status != 201 || a.replayed {
		t.Fatalf("a first request: %d %s", a.status, a.body)
	}
	for _, set := range []string{
		"SET SESSION " + isolationVar + " = 'READ-UNCOMMITTED'",
		"SET SESSION " + isolationVar + " = 'SERIALIZABLE'",
		"SET SESSION sql_mode = 'ANSI_QUOTES,PIPES_AS_CONCAT,NO_BACKSLASH_ESCAPES,ANSI'",
		"SET SESSION sql_mode = ''",
		"SET SESSION time_zone = '+11:00'",
		"SET SESSION innodb_lock_wait_timeout = 1",
		"SET SESSION lock_wait_timeout = 1",
		"SET SESSION max_statement_time = 0.5",
		"SET SESSION character_set_client = 'latin1'",
		"SET SESSION sql_mode = DEFAULT",
		"SET SESSION time_zone = DEFAULT",
		"SET autocommit = 1",
	} {
		key := rand.Text()
		if a := post(srv.URL, key, payBody, "X-Session", set); a.status != 201 || a.replayed {
			t.Fatalf("%s: the changing request: %d %s", set, a.status, a.body)
		}
		for _, k := range []string{key, before} {
			if a := post(srv.URL, k, payBody); a.status != 201 || !a.replayed {
				t.Fatalf("%s: a repeat: %d replayed=%v %s, want a replay", set, a.status, a.replayed, a.body)
			}
		}
		fresh := rand.Text()
		if a := post(srv.URL, fresh, payBody); a.status != 201 || a.replayed {
			t.Fatalf("%s: a new key: %d replayed=%v %s", set, a.status, a.replayed, a.body)
		}
		if a := post(srv.URL, fresh, payBody); a.status != 201 || !a.replayed {
			t.Fatalf("%s: its repeat: %d replayed=%v %s", set, a.status, a.replayed, a.body)
		}
		failed := rand.Text()
		if a := post(srv.URL, failed, payBody, "X-Status", "500"); a.status != 500 {
			t.Fatalf("%s: a 500: %d %s", set, a.status, a.body)
		}
		for k, want := range map[string]int{key: 1, before: 1, fresh: 1, failed: 0} {
			if n := h.pay.count(t, k); n != want {
				t.Fatalf("%s: %d payments for a key, want %d", set, n, want)
			}
		}
	}
	t.Logf("%d runs", h.runs.Load())
}
