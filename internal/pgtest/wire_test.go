package pgtest

import (
	"context"
	"strings"
	"testing"
	"time"
)

// ping signs in and runs a query, so a database that does not exist is an
// error with the server's message, not a server that answers.
func TestPing(t *testing.T) {
	url := Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ping(ctx, url); err != nil {
		t.Fatalf("ping %s: %v", redact(url), err)
	}
	ci, err := parseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	missing := strings.Replace(url, "/"+ci.Database+"?", "/idemkey_pgtest_no_such_db?", 1)
	if missing == url {
		t.Skipf("cannot name another database in %s", redact(url))
	}
	if err := ping(ctx, missing); err == nil || !strings.Contains(err.Error(), "3D000") {
		t.Errorf("ping of a database that does not exist: %v, want SQLSTATE 3D000", err)
	}
}

func TestParseURL(t *testing.T) {
	ci, err := parseURL("postgres://u:p%40ss@db.example:6543/app?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	if want := (connInfo{Host: "db.example", Port: 6543, User: "u", Password: "p@ss", Database: "app"}); ci != want {
		t.Errorf("got %+v, want %+v", ci, want)
	}
	if ci, err := parseURL("postgresql://u@h/"); err != nil || ci.Port != 5432 || ci.Database != "" {
		t.Errorf("defaults: %+v, %v", ci, err)
	}
	if _, err := parseURL("mysql://root@h/test"); err == nil {
		t.Error("a mysql:// URL was taken")
	}
}
