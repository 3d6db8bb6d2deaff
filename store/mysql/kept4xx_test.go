package mysql_test

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestKept4xxRace: the owner answers a 422, kept with its writes undone
// (the default): its transaction rolls back whole and the record is kept
// in a statement of its own, fenced by the key's named lock. Repeats race
// it from the moment the owner is let go, through the rollback and the
// keep; a repeat that runs answers 201 with a payment. Each round, either
// the owner's 422 is kept (the repeats get 409 or the 422 replayed,
// nothing runs again, nothing is paid), or the owner's client gets 503
// and at most one repeat runs; no repeat is told its key was used for
// another request.
func TestKept4xxRace(t *testing.T) {
	db := sharedDB(t)
	st, _ := newStore(t, db)
	h := &payHandler{pay: newPayments(t, db), inserted: make(chan int64, 1)}
	srv := server(t, st, h, 10*time.Second)
	kept, lost := 0, 0
	for round := range 15 {
		h.block = make(chan struct{})
		h.runs.Store(0)
		key := rand.Text()
		owner := make(chan answer, 1)
		go func() { owner <- post(srv.URL, key, payBody, "X-Block", "1", "X-Status", "422") }()
		<-h.inserted
		const n = 8
		answers := make([][]answer, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				for range 200 {
					a := post(srv.URL, key, payBody)
					answers[i] = append(answers[i], a)
					if a.status != http.StatusConflict {
						return
					}
				}
			})
		}
		close(start)
		time.Sleep(time.Duration(round%5) * time.Millisecond)
		close(h.block)
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
					t.Errorf("round %d: a repeat got %d %s", round, a.status, a.body)
				}
			}
		}
		runs, paid := h.runs.Load(), h.pay.count(t, key)
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
}
