package postgres_test

import (
	"bytes"
	"crypto/rand"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/postgres"
)

// commitProxy is a TCP proxy in front of the shared server that, once
// armed, takes the next write a client sends that holds match (any write
// when match is nil) and either holds it (never sent: the server never
// sees the COMMIT) or sends it and loses every reply after it; then,
// when dropped, it cuts that connection, as a network failure would.
type commitProxy struct {
	addr  string
	match []byte

	mu      sync.Mutex
	armed   bool
	deliver bool          // send the write, lose the replies
	held    chan struct{} // closed when a write was taken
	drop    chan struct{} // closed to cut the connection
}

func newCommitProxy(t *testing.T, target string) *commitProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	p := &commitProxy{addr: l.Addr().String()}
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
			go p.pump(c, s)
		}
	}()
	return p
}

// arm makes the proxy take the next matching write: held, or delivered
// with its replies lost.
func (p *commitProxy) arm(deliver bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed, p.deliver = true, deliver
	p.held, p.drop = make(chan struct{}), make(chan struct{})
}

func (p *commitProxy) pump(c, s net.Conn) {
	defer c.Close()
	defer s.Close()
	var lose sync.Once
	lost := make(chan struct{})
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := s.Read(buf)
			if err != nil {
				c.Close()
				return
			}
			select {
			case <-lost:
				continue // the replies after the taken write
			default:
			}
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		p.mu.Lock()
		take := p.armed && (p.match == nil || bytes.Contains(bytes.ToLower(buf[:n]), p.match))
		deliver, held, drop := p.deliver, p.held, p.drop
		if take {
			p.armed = false
		}
		p.mu.Unlock()
		if take {
			if deliver {
				lose.Do(func() { close(lost) })
				s.Write(buf[:n])
			}
			close(held)
			<-drop
			return // cut: both sides closed
		}
		if _, err := s.Write(buf[:n]); err != nil {
			return
		}
	}
}

// TestCommitHeldThenDropped: the owner's commit is held at a proxy (the
// server never sees it), a repeat meanwhile gets 409, then the connection
// is cut: the owner's client gets 503, nothing committed, and the retry
// runs once. With the commit delivered and its reply lost instead, the
// owner's client gets 503 and the retry replays what committed. Both
// faces; one payment every time.
func TestCommitHeldThenDropped(t *testing.T) {
	for _, face := range []string{"pgx", "sql"} {
		for _, deliver := range []bool{false, true} {
			name := face + map[bool]string{false: "/held", true: "/delivered"}[deliver]
			t.Run(name, func(t *testing.T) {
				url := sharedURL(t)
				cfg, err := pgxpool.ParseConfig(url)
				if err != nil {
					t.Fatal(err)
				}
				proxy := newCommitProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
				host, port, _ := net.SplitHostPort(proxy.addr)
				n, _ := strconv.Atoi(port)
				cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(n)
				var st *postgres.Store
				var table string
				opts := []postgres.Option{postgres.WithCommitTimeout(10 * time.Second)}
				if face == "sql" {
					proxy.match = []byte("commit")
					sharedPool(t) // skips, or fails under CI, without a server
					db := stdlib.OpenDB(*cfg.ConnConfig)
					db.SetMaxOpenConns(4)
					t.Cleanup(func() { db.Close() })
					st, table = newSQLStore(t, db, opts...)
				} else {
					cfg.MaxConns = 4
					pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(pool.Close)
					st, table = newStore(t, pool, opts...)
				}
				pay := newPayments(t, sharedPool(t), table)
				// The handler arms the proxy after its insert, so that
				// the next write on its connection is the commit's.
				h := &gateHandler{table: pay.name, sql: face == "sql", afterInsert: func(r *http.Request) {
					if r.Header.Get("X-Arm") != "" {
						proxy.arm(deliver)
					}
				}}
				m, err := middleware.New(st)
				if err != nil {
					t.Fatal(err)
				}
				srv := httptest.NewServer(m.Required(middleware.Deadline(10 * time.Second))(h))
				t.Cleanup(srv.Close)
				// Warm: the statements are prepared on the connections.
				for range 3 {
					if a := post(client, srv.URL, rand.Text()); a.status != 201 {
						t.Fatalf("warm-up: %d %s", a.status, a.body)
					}
				}
				key := rand.Text()
				owner := make(chan answer, 1)
				go func() { owner <- post(client, srv.URL, key, "X-Arm", "1") }()
				proxy.mu.Lock()
				held := proxy.held
				proxy.mu.Unlock()
				for held == nil {
					time.Sleep(time.Millisecond)
					proxy.mu.Lock()
					held = proxy.held
					proxy.mu.Unlock()
				}
				<-held
				during := post(client, srv.URL, key)
				t.Logf("a repeat while the commit is taken: %d replayed=%v", during.status, during.replayed)
				if deliver {
					// Committed or about to: in flight, or the record.
					if during.status != http.StatusConflict && !(during.status == 201 && during.replayed) {
						t.Fatalf("a repeat while the commit's reply is lost: %d %s", during.status, during.body)
					}
				} else if during.status != http.StatusConflict {
					t.Fatalf("a repeat while the commit is held: %d replayed=%v %s, want 409", during.status, during.replayed, during.body)
				}
				close(proxy.drop)
				first := <-owner
				t.Logf("the owner's client got %d", first.status)
				if first.status != http.StatusServiceUnavailable {
					t.Fatalf("the owner's client got %d %s, want 503", first.status, first.body)
				}
				var retry answer
				for i := 0; i < 100; i++ {
					retry = post(client, srv.URL, key)
					if retry.status != http.StatusConflict {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				t.Logf("the retry got %d replayed=%v; runs %d, payments %d", retry.status, retry.replayed, h.runs.Load(), pay.count(t, key))
				if retry.status != 201 || retry.replayed != deliver {
					t.Fatalf("the retry: %d replayed=%v %s, want 201 replayed=%v", retry.status, retry.replayed, retry.body, deliver)
				}
				if again := post(client, srv.URL, key); again.status != 201 || !again.replayed {
					t.Fatalf("a repeat after: %d replayed=%v", again.status, again.replayed)
				}
				if n := pay.count(t, key); n != 1 {
					t.Fatalf("%d payments, want 1", n)
				}
			})
		}
	}
}
