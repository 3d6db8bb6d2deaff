package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"

	_ "github.com/go-sql-driver/mysql"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/mysql"
)

// A payment service whose payments and idempotency records live in one
// MySQL or MariaDB database: the payment and the kept answer commit
// together.
func Example() {
	ctx := context.Background()
	dsn, err := mysql.DSN("mysql://app@127.0.0.1:3306/app")
	if err != nil {
		log.Fatal(err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	// A transactional request holds a connection for its handler's run:
	// size the pool for the requests served at once.
	db.SetMaxOpenConns(64)
	db.SetMaxIdleConns(64)
	if err := mysql.Migrate(ctx, db); err != nil { // or a migration of your own with mysql.SchemaSQL
		log.Fatal(err)
	}
	st, err := mysql.New(ctx, db)
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
		tx := mysql.Tx(r.Context())
		if _, err := tx.ExecContext(r.Context(), "INSERT INTO payments (amount) VALUES (?)", 10); err != nil {
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

// The URL form of a server's address, as MYSQL_URL and idemctl take it,
// turned into the driver's DSN.
func ExampleDSN() {
	dsn, err := mysql.DSN("mysql://app:secret@db.internal:3306/payments?timeout=2s")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(dsn)
	// Output: app:secret@tcp(db.internal:3306)/payments?timeout=2s
}
