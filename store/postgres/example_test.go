package postgres_test

import (
	"context"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/postgres"
)

// A payment service whose payments and idempotency records live in one
// PostgreSQL database: the payment and the kept answer commit together.
func Example() {
	ctx := context.Background()
	// A transactional request holds a connection for its handler's run:
	// size the pool for the requests served at once.
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/app?pool_max_conns=64")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil { // or a migration of your own with postgres.SchemaSQL
		log.Fatal(err)
	}
	st, err := postgres.New(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	idem, err := middleware.New(st)
	if err != nil {
		log.Fatal(err)
	}

	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Every write goes through the request's transaction.
		tx := postgres.Tx(r.Context())
		if _, err := tx.Exec(r.Context(), "INSERT INTO payments (amount) VALUES ($1)", 10); err != nil {
			// A 5xx rolls the transaction back and frees the key.
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		// Kept: committed with the payment before it is sent.
		w.WriteHeader(http.StatusCreated)
	})
	http.Handle("POST /payments", idem.Required()(pay))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", nil))
}
