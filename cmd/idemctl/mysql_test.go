package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/proctest"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/mysql"
)

// TestMySQLShowDeleteStats: show, stats and delete on a store/mysql table
// (MYSQL_URL; skipped without a server, failed under CI).
func TestMySQLShowDeleteStats(t *testing.T) {
	url := os.Getenv("MYSQL_URL")
	if url == "" {
		url = "mysql://root@127.0.0.1:3306/test"
	}
	dsn, err := mysql.DSN(url)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	if err := db.PingContext(ctx); err != nil {
		proctest.Unavailable(t, "MySQL at %s: %v", url, err)
	}
	var b [6]byte
	rand.Read(b[:])
	table := "idemkey_test_ctl_" + hex.EncodeToString(b[:])
	if err := mysql.Migrate(ctx, db, mysql.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS `" + table + "`") })
	st, err := mysql.New(ctx, db, mysql.WithTable(table), mysql.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	idem, err := middleware.New(st)
	if err != nil {
		t.Fatal(err)
	}
	handler := idem.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/pay_1")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(paymentBody))
	}))
	pay := func(user, key string) {
		t.Helper()
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, paymentRequest(user, key))
		if w.Code != http.StatusCreated {
			t.Fatalf("payment: %d %s", w.Code, w.Body)
		}
	}
	idemctl := func(stdin string, args ...string) (int, string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := run(ctx, append([]string{"--database-url", url, "--table", table}, args...), strings.NewReader(stdin), &out, &errOut)
		return code, out.String(), errOut.String()
	}

	pay("alice", "k1")
	key := store.KeyName("alice", "k1")
	code, out, errOut := idemctl("", "--json", "show", "--scope", "alice", "--key", "k1", "--body")
	if code != 0 {
		t.Fatalf("show: exit %d: %s", code, errOut)
	}
	e := decodeEntry(t, out)
	if !e.Found || e.State != "completed" || e.Key != key || e.Status != 201 || e.Body == nil || *e.Body != paymentBody ||
		e.Headers["Location"][0] != "/payments/pay_1" || e.TTLSeconds <= (23*time.Hour).Seconds() || e.Expired {
		t.Errorf("show: %+v", e)
	}
	code, out, _ = idemctl("", "show", "--digest", store.DigestOf(key))
	for _, want := range []string{"completed", "201 Created", "Location: /payments/pay_1"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("text output (exit %d) lacks %q:\n%s", code, want, out)
		}
	}

	// A claim in flight in a request's transaction: its owner is alive.
	_, tx, err := st.ClaimTx(ctx, store.KeyName("bob", "running"), store.Claim{Token: "t1", Fingerprint: [32]byte{0xab}, TTL: time.Minute})
	if err != nil || tx == nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	code, out, _ = idemctl("", "show", "--scope", "bob", "--key", "running")
	if code != 0 || !strings.Contains(out, "in flight") || !strings.Contains(out, "alive") || strings.Contains(out, "t1") {
		t.Errorf("the claim in flight (exit %d):\n%s", code, out)
	}

	code, out, _ = idemctl("", "--json", "stats")
	var sum mysqlSummary
	if err := json.Unmarshal([]byte(out), &sum); err != nil || code != 0 {
		t.Fatalf("stats: exit %d %v\n%s", code, err, out)
	}
	if sum.Rows != 1 || sum.Records != 1 || sum.InFlight != 0 || sum.TotalBytes == 0 || !strings.Contains(sum.Table, table) {
		t.Errorf("stats %+v", sum)
	}
	code, out, _ = idemctl("", "stats")
	if code != 0 || !strings.Contains(out, "records") || !strings.Contains(out, "size") {
		t.Errorf("stats as text (exit %d):\n%s", code, out)
	}

	code, out, _ = idemctl("n\n", "delete", "--scope", "alice", "--key", "k1")
	if code != 1 || !strings.Contains(out, "not deleted") {
		t.Errorf("declined delete: exit %d %s", code, out)
	}
	code, out, errOut = idemctl("y\n", "delete", "--scope", "alice", "--key", "k1")
	if code != 0 || !strings.Contains(out, "deleted") || !strings.Contains(errOut, "run the handler again") {
		t.Errorf("delete: exit %d %s %s", code, out, errOut)
	}
	if code, _, _ := idemctl("", "show", "--scope", "alice", "--key", "k1"); code != 1 {
		t.Errorf("show after delete: exit %d, want 1", code)
	}
	pay("alice", "k1")
}
