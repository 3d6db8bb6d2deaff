package paymentstest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/idemkey/idemkey/store/mysql"
)

// mysqlBackend is the MySQL store on the server at rawURL (a mysql://
// URL). Each call of its database function makes a database of the
// test's own (dropped when the test ends) and an environment whose
// DATABASE_URL names it.
func mysqlBackend(rawURL string) backend {
	return backend{
		name:   "mysql",
		shared: true,
		database: func(t *testing.T) map[string]string {
			t.Helper()
			var b [6]byte
			rand.Read(b[:])
			name := "idemkey_example_" + hex.EncodeToString(b[:])
			mysqlExec(t, rawURL, "CREATE DATABASE "+name)
			t.Cleanup(func() { mysqlExec(nil, rawURL, "DROP DATABASE IF EXISTS "+name) })
			u, err := url.Parse(rawURL)
			if err != nil {
				t.Fatal(err)
			}
			u.Path = "/" + name
			return map[string]string{"DATABASE_URL": u.String()}
		},
	}
}

// mysqlExec runs stmt on the server at rawURL, failing t (when not nil)
// if it fails.
func mysqlExec(t *testing.T, rawURL, stmt string) {
	dsn, err := mysql.DSN(rawURL)
	var db *sql.DB
	if err == nil {
		db, err = sql.Open("mysql", dsn)
	}
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = db.ExecContext(ctx, stmt)
		cancel()
		db.Close()
	}
	if err != nil && t != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}
