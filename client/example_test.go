package client_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/client"
)

// A POST gets one key, kept on every attempt: the server below is busy
// twice, then answers.
func Example() {
	var mu sync.Mutex
	var keys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		if len(keys) < 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ch_1"}`)
	}))
	defer srv.Close()

	t, err := client.New()
	if err != nil {
		log.Fatal(err)
	}
	c := &http.Client{Transport: t}

	var trace client.Trace
	ctx := client.WithTrace(context.Background(), &trace)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amount":100}`))
	resp, err := c.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)

	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("attempts:", trace.Attempts)
	fmt.Println("one key on every attempt:", keys[0] == keys[1] && keys[1] == keys[2] && keys[0] == trace.Key)
	// Output:
	// 201 {"id":"ch_1"}
	// attempts: 3
	// one key on every attempt: true
}

// Calls a handler makes while serving a keyed request send keys derived from
// the incoming key: the same on every retry of the incoming request,
// different for each named call.
func ExampleWithCallName() {
	var mu sync.Mutex
	sent := map[string][]string{}
	downstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sent[r.URL.Path] = append(sent[r.URL.Path], r.Header.Get("Idempotency-Key"))
		mu.Unlock()
	}))
	defer downstream.Close()

	t, err := client.New()
	if err != nil {
		log.Fatal(err)
	}
	c := &http.Client{Transport: t}

	// serve stands for a handler behind the idemkey middleware, which puts
	// the incoming key into the request context.
	serve := func(ctx context.Context) {
		for _, call := range []string{"charge", "receipt"} {
			ctx := client.WithCallName(ctx, call)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, downstream.URL+"/"+call, nil)
			resp, err := c.Do(req)
			if err != nil {
				log.Fatal(err)
			}
			resp.Body.Close()
		}
	}
	incoming := idemkey.Key{Scope: "user-42", Value: "order-7"}
	serve(idemkey.NewContext(context.Background(), incoming)) // the first try
	serve(idemkey.NewContext(context.Background(), incoming)) // the client retries it

	fmt.Println("charge key stable across retries:", sent["/charge"][0] == sent["/charge"][1])
	fmt.Println("charge and receipt keys differ:", sent["/charge"][0] != sent["/receipt"][0])
	fmt.Println("charge key is the derived one:", sent["/charge"][0] == incoming.Derive("charge"))
	// Output:
	// charge key stable across retries: true
	// charge and receipt keys differ: true
	// charge key is the derived one: true
}

// WithKey sends a key the caller already has, for example an operation id
// stored with the order.
func ExampleWithKey() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("server got key:", r.Header.Get("Idempotency-Key"))
	}))
	defer srv.Close()

	t, err := client.New()
	if err != nil {
		log.Fatal(err)
	}
	ctx := client.WithKey(context.Background(), "order-7-payment")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("{}"))
	resp, err := (&http.Client{Transport: t}).Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	// Output:
	// server got key: order-7-payment
}

// Replayed tells a fresh answer from the kept answer of an earlier request
// with the same key.
func ExampleReplayed() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	t, err := client.New()
	if err != nil {
		log.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	resp, err := (&http.Client{Transport: t}).Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, "replayed:", client.Replayed(resp))
	// Output:
	// 201 replayed: true
}

// WithoutAutoKey is for services that ignore the key header: a mutation the
// caller did not key is sent once, never retried.
func ExampleWithoutAutoKey() {
	var runs atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()

	t, err := client.New(client.WithoutAutoKey())
	if err != nil {
		log.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	resp, err := (&http.Client{Transport: t}).Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, "after", runs.Load(), "attempt")
	// Output:
	// 503 after 1 attempt
}
