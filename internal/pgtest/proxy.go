package pgtest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy is a TCP proxy on a free loopback port in front of a server, for
// tests that need to see or disturb the traffic: it counts round trips, and
// can lose every reply the server sends while the connections stay open.
type Proxy struct {
	// Addr is the proxy's "127.0.0.1:<port>".
	Addr string

	target string
	ln     net.Listener
	drop   atomic.Bool
	turns  atomic.Int64
	bytes  atomic.Int64 // server-to-client bytes dropped
	mu     sync.Mutex
	conns  map[*proxyConn]bool
	closed bool
	wg     sync.WaitGroup
}

type proxyConn struct {
	client, server net.Conn
	// replied is set when the server has sent something since the
	// client last sent; sent once the client has sent anything.
	replied, sent atomic.Bool
}

// StartProxy starts a proxy to target ("host:port") for the test; it stops
// when the test ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := NewProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// NewProxy starts a proxy to target ("host:port"); the caller stops it with
// Close.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[*proxyConn]bool{}}
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
		pc := &proxyConn{client: c, server: s}
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
func (p *Proxy) pump(pc *proxyConn, toServer bool) {
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
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			} else {
				pc.replied.Store(true)
				if p.drop.Load() {
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
	p.mu.Unlock()
	p.ln.Close()
	p.Sever()
	p.wg.Wait()
}
