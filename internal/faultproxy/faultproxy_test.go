package faultproxy_test

import (
	"bufio"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/faultproxy"
)

// echo is a line server that answers each line with "ok <line>" and
// records what it received.
type echo struct {
	addr string
	mu   sync.Mutex
	got  []string
}

func startEcho(t *testing.T) *echo {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	e := &echo{addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					e.mu.Lock()
					e.got = append(e.got, strings.TrimSpace(line))
					e.mu.Unlock()
					c.Write([]byte("ok " + line))
				}
			}()
		}
	}()
	return e
}

func (e *echo) received() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.got...)
}

type client struct {
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{c, bufio.NewReader(c)}
}

// send writes line and reads the answer, waiting at most wait.
func (c *client) send(line string, wait time.Duration) (string, error) {
	if _, err := c.c.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	c.c.SetReadDeadline(time.Now().Add(wait))
	s, err := c.r.ReadString('\n')
	return strings.TrimSpace(s), err
}

func TestForwardsAndCountsTurns(t *testing.T) {
	e := startEcho(t)
	p := faultproxy.Start(t, e.addr)
	c := dial(t, p.Addr)
	for _, l := range []string{"a", "b", "c"} {
		if got, err := c.send(l, 5*time.Second); err != nil || got != "ok "+l {
			t.Fatalf("send %q: %q, %v", l, got, err)
		}
	}
	if n := p.Turns(); n != 3 {
		t.Errorf("Turns = %d, want 3", n)
	}
}

func TestDropReplies(t *testing.T) {
	e := startEcho(t)
	p := faultproxy.Start(t, e.addr)
	c := dial(t, p.Addr)
	p.DropReplies(true)
	if got, err := c.send("lost", 300*time.Millisecond); err == nil {
		t.Fatalf("a reply came through: %q", got)
	}
	if got := e.received(); len(got) != 1 || got[0] != "lost" {
		t.Errorf("the server received %q, want the write", got)
	}
	if p.Dropped() == 0 {
		t.Error("Dropped = 0")
	}
}

func TestTake(t *testing.T) {
	for _, deliver := range []bool{false, true} {
		name := "held"
		if deliver {
			name = "delivered"
		}
		t.Run(name, func(t *testing.T) {
			e := startEcho(t)
			p := faultproxy.Start(t, e.addr)
			c := dial(t, p.Addr)
			if _, err := c.send("begin", 5*time.Second); err != nil {
				t.Fatal(err)
			}
			take := p.Take("COMMIT", deliver)
			done := make(chan error, 1)
			go func() {
				_, err := c.send("commit 1", 10*time.Second)
				done <- err
			}()
			select {
			case <-take.Taken():
			case <-time.After(5 * time.Second):
				t.Fatal("the write was never taken")
			}
			// Another connection is not disturbed: the proxy took one write.
			if got, err := dial(t, p.Addr).send("commit 2", 5*time.Second); err != nil || got != "ok commit 2" {
				t.Fatalf("the next connection's write: %q, %v", got, err)
			}
			take.Cut()
			if err := <-done; err == nil {
				t.Fatal("the taken write's client got an answer")
			}
			want := []string{"begin", "commit 2"}
			if deliver {
				want = []string{"begin", "commit 1", "commit 2"}
			}
			var got []string
			for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
				if got = e.received(); len(got) >= len(want) {
					break
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("the server received %q, want %q", got, want)
			}
		})
	}
}
