package middleware_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/scope"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
)

// demoAuth stands in for a service's authentication middleware: it puts the
// verified caller into the context, where the default scope finds it.
func demoAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if user, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			r = r.WithContext(scope.NewContext(r.Context(), user))
		}
		next.ServeHTTP(w, r)
	})
}

func send(h http.Handler, key, body string) {
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer alice")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var code string
	if w.Header().Get("Content-Type") == "application/problem+json" {
		code = " " + strings.Split(strings.Split(w.Body.String(), `"code":"`)[1], `"`)[0]
	}
	fmt.Printf("%d replayed=%q%s\n", w.Code, w.Header().Get("Idempotent-Replayed"), code)
}

func Example_serveMux() {
	st, err := memory.New()
	if err != nil {
		panic(err)
	}
	defer st.Close()
	idem, err := middleware.New(st)
	if err != nil {
		panic(err)
	}

	payments := 0
	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		payments++
		w.WriteHeader(http.StatusCreated)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.Required(middleware.Deadline(10*time.Second))(create))
	h := demoAuth(mux)

	send(h, "k-1", `{"amount":10}`)
	send(h, "k-1", `{"amount":10}`)
	fmt.Println("payments made:", payments)
	// Output:
	// 201 replayed=""
	// 201 replayed="true"
	// payments made: 1
}

// A handler reads the key of the request it serves from its context, with
// idemkey.FromContext, and derives the keys of its own outbound calls.
func Example_keyFromContext() {
	st, err := memory.New()
	if err != nil {
		panic(err)
	}
	defer st.Close()
	idem, _ := middleware.New(st)
	h := idem.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, _ := idemkey.FromContext(r.Context())
		// A key for the call to the bank, the same on every retry of this
		// request, different for another call name.
		fmt.Println(k.Scope, k.Value, len(k.Derive("bank.transfer")))
	}))
	r := httptest.NewRequest(http.MethodPost, "/transfers", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "t-1")
	h.ServeHTTP(httptest.NewRecorder(), r)
	// Output:
	// anonymous t-1 64
}

// A repeat that arrives while the first request still runs waits for its
// answer instead of getting 409.
func ExampleWithWait() {
	st, err := memory.New()
	if err != nil {
		panic(err)
	}
	defer st.Close()
	idem, err := middleware.New(st, middleware.WithWait(5*time.Second))
	if err != nil {
		panic(err)
	}
	started, proceed := make(chan struct{}), make(chan struct{})
	h := demoAuth(idem.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-proceed // a slow transfer
		w.WriteHeader(http.StatusCreated)
	})))
	go func() {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":10}`))
		r.Header.Set("Authorization", "Bearer alice")
		r.Header.Set("Idempotency-Key", "t-1")
		h.ServeHTTP(httptest.NewRecorder(), r) // the first request
	}()
	<-started
	time.AfterFunc(50*time.Millisecond, func() { close(proceed) })
	send(h, "t-1", `{"amount":10}`) // waits, then replays
	// Output:
	// 201 replayed="true"
}

// unreachable stands for a store that cannot be reached.
type unreachable struct{ store.Store }

func (unreachable) Claim(context.Context, string, store.Claim) (store.Result, error) {
	return store.Result{}, store.ErrUnreachable
}

func (unreachable) Release(context.Context, string, string) error { return store.ErrUnreachable }

// By default a request whose key cannot be claimed is refused with 503 and
// its handler does not run; WithFailOpen runs it without idempotency.
func ExampleWithFailOpen() {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	closed, _ := middleware.New(unreachable{})
	open, _ := middleware.New(unreachable{}, middleware.WithFailOpen())
	send(closed.Required()(handler), "k-1", `{}`)
	send(open.Required()(handler), "k-1", `{}`)
	// Output:
	// 503 replayed="" unavailable
	// 201 replayed=""
}
