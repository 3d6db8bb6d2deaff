package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/pgtest"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// pgService is a payment endpoint behind the real middleware on a
// PostgreSQL store, on a table of its own in the shared database.
type pgService struct {
	url, table string
	pool       *pgxpool.Pool
	st         *postgres.Store
	handler    http.Handler
}

func newPGService(t *testing.T) *pgService {
	t.Helper()
	url := pgtest.Shared(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var b [6]byte
	rand.Read(b[:])
	table := "idemkey_test_ctl_" + hex.EncodeToString(b[:])
	if err := postgres.Migrate(ctx, pool, postgres.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize()+"; DROP FUNCTION IF EXISTS "+pgx.Identifier{table + "_claim"}.Sanitize())
	})
	st, err := postgres.New(ctx, pool, postgres.WithTable(table), postgres.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	idem, err := middleware.New(st)
	if err != nil {
		t.Fatal(err)
	}
	s := &pgService{url: url, table: table, pool: pool, st: st}
	s.handler = idem.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/pay_1")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(paymentBody))
	}))
	return s
}

func (s *pgService) pay(t *testing.T, user, key string) {
	t.Helper()
	w := httptest.NewRecorder()
	s.handler.ServeHTTP(w, paymentRequest(user, key))
	if w.Code != http.StatusCreated {
		t.Fatalf("payment: %d %s", w.Code, w.Body)
	}
}

func (s *pgService) idemctl(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), append([]string{"--database-url", s.url, "--table", s.table}, args...), strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestPostgresShowDeleteStats(t *testing.T) {
	s := newPGService(t)
	s.pay(t, "alice", "k1")
	key := store.KeyName("alice", "k1")

	code, out, errOut := s.idemctl(t, "", "--json", "show", "--scope", "alice", "--key", "k1", "--body")
	if code != 0 {
		t.Fatalf("show: exit %d: %s", code, errOut)
	}
	e := decodeEntry(t, out)
	if !e.Found || e.State != "completed" || e.Key != key || e.Status != 201 || e.Body == nil || *e.Body != paymentBody ||
		e.Headers["Location"][0] != "/payments/pay_1" || e.TTLSeconds <= (23*time.Hour).Seconds() || e.ValueBytes <= len(paymentBody) || e.Expired {
		t.Errorf("show: %+v", e)
	}
	code, out, _ = s.idemctl(t, "", "show", "--digest", store.DigestOf(key))
	for _, want := range []string{"completed", "201 Created", "Location: /payments/pay_1", "in the table"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("text output (exit %d) lacks %q:\n%s", code, want, out)
		}
	}

	// A claim in flight in a request's transaction: its owner is alive.
	running := store.KeyName("bob", "running")
	_, tx, err := s.st.ClaimTx(context.Background(), running, store.Claim{Token: "t1", Fingerprint: [32]byte{0xab}, TTL: time.Minute})
	if err != nil || tx == nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	code, out, _ = s.idemctl(t, "", "show", "--scope", "bob", "--key", "running")
	if code != 0 || !strings.Contains(out, "in flight") || !strings.Contains(out, "alive") || strings.Contains(out, "t1") {
		t.Errorf("the claim in flight (exit %d):\n%s", code, out)
	}

	code, out, _ = s.idemctl(t, "", "--json", "stats")
	var sum pgSummary
	if err := json.Unmarshal([]byte(out), &sum); err != nil || code != 0 {
		t.Fatalf("stats: exit %d %v\n%s", code, err, out)
	}
	// The claim in the request's transaction is no row until it commits.
	if sum.Rows != 1 || sum.Records != 1 || sum.InFlight != 0 || sum.Transactional != 0 || sum.TotalBytes == 0 || sum.BytesPerRow == 0 {
		t.Errorf("stats %+v", sum)
	}
	code, out, _ = s.idemctl(t, "", "stats")
	if code != 0 || !strings.Contains(out, "records") || !strings.Contains(out, "dead rows") {
		t.Errorf("stats as text (exit %d):\n%s", code, out)
	}

	// Delete asks, and a no keeps the row.
	code, out, _ = s.idemctl(t, "n\n", "delete", "--scope", "alice", "--key", "k1")
	if code != 1 || !strings.Contains(out, "not deleted") {
		t.Errorf("declined delete: exit %d %s", code, out)
	}
	code, out, errOut = s.idemctl(t, "y\n", "delete", "--scope", "alice", "--key", "k1")
	if code != 0 || !strings.Contains(out, "deleted") || !strings.Contains(errOut, "run the handler again") {
		t.Errorf("delete: exit %d %s %s", code, out, errOut)
	}
	if code, _, _ := s.idemctl(t, "", "show", "--scope", "alice", "--key", "k1"); code != 1 {
		t.Errorf("show after delete: exit %d, want 1", code)
	}
	// The key runs again.
	s.pay(t, "alice", "k1")
}

func TestPostgresChooseStore(t *testing.T) {
	for _, tc := range []struct {
		redis, db, envDB, envRedis string
		cluster                    bool
		want                       string
		usage                      bool
	}{
		{db: "postgres://a", want: "postgres://a"},
		{redis: "redis://r", envDB: "postgres://b", want: ""},
		{envDB: "postgres://b", want: "postgres://b"},
		{envDB: "postgres://b", envRedis: "redis://r", usage: true},
		{db: "postgres://a", redis: "redis://r", usage: true},
		{db: "postgres://a", cluster: true, usage: true},
		{envRedis: "redis://r", want: ""},
	} {
		t.Setenv("DATABASE_URL", tc.envDB)
		t.Setenv("REDIS_URL", tc.envRedis)
		got, err := chooseStore(tc.redis, tc.db, tc.cluster)
		if tc.usage != (err != nil) || got != tc.want {
			t.Errorf("%+v: %q %v", tc, got, err)
		}
	}
}

// idemctl's commands do not print the store's warning about small pools,
// which speaks to a service sizing its pool (each request holds a
// connection for its handler's run), not to a command that uses two.
func TestPostgresNoPoolWarning(t *testing.T) {
	svc := newPGService(t)
	var logged bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"--database-url", svc.url, "--table", svc.table, "stats"}, strings.NewReader(""), &out, &errOut)
	if code != 0 {
		t.Fatalf("stats: exit %d: %s", code, errOut.String())
	}
	if strings.Contains(logged.String(), "pool is small") || strings.Contains(errOut.String(), "pool is small") {
		t.Errorf("idemctl printed the service's pool warning:\n%s%s", logged.String(), errOut.String())
	}
}
