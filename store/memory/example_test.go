package memory_test

import (
	"context"
	"errors"
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

// A full store refuses claims on new keys, and keeps answering for the keys
// it holds. Stats tells how near the bounds it runs.
func ExampleStore_Stats() {
	s, err := memory.New(memory.WithMaxRecords(2))
	if err != nil {
		panic(err)
	}
	defer s.Close()
	ctx := context.Background()
	claim := func(key, token string) (store.Result, error) {
		return s.Claim(ctx, store.KeyName("user-42", key), store.Claim{Token: token, TTL: 35 * time.Second})
	}

	claim("order-1", "token-1")
	s.Complete(ctx, store.KeyName("user-42", "order-1"), "token-1", &store.Record{Status: http.StatusCreated}, 24*time.Hour)
	claim("order-2", "token-2")
	st, _ := s.Stats(ctx)
	fmt.Println("entries:", st.Records+st.InFlight)

	_, err = claim("order-3", "token-3")
	fmt.Println("a new key:", errors.Is(err, store.ErrFull))
	res, _ := claim("order-1", "token-4")
	fmt.Println("a held key:", res.State)
	// Output:
	// entries: 2
	// a new key: true
	// a held key: completed
}
