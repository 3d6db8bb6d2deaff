package memory_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// The life of one key: the first request claims it and keeps its response;
// a retry finds the response kept.
func Example() {
	s, err := memory.New(memory.WithMaxRecords(10_000))
	if err != nil {
		panic(err)
	}
	defer s.Close()
	ctx := context.Background()
	key := store.KeyName("user-42", "order-7f3a")
	fp := [32]byte{1} // the request's fingerprint

	res, _ := s.Claim(ctx, key, store.Claim{Token: "token-1", Fingerprint: fp, TTL: 35 * time.Second})
	fmt.Println("first try:", res.State)

	// A retry that arrives while the first request runs.
	res, _ = s.Claim(ctx, key, store.Claim{Token: "token-2", Fingerprint: fp, TTL: 35 * time.Second})
	fmt.Println("retry while running:", res.State)

	rec := &store.Record{
		Status:      http.StatusCreated,
		Header:      http.Header{"Content-Type": {"application/json"}},
		Body:        []byte(`{"id":"ord_1"}`),
		Fingerprint: fp,
	}
	if err := s.Complete(ctx, key, "token-1", rec, 24*time.Hour); err != nil {
		fmt.Println(err)
	}

	res, _ = s.Claim(ctx, key, store.Claim{Token: "token-3", Fingerprint: fp, TTL: 35 * time.Second})
	fmt.Println("retry after:", res.State, res.Record.Status, string(res.Record.Body))
	// Output:
	// first try: claimed
	// retry while running: in flight
	// retry after: completed 201 {"id":"ord_1"}
}
