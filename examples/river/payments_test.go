package riverexample

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/idemkey/idemkey/internal/pgtest"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/postgres"
)

// The helper process (the test binary again, running TestHelperProcess)
// serves payments on the schema named in its environment and stops in the
// handler after the job is inserted, until it is killed.
const (
	helperEnv = "IDEMKEY_RIVER_HELPER"
	schemaEnv = "IDEMKEY_RIVER_SCHEMA"
)

// database is a schema of the test's own on the shared PostgreSQL, with
// idemkey's table, River's tables and the payments table in it.
type database struct {
	url, schema string
	pool        *pgxpool.Pool
}

func newDatabase(t *testing.T) *database {
	t.Helper()
	url := pgtest.Shared(t)
	b := make([]byte, 6)
	rand.Read(b)
	schema := "idemriver_" + hex.EncodeToString(b)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), url)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Error(err)
		}
	})
	db := &database{url: url, schema: schema}
	db.pool = db.open(t)
	if err := migrate(ctx, db.pool, schema); err != nil {
		t.Fatal(err)
	}
	return db
}

// open returns a small pool on the database's schema.
func (db *database) open(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := openPool(db.url, db.schema)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func openPool(url, schema string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 24 // a shared server has few connections to spare
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	return pgxpool.NewWithConfig(context.Background(), cfg)
}

// migrate creates idemkey's, River's and the payments' tables.
func migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if err := postgres.Migrate(ctx, pool); err != nil {
		return err
	}
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema})
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return err
	}
	_, err = pool.Exec(ctx, SchemaSQL)
	return err
}

// count answers a count(*) query.
func (db *database) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (db *database) jobs(t *testing.T, reference string) int {
	return db.count(t, "SELECT count(*) FROM river_job WHERE kind = 'payment_receipt' AND args->>'reference' = $1", reference)
}

func (db *database) payments(t *testing.T, reference string) int {
	return db.count(t, "SELECT count(*) FROM payments WHERE reference = $1", reference)
}

// bank charges, or fails while fail is set.
type bank struct {
	mu   sync.Mutex
	fail bool
}

func (b *bank) Charge(context.Context, string, int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fail {
		return errors.New("declined by a timeout")
	}
	return nil
}

// newService is the payment service on pool: idemkey on the postgres
// store, the payment handler with an insert-only River client.
func newService(pool *pgxpool.Pool, schema string, b Bank, enqueued func(context.Context)) (http.Handler, func(), error) {
	ctx := context.Background()
	// The tests send up to 16 requests at once on a fresh pool, each
	// dialling its connection: on a busy machine that can take longer than
	// the store's 300 ms call budget, which would answer 503. What they
	// check is how many payments and jobs there are, not the budget.
	st, err := postgres.New(ctx, pool, postgres.WithCallTimeout(3*time.Second))
	if err != nil {
		return nil, nil, err
	}
	mw, err := middleware.New(st)
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	jobs, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: schema})
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	p := &Payments{Jobs: jobs, Bank: b, enqueued: enqueued}
	return mw.Required(middleware.Deadline(5 * time.Second))(p), func() { st.Close() }, nil
}

func (db *database) service(t *testing.T, b Bank) http.Handler {
	t.Helper()
	h, closeStore, err := newService(db.pool, db.schema, b, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeStore)
	return h
}

type answer struct {
	status   int
	body     string
	replayed bool
}

func pay(t *testing.T, h http.Handler, key, reference string) answer {
	t.Helper()
	body := fmt.Sprintf(`{"reference":%q,"amount":1000,"email":"alice@example.com"}`, reference)
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return answer{w.Code, w.Body.String(), w.Header().Get("Idempotent-Replayed") == "true"}
}

// mailer counts the receipts sent, per payment.
type mailer struct {
	mu   sync.Mutex
	sent map[int64]int
}

func (m *mailer) SendReceipt(_ context.Context, _ string, paymentID int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sent[paymentID]++
	return nil
}

// work runs River's workers on the database until want jobs completed,
// and returns what the mailer sent.
func (db *database) work(t *testing.T, want int) map[int64]int {
	t.Helper()
	m := &mailer{sent: map[int64]int{}}
	workers := river.NewWorkers()
	river.AddWorker(workers, &ReceiptWorker{Mailer: m})
	client, err := river.NewClient(riverpgxv5.New(db.pool), &river.Config{
		Schema:  db.schema,
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers: workers,
	})
	if err != nil {
		t.Fatal(err)
	}
	done, cancel := client.Subscribe(river.EventKindJobCompleted)
	defer cancel()
	ctx := context.Background()
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stop, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := client.Stop(stop); err != nil {
			t.Error(err)
		}
	}()
	timeout := time.After(30 * time.Second)
	for range want {
		select {
		case <-done:
		case <-timeout:
			t.Fatalf("fewer than %d jobs completed within 30 s", want)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sent
}

// TestHelperProcess is the child's side; it does nothing in a normal run.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("runs only as the helper process")
	}
	pool, err := openPool(os.Getenv("DATABASE_URL"), os.Getenv(schemaEnv))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	h, _, err := newService(pool, os.Getenv(schemaEnv), &bank{}, func(context.Context) {
		fmt.Println("enqueued")
		select {} // until killed
	})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	srv := httptest.NewServer(h)
	fmt.Println("listening", srv.URL)
	select {}
}

// A process killed in the middle of the request, after the job was
// inserted and before the answer, leaves neither the payment nor the job:
// they were in the request's transaction, which never committed. The
// retry runs the handler again and inserts the one job; a second retry is
// a replay and inserts none; River then sends one e-mail.
func TestKilledMidRequestEnqueuesOnce(t *testing.T) {
	db := newDatabase(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.v=false")
	cmd.Env = append(os.Environ(), helperEnv+"=1", schemaEnv+"="+db.schema, "DATABASE_URL="+db.url)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	lines := bufio.NewScanner(out)
	next := func() string {
		if !lines.Scan() {
			t.Fatalf("the helper process ended early: %v", lines.Err())
		}
		return lines.Text()
	}
	url, ok := strings.CutPrefix(next(), "listening ")
	if !ok {
		t.Fatal("the helper process did not start its server")
	}

	const key, reference = "k-killed", "order-killed"
	sent := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, url+"/payments",
			strings.NewReader(fmt.Sprintf(`{"reference":%q,"amount":1000,"email":"alice@example.com"}`, reference)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			err = fmt.Errorf("an answer, %d, from a process that was killed before it answered", resp.StatusCode)
		}
		sent <- err
	}()
	if got := next(); got != "enqueued" {
		t.Fatalf("helper said %q, want enqueued", got)
	}
	// The job is inserted, in a transaction nobody else sees yet.
	if n := db.jobs(t, reference); n != 0 {
		t.Errorf("%d jobs visible before the commit, want 0", n)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	<-sent // the client lost its connection: it will retry

	h := db.service(t, &bank{})
	var retry answer
	for deadline := time.Now().Add(20 * time.Second); ; {
		// The claim of a killed owner is taken over as soon as the
		// server has ended its transaction.
		retry = pay(t, h, key, reference)
		if retry.status != http.StatusConflict || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if retry.status != http.StatusCreated || retry.replayed {
		t.Fatalf("retry after the kill: %d %s replayed=%v, want 201 from a new run", retry.status, retry.body, retry.replayed)
	}
	again := pay(t, h, key, reference)
	if again.status != http.StatusCreated || !again.replayed || again.body != retry.body {
		t.Errorf("second retry: %d %s replayed=%v, want the kept 201 replayed", again.status, again.body, again.replayed)
	}
	if n := db.payments(t, reference); n != 1 {
		t.Errorf("%d payments, want 1", n)
	}
	if n := db.jobs(t, reference); n != 1 {
		t.Fatalf("%d receipt jobs for the key, want 1", n)
	}
	sentMail := db.work(t, 1)
	if len(sentMail) != 1 {
		t.Errorf("receipts sent: %v, want one payment's", sentMail)
	}
	for id, n := range sentMail {
		if n != 1 {
			t.Errorf("payment %d: %d receipts sent, want 1", id, n)
		}
	}
}

// A payment that rolls back (the bank failed: 502) takes its job with it:
// no e-mail for a payment that was not made. The retry makes the payment
// and its one job.
func TestRolledBackPaymentEnqueuesNothing(t *testing.T) {
	db := newDatabase(t)
	b := &bank{fail: true}
	h := db.service(t, b)
	const key, reference = "k-rollback", "order-rollback"
	if a := pay(t, h, key, reference); a.status != http.StatusBadGateway {
		t.Fatalf("with a failing bank: %d %s, want 502", a.status, a.body)
	}
	if p, j := db.payments(t, reference), db.jobs(t, reference); p != 0 || j != 0 {
		t.Fatalf("after the rollback: %d payments, %d jobs; want none", p, j)
	}
	b.mu.Lock()
	b.fail = false
	b.mu.Unlock()
	if a := pay(t, h, key, reference); a.status != http.StatusCreated || a.replayed {
		t.Fatalf("retry: %d %s replayed=%v, want 201 from a new run", a.status, a.body, a.replayed)
	}
	if p, j := db.payments(t, reference), db.jobs(t, reference); p != 1 || j != 1 {
		t.Errorf("after the retry: %d payments, %d jobs; want 1 and 1", p, j)
	}
}

// Retries that arrive together, while the first still runs, insert one
// job between them.
func TestConcurrentRetriesEnqueueOnce(t *testing.T) {
	db := newDatabase(t)
	h := db.service(t, &bank{})
	const key, reference = "k-together", "order-together"
	var wg sync.WaitGroup
	answers := make(chan answer, 16)
	for range 16 {
		wg.Go(func() { answers <- pay(t, h, key, reference) })
	}
	wg.Wait()
	close(answers)
	created := 0
	for a := range answers {
		switch {
		case a.status == http.StatusCreated:
			created++
		case a.status == http.StatusConflict:
		default:
			t.Errorf("answer %d %s, want 201 or 409", a.status, a.body)
		}
	}
	if created == 0 {
		t.Error("no request made the payment")
	}
	if p, j := db.payments(t, reference), db.jobs(t, reference); p != 1 || j != 1 {
		t.Errorf("%d payments, %d jobs; want 1 and 1", p, j)
	}
}
