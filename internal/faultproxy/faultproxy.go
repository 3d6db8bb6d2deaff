// Package faultproxy is a TCP proxy for tests that need to see or disturb
// the traffic between a client and a server (PostgreSQL, MariaDB, Redis,
// gRPC): it counts round trips, loses replies while the connections stay
// open, cuts connections, and takes one chosen write (a COMMIT, a claim),
// holding it back or passing it on and losing every reply after it.
package faultproxy

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy listens on a free loopback port and forwards each connection to
// its target.
type Proxy struct {
	// Addr is the proxy's "127.0.0.1:<port>".
	Addr string

	target string
	ln     net.Listener
	drop   atomic.Bool
	turns  atomic.Int64
	bytes  atomic.Int64 // server-to-client bytes dropped
	mu     sync.Mutex
	conns  map[*conn]bool
	take   *Take // armed, or nil
	closed bool
	wg     sync.WaitGroup
}

type conn struct {
	client, server net.Conn
	// replied is set when the server has sent something since the
	// client last sent; sent once the client has sent anything.
	replied, sent atomic.Bool
	// lost is set once a taken write was passed on: every reply after it
	// is lost.
	lost atomic.Bool
}

// Start starts a proxy to target ("host:port") for the test; it stops when
// the test ends.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// New starts a proxy to target ("host:port"); the caller stops it with
// Close.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[*conn]bool{}}
	p.wg.Go(p.accept)
	return p, nil
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		pc := &conn{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.conns[pc] = true
		p.mu.Unlock()
		p.wg.Go(func() { p.pump(pc, true) })
		p.wg.Go(func() { p.pump(pc, false) })
	}
}

// pump copies one direction of pc until either side closes, then closes
// both.
func (p *Proxy) pump(pc *conn, toServer bool) {
	defer func() {
		pc.client.Close()
		pc.server.Close()
		p.mu.Lock()
		delete(p.conns, pc)
		p.mu.Unlock()
	}()
	src, dst := pc.server, pc.client
	if toServer {
		src, dst = pc.client, pc.server
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if toServer {
				// A send after a reply (or the first send) begins a
				// round trip.
				if replied := pc.replied.Swap(false); replied || !pc.sent.Swap(true) {
					p.turns.Add(1)
				}
				if t := p.taking(buf[:n]); t != nil {
					t.took(pc, dst, buf[:n])
					return
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			} else {
				pc.replied.Store(true)
				if p.drop.Load() || pc.lost.Load() {
					p.bytes.Add(int64(n))
				} else if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return // EOF, or either side closed
		}
	}
}

// Turns returns how many round trips clients have begun through the
// proxy: each time a client sends after the server last answered it (its
// first send included). Take the difference around an operation on a
// connection that is already open to count that operation's round trips.
func (p *Proxy) Turns() int64 { return p.turns.Load() }

// DropReplies makes the proxy lose (on) or pass again (off) everything the
// server sends: the server does what it is asked, and the clients never
// hear about it, on connections that stay open.
func (p *Proxy) DropReplies(on bool) { p.drop.Store(on) }

// Dropped returns how many bytes from the server the proxy has lost.
func (p *Proxy) Dropped() int64 { return p.bytes.Load() }

// Sever closes every connection through the proxy, as a network failure
// would; new connections are still accepted.
func (p *Proxy) Sever() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pc := range p.conns {
		pc.client.Close()
		pc.server.Close()
	}
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	if p.take != nil {
		p.take.Cut()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.Sever()
	p.wg.Wait()
}

// Take is one write the proxy takes: the next a client sends, on any
// connection, that contains its match (compared in lower case; any write
// for an empty match).
type Take struct {
	match   []byte
	deliver bool
	taken   chan struct{}
	cut     chan struct{}
	cutOnce sync.Once
}

// Take arms the proxy to take the next write that contains match: held
// back (deliver false: the server never sees it) or passed on with every
// reply after it lost (deliver true: the server does it, the client never
// hears). Either way the connection then stays open, its client waiting,
// until Cut, as a network that stalled and then failed.
func (p *Proxy) Take(match string, deliver bool) *Take {
	t := &Take{match: bytes.ToLower([]byte(match)), deliver: deliver,
		taken: make(chan struct{}), cut: make(chan struct{})}
	p.mu.Lock()
	p.take = t
	p.mu.Unlock()
	return t
}

// taking returns the armed Take when b is its write, and disarms it.
func (p *Proxy) taking(b []byte) *Take {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.take
	if t == nil || !bytes.Contains(bytes.ToLower(b), t.match) {
		return nil
	}
	p.take = nil
	return t
}

// took does what t says with the write b of pc (to server), then waits for
// Cut; the caller's pump then closes the connection.
func (t *Take) took(pc *conn, server net.Conn, b []byte) {
	if t.deliver {
		pc.lost.Store(true)
		server.Write(b)
	}
	close(t.taken)
	<-t.cut
}

// Taken is closed once the write was taken.
func (t *Take) Taken() <-chan struct{} { return t.taken }

// Cut closes the connection the write was taken from, as a network
// failure would (before the write came, the proxy takes nothing more).
func (t *Take) Cut() { t.cutOnce.Do(func() { close(t.cut) }) }
