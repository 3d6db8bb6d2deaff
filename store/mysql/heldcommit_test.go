package mysql_test

import (
	"crypto/rand"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/faultproxy"
	"github.com/idemkey/idemkey/store/mysql"
)

// TestCommitHeldThenDropped: the owner's COMMIT is held at a proxy (the
// server never sees it), a repeat meanwhile gets 409, then the connection
// is cut: the owner's client gets 503, nothing committed, and the retry
// runs once. With the COMMIT delivered and every reply after it lost
// instead, the owner's client gets 503 and the retry replays what
// committed. Repeats through a second instance whose handler left its
// sessions at READ UNCOMMITTED (where the owner's record is visible before
// its COMMIT) get 409 while the COMMIT is held too. One payment every
// time.
func TestCommitHeldThenDropped(t *testing.T) {
	for _, deliver := range []bool{false, true} {
		t.Run(map[bool]string{false: "held", true: "delivered"}[deliver], func(t *testing.T) {
			u, err := url.Parse(sharedURL())
			if err != nil {
				t.Fatal(err)
			}
			target := u.Host
			if u.Port() == "" {
				target = net.JoinHostPort(u.Hostname(), "3306")
			}
			proxy := faultproxy.Start(t, target)
			// A COM_QUERY whose text starts with COMMIT (not the
			// store's SET autocommit).
			const match = "\x03commit"
			u.Host = proxy.Addr
			db := openDB(t, u.String(), 4)
			st, table := newStore(t, db)
			h := &sessionHandler{pay: newPayments(t, sharedDB(t))}
			// The handler arms the proxy after its insert, so that the
			// next COMMIT through the proxy is the owner's.
			taking := make(chan *faultproxy.Take, 1)
			h.afterInsert = func(r *http.Request) {
				if r.Header.Get("X-Arm") != "" {
					taking <- proxy.Take(match, deliver)
				}
			}
			srv := server(t, st, h, 10*time.Second)
			for range 3 {
				if a := post(srv.URL, rand.Text(), payBody); a.status != 201 {
					t.Fatalf("warm-up: %d %s", a.status, a.body)
				}
			}
			// A second instance on the same table, directly: its
			// handler's SET SESSION leaves both its connections at READ
			// UNCOMMITTED, where the owner's record is visible before
			// its COMMIT.
			direct := openDB(t, sharedURL(), 2)
			st2, err := mysql.New(t.Context(), direct, mysql.WithTable(table), mysql.WithSweepInterval(0))
			if err != nil {
				t.Fatal(err)
			}
			defer st2.Close()
			srv2 := server(t, st2, h, 10*time.Second)
			var isolationVar string
			if err := direct.QueryRow("SELECT IF(VERSION() LIKE '%MariaDB%', 'tx_isolation', 'transaction_isolation')").Scan(&isolationVar); err != nil {
				t.Fatal(err)
			}
			dirty := 0
			for try := 0; dirty < 4; try++ {
				if try == 20 {
					t.Fatalf("the second instance's sessions: %d of 4 reads at READ UNCOMMITTED after %d tries", dirty, try)
				}
				if a := post(srv2.URL, rand.Text(), payBody, "X-Session", "SET SESSION "+isolationVar+" = 'READ-UNCOMMITTED'"); a.status != 201 {
					t.Fatalf("warm-up at READ UNCOMMITTED: %d %s", a.status, a.body)
				}
				dirty = 0
				for range 4 {
					var level string
					if err := direct.QueryRow("SELECT @@" + isolationVar).Scan(&level); err != nil {
						t.Fatal(err)
					}
					if level == "READ-UNCOMMITTED" {
						dirty++
					}
				}
			}
			key := rand.Text()
			owner := make(chan answer, 1)
			go func() { owner <- post(srv.URL, key, payBody, "X-Arm", "1") }()
			take := <-taking
			<-take.Taken()
			for range 4 {
				d := post(srv2.URL, key, payBody)
				t.Logf("a repeat at READ UNCOMMITTED while the COMMIT is taken: %d replayed=%v", d.status, d.replayed)
				if d.status != http.StatusConflict && !(deliver && d.status == 201 && d.replayed) {
					t.Fatalf("a repeat at READ UNCOMMITTED while the COMMIT is taken: %d replayed=%v %s", d.status, d.replayed, d.body)
				}
			}
			during := post(srv.URL, key, payBody)
			t.Logf("a repeat while the COMMIT is taken: %d replayed=%v", during.status, during.replayed)
			if deliver {
				if during.status != http.StatusConflict && !(during.status == 201 && during.replayed) {
					t.Fatalf("a repeat while the COMMIT's reply is lost: %d %s", during.status, during.body)
				}
			} else if during.status != http.StatusConflict {
				t.Fatalf("a repeat while the COMMIT is held: %d replayed=%v %s, want 409", during.status, during.replayed, during.body)
			}
			take.Cut()
			first := <-owner
			t.Logf("the owner's client got %d", first.status)
			if first.status != http.StatusServiceUnavailable {
				t.Fatalf("the owner's client got %d %s, want 503", first.status, first.body)
			}
			var retry answer
			for range 100 {
				retry = post(srv.URL, key, payBody)
				if retry.status != http.StatusConflict {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("the retry got %d replayed=%v; runs %d, payments %d", retry.status, retry.replayed, h.runs.Load(), h.pay.count(t, key))
			if retry.status != 201 || retry.replayed != deliver {
				t.Fatalf("the retry: %d replayed=%v %s, want 201 replayed=%v", retry.status, retry.replayed, retry.body, deliver)
			}
			if again := post(srv.URL, key, payBody); again.status != 201 || !again.replayed {
				t.Fatalf("a repeat after: %d replayed=%v", again.status, again.replayed)
			}
			if n := h.pay.count(t, key); n != 1 {
				t.Fatalf("%d payments, want 1", n)
			}
		})
	}
}
