package mysql_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/mysql"
)

// lateReply is a client connection to the server that holds back the reply
// to one chosen statement (the first write that contains match, once
// armed) until a time has passed, then hands it to the driver whole: the
// server did the statement, and its answer arrives after the call's
// budget has ended.
type lateReply struct {
	net.Conn
	l *lateReplies
	// waiting: the chosen statement was sent, its reply is to be held
	// until until.
	waiting atomic.Bool
	until   time.Time
}

// lateReplies arms the connections dialled through it.
type lateReplies struct {
	mu    sync.Mutex
	match []byte
	until time.Time
	held  atomic.Int64 // replies held back
	// slow and slowFor: the next write that contains slow is sent only
	// after slowFor.
	slow    []byte
	slowFor time.Duration
}

// delay makes the next write that contains match wait d before it is sent.
func (l *lateReplies) delay(match string, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.slow, l.slowFor = []byte(match), d
}

// arm makes the next write that contains match have its reply held until
// until; an empty match disarms.
func (l *lateReplies) arm(match string, until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.match, l.until = nil, until
	if match != "" {
		l.match = []byte(match)
	}
}

func (c *lateReply) Write(b []byte) (int, error) {
	c.l.mu.Lock()
	if c.l.match != nil && bytes.Contains(b, c.l.match) {
		c.l.match = nil
		c.until = c.l.until
		c.waiting.Store(true)
	}
	var wait time.Duration
	if c.l.slow != nil && bytes.Contains(b, c.l.slow) {
		c.l.slow, wait = nil, c.l.slowFor
	}
	c.l.mu.Unlock()
	time.Sleep(wait)
	return c.Conn.Write(b)
}

func (c *lateReply) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.waiting.Swap(false) {
		c.l.held.Add(1)
		time.Sleep(time.Until(c.until))
	}
	return n, err
}

// openLateDB opens a pool on the shared server whose connections are
// lateReply's.
func openLateDB(t *testing.T) (*sql.DB, *lateReplies) {
	t.Helper()
	sharedDB(t) // skips, or fails under CI, without a server
	dsn, err := mysql.DSN(sharedURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	l := &lateReplies{}
	netName := "late" + randomHex(4)
	var d net.Dialer
	gomysql.RegisterDialContext(netName, func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return &lateReply{Conn: c, l: l}, nil
	})
	cfg.Net = netName
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(10)
	t.Cleanup(func() { db.Close() })
	return db, l
}

// TestClaimedNearTheBudget: the claim's write (the INSERT of a free key, or
// the takeover of a lapsed row) lands, and its reply arrives after the
// call's budget has ended: ClaimTx must not answer Claimed then, as the
// driver closes a connection whose context ended while it waited (the
// session, with the claim's locks and uncommitted row, goes with it), and
// a handler run on that claim would run with the key not held. Either the
// claim is refused (unavailable, and the key is left free), or it holds:
// its session is alive, with both of its locks.
func TestClaimedNearTheBudget(t *testing.T) {
	const budget = 300 * time.Millisecond
	db, late := openLateDB(t)
	st, table := newStore(t, db, mysql.WithCallTimeout(budget))
	pay := newPayments(t, db)
	for _, takeover := range []bool{false, true} {
		name := "Insert"
		if takeover {
			name = "Takeover"
		}
		t.Run(name, func(t *testing.T) {
			retries := 0
			for round := 0; round < 4; round++ {
				key, c := newKey(), newClaim(1)
				write := "INSERT INTO `" + table + "` (k, token"
				if takeover {
					lapsed := newClaim(2)
					lapsed.TTL = time.Millisecond
					if res, err := st.Claim(context.Background(), key, lapsed); err != nil || res.State != store.Claimed {
						t.Fatalf("Claim: %v %v", res.State, err)
					}
					time.Sleep(5 * time.Millisecond)
					write = "UPDATE `" + table + "` SET token"
				}
				held := late.held.Load()
				start := time.Now()
				late.arm(write, start.Add(budget+50*time.Millisecond))
				res, tx, err := st.ClaimTx(context.Background(), key, c)
				late.arm("", time.Time{})
				if late.held.Load() == held && takeover && err == nil && res.State == store.InFlight && retries < 20 {
					// The lapsed plain claim lets go of its named locks
					// in the background, which a loaded machine can run
					// after this claim tried them: the round did not
					// reach its write. Make it again on a new key.
					retries++
					round--
					continue
				}
				if late.held.Load() == held {
					t.Fatalf("round %d: the claim's write was not seen (%v %v)", round, res.State, err)
				}
				switch {
				case err != nil:
					if !errors.Is(err, store.ErrUnavailable) {
						t.Fatalf("round %d: ClaimTx whose write answered after its budget: %v, want one wrapping store.ErrUnavailable", round, err)
					}
					// Nothing is held: the key is free (once the session
					// is gone).
					noLocks(t, db, st, key, c.Fingerprint)
					tx2, _ := untilClaimed(t, st, key, newClaim(3), 5*time.Second)
					tx2.Rollback(context.Background())
				case res.State == store.Claimed:
					ctx := tx.NewContext(context.Background())
					if err := pay.insert(ctx, mysql.Tx(ctx), key, "near"); err != nil {
						t.Fatalf("round %d: ClaimTx answered Claimed %v after it began (its budget %v), and the handler's write through its transaction failed: %v (the claim is not held)", round, time.Since(start).Round(time.Millisecond), budget, err)
					}
					if n := heldLocks(t, db, st, key, c.Fingerprint); n != 2 {
						t.Fatalf("round %d: ClaimTx answered Claimed, and %d of the claim's locks are held, want 2", round, n)
					}
					if err := tx.Rollback(context.Background()); err != nil {
						t.Fatal(err)
					}
				default:
					t.Fatalf("round %d: ClaimTx of a free key: %v", round, res.State)
				}
			}
		})
	}
}

// TestWatchdogFromTheClaim: the claim's life is counted from its first
// statement (the server's clock reading that fences its keep), and so is
// the watchdog that ends the session of an owner still running at that
// life: the reply to the claim's INSERT is held back 500 ms, the claim
// lives 800 ms, and the key is free for the next request soon after 800
// ms from the start, not 800 ms after the claim was handed out. A claim
// whose life ended before its write's reply came (its INSERT's reply held
// back past it) is not handed out as Claimed: its keep would be fenced,
// and the handler would run for nothing.
func TestWatchdogFromTheClaim(t *testing.T) {
	db, late := openLateDB(t)
	st, table := newStore(t, db, mysql.WithCallTimeout(5*time.Second))
	insert := "INSERT INTO `" + table + "` (k, token"
	t.Run("Lapses", func(t *testing.T) {
		const life, held = 800 * time.Millisecond, 500 * time.Millisecond
		key, c := newKey(), newClaim(1)
		c.TTL = life
		before := late.held.Load()
		start := time.Now()
		late.arm(insert, start.Add(held))
		res, tx, err := st.ClaimTx(context.Background(), key, c)
		late.arm("", time.Time{})
		if late.held.Load() == before {
			t.Fatalf("the claim's write was not seen (%v %v)", res.State, err)
		}
		if err != nil || res.State != store.Claimed {
			t.Fatalf("ClaimTx: %v %v", res.State, err)
		}
		defer tx.Rollback(context.Background())
		for heldLocks(t, db, st, key, c.Fingerprint) != 0 {
			if since := time.Since(start); since > life+300*time.Millisecond {
				t.Fatalf("the claim's locks still held %v after its first statement, its life %v (its write answered after %v)", since.Round(time.Millisecond), life, held)
			}
			time.Sleep(2 * time.Millisecond)
		}
		t.Logf("the key was free %v after the claim began (life %v)", time.Since(start).Round(time.Millisecond), life)
	})
	t.Run("OverBeforeHandedOut", func(t *testing.T) {
		const life, held = 200 * time.Millisecond, 400 * time.Millisecond
		key, c := newKey(), newClaim(1)
		c.TTL = life
		before := late.held.Load()
		late.arm(insert, time.Now().Add(held))
		res, tx, err := st.ClaimTx(context.Background(), key, c)
		late.arm("", time.Time{})
		if late.held.Load() == before {
			t.Fatalf("the claim's write was not seen (%v %v)", res.State, err)
		}
		if res.State == store.Claimed {
			err := tx.Commit(context.Background(), record(c.Fingerprint, 201), time.Hour)
			t.Fatalf("ClaimTx answered Claimed, its write's reply held %v, past its life of %v (the Commit then: %v)", held, life, err)
		}
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("ClaimTx whose life ended before its write answered: %v %v, want an error wrapping store.ErrUnavailable", res.State, err)
		}
		noLocks(t, db, st, key, c.Fingerprint)
	})
}

// TestAskAgainWithoutItsLocks: a transactional claim whose takeover of a
// lapsed row finds the row changed after its first statement read it (here
// deleted, as the sweeper does) asks again, and it must not meet the locks
// it took the first time: it lets go of them before it asks. The first
// statement's reply is held back while the row is deleted, and the
// statement that lets go of the locks is sent 300 ms late.
func TestAskAgainWithoutItsLocks(t *testing.T) {
	db, late := openLateDB(t)
	st, table := newStore(t, db, mysql.WithCallTimeout(5*time.Second))
	key, c := newKey(), newClaim(1)
	lapsed := newClaim(2)
	lapsed.TTL = time.Millisecond
	if res, err := st.Claim(context.Background(), key, lapsed); err != nil || res.State != store.Claimed {
		t.Fatalf("Claim: %v %v", res.State, err)
	}
	time.Sleep(5 * time.Millisecond)
	before := late.held.Load()
	late.arm("GET_LOCK(", time.Now().Add(200*time.Millisecond))
	late.delay("SET autocommit = IF(", 300*time.Millisecond) // the statement that lets go of the locks
	deleted := make(chan error, 1)
	go func() {
		time.Sleep(50 * time.Millisecond)
		_, err := sharedDB(t).Exec("DELETE FROM `"+table+"` WHERE k = ?", key)
		deleted <- err
	}()
	res, tx, err := st.ClaimTx(context.Background(), key, c)
	late.arm("", time.Time{})
	late.delay("", 0)
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	if late.held.Load() == before {
		t.Fatalf("the claim's first statement was not seen (%v %v)", res.State, err)
	}
	if err != nil || res.State != store.Claimed {
		t.Fatalf("ClaimTx of a key whose lapsed row went after its first statement: %v (fingerprint %x) %v, want Claimed", res.State, res.Fingerprint[:1], err)
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
}
