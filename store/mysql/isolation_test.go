package mysql_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/mysql"
)

// commitHolder is a TCP proxy to the shared server that holds the first
// COMMIT a client sends: it tells held, and once drop is closed it closes
// that connection without sending the COMMIT on, as a network that lost
// it would.
type commitHolder struct {
	addr string
	held chan struct{}
	drop chan struct{}
	once sync.Once
}

func newCommitHolder(t *testing.T) *commitHolder {
	t.Helper()
	u, err := url.Parse(sharedURL())
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), "3306")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	p := &commitHolder{addr: l.Addr().String(), held: make(chan struct{}), drop: make(chan struct{})}
	t.Cleanup(func() { p.release() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go func() { io.Copy(c, s); c.Close() }()
			go p.forward(c, s)
		}
	}()
	return p
}

func (p *commitHolder) release() { p.once.Do(func() { close(p.drop) }) }

// forward copies the client's packets to the server, one by one, until it
// meets the first COMMIT (a COM_QUERY whose text starts with it).
func (p *commitHolder) forward(c, s net.Conn) {
	defer s.Close()
	defer c.Close()
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := int(hdr[0]) | int(hdr[1])<<8 | int(hdr[2])<<16
		payload := make([]byte, n)
		if _, err := io.ReadFull(c, payload); err != nil {
			return
		}
		if n > 0 && payload[0] == 0x03 && bytes.HasPrefix(bytes.ToUpper(payload[1:]), []byte("COMMIT")) {
			select {
			case <-p.held:
			default:
				close(p.held)
				<-p.drop
				return
			}
		}
		if _, err := s.Write(append(hdr[:], payload...)); err != nil {
			return
		}
	}
}

// TestReadUncommittedNoReplay: a repeat on a session at READ UNCOMMITTED
// (the DSN's, or the server's default) meets a key whose owner has
// written its record and sent COMMIT, which is held at a proxy and then
// lost: the repeat must not replay a record that never committed, and
// once the owner's session is gone the key runs again.
func TestReadUncommittedNoReplay(t *testing.T) {
	db := sharedDB(t)
	var isolationVar string
	if err := db.QueryRow("SELECT IF(VERSION() LIKE '%MariaDB%', 'tx_isolation', 'transaction_isolation')").Scan(&isolationVar); err != nil {
		t.Fatal(err)
	}
	table := newTable(t, db)
	pay := newPayments(t, db)
	proxy := newCommitHolder(t)
	owner, err := url.Parse(sharedURL())
	if err != nil {
		t.Fatal(err)
	}
	owner.Host = proxy.addr
	ownerDB := openDB(t, owner.String(), 10)
	ownerSt, err := mysql.New(context.Background(), ownerDB, mysql.WithTable(table), mysql.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer ownerSt.Close()
	dirty, _ := url.Parse(sharedURL())
	q := dirty.Query()
	q.Set(isolationVar, "'READ-UNCOMMITTED'")
	dirty.RawQuery = q.Encode()
	dirtyDB := openDB(t, dirty.String(), 10)
	var level string
	if err := dirtyDB.QueryRow("SELECT @@" + isolationVar).Scan(&level); err != nil || level != "READ-UNCOMMITTED" {
		t.Fatalf("the repeat's session runs at %q (%v), want READ-UNCOMMITTED", level, err)
	}
	repeatSt, err := mysql.New(context.Background(), dirtyDB, mysql.WithTable(table), mysql.WithSweepInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer repeatSt.Close()

	key, c := newKey(), newClaim(1)
	ctx, tx := claimTx(t, ownerSt, key, c)
	if err := pay.insert(ctx, mysql.Tx(ctx), key, "owner"); err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() { committed <- tx.Commit(context.Background(), record(c.Fingerprint, 201), time.Hour) }()
	select {
	case <-proxy.held:
	case err := <-committed:
		t.Fatalf("Commit returned (%v) before its COMMIT reached the proxy", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the owner's COMMIT never reached the proxy")
	}
	res, rtx, err := repeatSt.ClaimTx(context.Background(), key, newClaim(1))
	if err != nil {
		t.Fatal(err)
	}
	if res.State == store.Completed {
		t.Fatalf("a repeat at READ UNCOMMITTED replayed a record whose COMMIT has not reached the server (status %d)", res.Record.Status)
	}
	if rtx != nil {
		rtx.Rollback(context.Background())
		t.Fatalf("a repeat claimed a key whose owner is in flight (%v)", res.State)
	}
	proxy.release()
	if err := <-committed; err == nil {
		t.Fatal("Commit of a lost COMMIT answered nil")
	}
	// The owner's session ends (the store kills it): the key runs again.
	rtx, _ = untilClaimed(t, repeatSt, key, newClaim(1), 10*time.Second)
	rtx.Rollback(context.Background())
	if n := pay.count(t, key); n != 0 {
		t.Fatalf("%d payments committed, want 0", n)
	}
}
