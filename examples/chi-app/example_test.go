package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/go-chi/chi/v5"

	idem "github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/scope"
	"github.com/idemkey/idemkey/store/memory"
)

// Example_chi is the smallest chi service: one route that requires a key,
// the caller's scope set by an authentication middleware before it. (It
// lives here, beside the chi example, so that the root module needs no
// router.)
func Example_chi() {
	st, err := memory.New()
	if err != nil {
		panic(err)
	}
	defer st.Close()
	mw, err := idem.New(st)
	if err != nil {
		panic(err)
	}

	payments := 0
	r := chi.NewRouter()
	r.Use(func(next http.Handler) http.Handler { // the service's authentication
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if user, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer "); ok {
				req = req.WithContext(scope.NewContext(req.Context(), user))
			}
			next.ServeHTTP(w, req)
		})
	})
	r.With(mw.Required()).Post("/payments", func(w http.ResponseWriter, _ *http.Request) {
		payments++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, payments)
	})

	post := func(key, body string) {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer alice")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed") == "true")
	}
	post("k-1", `{"amount":10}`)
	post("k-1", `{"amount":10}`) // a retry: replayed, not run again
	post("k-1", `{"amount":99}`) // the same key for another request: 422
	post("", `{"amount":10}`)    // no key on a route that requires one: 400
	fmt.Println("payments made:", payments)
	// Output:
	// 201 false
	// 201 true
	// 422 false
	// 400 false
	// payments made: 1
}
