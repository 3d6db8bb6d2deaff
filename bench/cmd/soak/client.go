package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The soak's HTTP/1.1 client is a few lines over a keep-alive TCP
// connection, as the load driver's is: it costs far less CPU than
// net/http's client on a machine the server shares. Unlike the load
// driver's, it keeps every header of an answer, because a replay must
// equal the first answer in all of them.

// ioTimeout bounds every request and answer on the wire.
const ioTimeout = 10 * time.Second

// answer is one response as the checks see it.
type answer struct {
	status     int
	replayed   bool   // Idempotent-Replayed: true
	retryAfter string // the Retry-After header, if any
	// headers are the answer's headers that a replay must repeat, one
	// "Name: value" line each, sorted (see replayedHeader).
	headers string
	body    string
}

// replayedHeader reports whether a header must be the same in a replay as
// in the first answer. Date and X-Request-Id belong to each response of
// their own, and Idempotent-Replayed marks the replay; every other header
// the first answer had, Content-Length included, must come back as it was.
func replayedHeader(name string) bool {
	switch name {
	case "Date", "X-Request-Id", "Idempotent-Replayed":
		return false
	}
	return true
}

// conn is one keep-alive connection to the server.
type conn struct {
	addr string
	c    net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	hdrs []string // scratch for an answer's header lines
}

func dial(addr string) (*conn, error) {
	c := &conn{addr: addr}
	return c, c.redial()
}

// redial replaces the connection, after an error left it in an unknown
// state.
func (c *conn) redial() error {
	if c.c != nil {
		c.c.Close()
	}
	nc, err := net.DialTimeout("tcp", c.addr, ioTimeout)
	if err != nil {
		c.c = nil
		return err
	}
	c.c = nc
	c.br = bufio.NewReaderSize(nc, 8<<10)
	c.bw = bufio.NewWriterSize(nc, 4<<10)
	return nil
}

func (c *conn) close() {
	if c.c != nil {
		c.c.Close()
	}
}

// do posts body with key, and a Soak-Work header when work is positive,
// and reads the answer.
func (c *conn) do(key string, body []byte, work time.Duration) (answer, error) {
	if c.c == nil {
		if err := c.redial(); err != nil {
			return answer{}, err
		}
	}
	c.c.SetDeadline(time.Now().Add(ioTimeout))
	c.bw.WriteString("POST /payments HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\nContent-Length: ")
	c.bw.WriteString(strconv.Itoa(len(body)))
	c.bw.WriteString("\r\nIdempotency-Key: ")
	c.bw.WriteString(key)
	if work > 0 {
		c.bw.WriteString("\r\nSoak-Work: ")
		c.bw.WriteString(work.String())
	}
	c.bw.WriteString("\r\n\r\n")
	c.bw.Write(body)
	if err := c.bw.Flush(); err != nil {
		return answer{}, err
	}
	var a answer
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		return a, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return a, fmt.Errorf("status line %q", line)
	}
	if a.status, err = strconv.Atoi(string(line[9:12])); err != nil {
		return a, fmt.Errorf("status line %q", line)
	}
	length := -1
	c.hdrs = c.hdrs[:0]
	for {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			return a, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, ok := strings.Cut(string(line), ": ")
		if !ok {
			return a, fmt.Errorf("header line %q", line)
		}
		switch name {
		case "Content-Length":
			if length, err = strconv.Atoi(value); err != nil {
				return a, fmt.Errorf("Content-Length %q", value)
			}
		case "Idempotent-Replayed":
			a.replayed = value == "true"
		case "Retry-After":
			a.retryAfter = value
		case "Transfer-Encoding":
			return a, errors.New("chunked answer: the soak's answers are small and should carry Content-Length")
		}
		if replayedHeader(name) {
			c.hdrs = append(c.hdrs, name+": "+value)
		}
	}
	if length < 0 || length > 1<<20 {
		return a, fmt.Errorf("Content-Length %d", length)
	}
	slices.Sort(c.hdrs)
	a.headers = strings.Join(c.hdrs, "\n")
	b := make([]byte, length)
	if _, err := io.ReadFull(c.br, b); err != nil {
		return a, err
	}
	a.body = string(b)
	return a, nil
}
