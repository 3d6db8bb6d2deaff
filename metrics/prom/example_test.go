package prom_test

import (
	"bufio"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemkey/idemkey/metrics/prom"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
)

// The metrics are one observer of the middleware, beside the log; GET
// /metrics serves them. A first run and its replay are counted under the
// route's pattern, and the kept response is measured once: 42 bytes, its
// body and its Content-Type header's name and value.
func Example() {
	reg := prometheus.NewRegistry()
	met, err := prom.New(reg)
	if err != nil {
		log.Fatal(err)
	}
	st, err := memory.New()
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	logger := slog.New(slog.DiscardHandler) // the service's own logger
	idem, err := middleware.New(st,
		middleware.WithObserver(met.Observer()),
		middleware.WithObserver(middleware.SlogObserver(logger)))
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":"pay_1"}`))
	})))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	for range 2 { // a first run, then a retry that replays it
		r := httptest.NewRequest("POST", "/payments", strings.NewReader(`{"amount":10}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Println(w.Code, "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}

	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	sc := bufio.NewScanner(w.Body)
	for sc.Scan() {
		line := sc.Text()
		// The latency histogram's values vary from run to run.
		if strings.HasPrefix(line, "idemkey_events_total{") || strings.HasPrefix(line, "idemkey_kept_record_bytes_count") ||
			strings.HasPrefix(line, "idemkey_kept_record_bytes_sum") {
			fmt.Println(line)
		}
	}
	// Output:
	// 201 replayed: false
	// 201 replayed: true
	// idemkey_events_total{event="first_attempt",route="POST /payments"} 1
	// idemkey_events_total{event="kept",route="POST /payments"} 1
	// idemkey_events_total{event="replay",route="POST /payments"} 1
	// idemkey_kept_record_bytes_sum 42
	// idemkey_kept_record_bytes_count 1
}
