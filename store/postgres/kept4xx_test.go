package postgres_test

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/postgres"
)

// gateHandler inserts a payment for the request's key through the
// request's transaction (pgx's or database/sql's) and answers 201, or the
// status in X-Status; with X-Block it waits for gate to be closed first,
// after its insert. It counts its runs.
type gateHandler struct {
	table string // the payments table, quoted
	sql   bool
	gate  chan struct{}
	ran   chan struct{} // a blocked run's insert is done
	runs  atomic.Int64
	// afterInsert, when not nil, is called after the insert.
	afterInsert func(*http.Request)
}

func (h *gateHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.runs.Add(1)
	ctx := r.Context()
	key, _ := idemkey.FromContext(ctx)
	var err error
	if h.sql {
		_, err = postgres.SQLTx(ctx).ExecContext(ctx, "INSERT INTO "+h.table+" (key, made_by) VALUES ($1, 'h')", key.Value)
	} else {
		_, err = postgres.Tx(ctx).Exec(ctx, "INSERT INTO "+h.table+" (key, made_by) VALUES ($1, 'h')", key.Value)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if h.afterInsert != nil {
		h.afterInsert(r)
	}
	if r.Header.Get("X-Block") != "" {
		h.ran <- struct{}{}
		<-h.gate
	}
	status := http.StatusCreated
	if s := r.Header.Get("X-Status"); s != "" {
		fmt.Sscan(s, &status)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"status":%d}`, status)
}

// TestKept4xxRace: the owner answers a 422, kept with its writes undone
// (the default): its transaction rolls back, and the record is kept in a
// fenced statement of its own. Repeats race it from the moment the owner
// is let go, again and again, through the rollback and the keep, and a
// repeat that runs answers 201 with a payment. Each round, either the
// owner's 422 is kept (its client gets it, the repeats get 409 or the 422
// replayed, nothing runs again and nothing is paid), or the owner's client
// gets 503 and at most one repeat runs (its 201, once paid, is what the
// others replay). No repeat is ever told that its key was used for
// another request (a 422 of the middleware's own): before the keep took
// the key's fingerprint lock as the claim does, a repeat that came
// between the rollback and the keep got the fingerprint's lock but not
// the key's, and read that as another request's.
func TestKept4xxRace(t *testing.T) {
	for _, face := range []string{"pgx", "sql"} {
		t.Run(face, func(t *testing.T) {
			var st *postgres.Store
			var table string
			if face == "sql" {
				st, table = newSQLStore(t, sqlDB(t))
			} else {
				st, table = newStore(t, sharedPool(t))
			}
			pay := newPayments(t, sharedPool(t), table)
			h := &gateHandler{table: pay.name, sql: face == "sql", ran: make(chan struct{}, 1)}
			m, err := middleware.New(st)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(m.Required(middleware.Deadline(10 * time.Second))(h))
			t.Cleanup(srv.Close)
			kept, lost := 0, 0
			for round := range 15 {
				h.gate = make(chan struct{})
				h.runs.Store(0)
				key := rand.Text()
				owner := make(chan answer, 1)
				go func() { owner <- post(client, srv.URL, key, "X-Block", "1", "X-Status", "422") }()
				<-h.ran
				const n = 8
				answers := make([][]answer, n)
				var wg sync.WaitGroup
				start := make(chan struct{})
				for i := range n {
					wg.Go(func() {
						<-start
						for range 200 {
							a := post(client, srv.URL, key)
							answers[i] = append(answers[i], a)
							if a.status != http.StatusConflict {
								return
							}
						}
					})
				}
				close(start)
				time.Sleep(time.Duration(round%5) * time.Millisecond)
				close(h.gate)
				first := <-owner
				wg.Wait()
				count := map[string]int{}
				for _, as := range answers {
					for _, a := range as {
						if a.err != nil {
							t.Fatal(a.err)
						}
						count[fmt.Sprint(a.status, map[bool]string{true: " replayed"}[a.replayed])]++
						if a.status == http.StatusUnprocessableEntity && !a.replayed {
							// The same request told its key was
							// used with another.
							t.Errorf("round %d: a repeat got %d %s", round, a.status, a.body)
						}
					}
				}
				runs, paid := h.runs.Load(), pay.count(t, key)
				t.Logf("round %d: owner %d, repeats %v, runs %d, payments %d", round, first.status, count, runs, paid)
				switch first.status {
				case http.StatusUnprocessableEntity:
					kept++
					if runs != 1 || paid != 0 || count["201"] != 0 || count["201 replayed"] != 0 {
						t.Fatalf("round %d: the owner's 422 was delivered, but runs %d, payments %d, repeats %v", round, runs, paid, count)
					}
				case http.StatusServiceUnavailable:
					lost++
					if runs > 2 || paid > 1 || count["201"] > 1 || count["422 replayed"] != 0 {
						t.Fatalf("round %d: the owner got 503; runs %d, payments %d, repeats %v", round, runs, paid, count)
					}
				default:
					t.Fatalf("round %d: the owner got %d %s", round, first.status, first.body)
				}
			}
			t.Logf("owner's 422 kept in %d rounds, lost to a repeat in %d", kept, lost)
		})
	}
}
