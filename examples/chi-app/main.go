// Command chi-app is a small payment service on chi, protected by idemkey
// with the embedded in-memory store.
//
//	go run ./examples/chi-app
//	curl -i -X POST localhost:8080/payments -H 'Idempotency-Key: k1' -d '{"amount":10,"currency":"EUR"}'
package main

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"sync"

	"github.com/go-chi/chi/v5"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	addr := os.Getenv("ADDR")
	if addr == "" {
		addr = "127.0.0.1:8080"
	}
	st := memory.New()
	defer st.Close()
	log.Info("store", "kind", "memory")
	idem, err := middleware.New(st, middleware.WithObserver(middleware.SlogObserver(log)))
	if err != nil {
		log.Error("idemkey", "err", err)
		os.Exit(1)
	}

	var mu sync.Mutex
	var payments []map[string]any
	r := chi.NewRouter()
	r.With(idem.Required()).Post("/payments", func(w http.ResponseWriter, r *http.Request) {
		var p map[string]any
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
			http.Error(w, "invalid JSON", http.StatusBadRequest)
			return
		}
		mu.Lock()
		p["id"] = strconv.Itoa(len(payments) + 1)
		payments = append(payments, p)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(p)
	})
	r.Get("/payments", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(payments)
	})
	log.Info("listening", "addr", addr)
	if err := http.ListenAndServe(addr, r); err != nil {
		log.Error("serve", "err", err)
		os.Exit(1)
	}
}
