package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey/internal/benchbody"
)

// The driver's HTTP/1.1 client is a few lines over a TCP connection: a
// prebuilt request with the key spliced in, and a response read as far as
// the checks need. It costs far less CPU than net/http's client, and the
// client shares the machine with the servers it measures.

// payload is the request body: the benchmarks' shared 1 KiB of JSON,
// forty small objects whose members are not in sorted order.
var payload = benchbody.JSON(false)

var (
	requestHead = []byte("POST /payments HTTP/1.1\r\nHost: load\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(payload)) + "\r\nIdempotency-Key: ")
	requestSep = []byte("\r\n\r\n")
)

// ioTimeout bounds every request and response on the wire.
const ioTimeout = 10 * time.Second

// answer is what the checks need of one response.
type answer struct {
	status      int
	contentType string
	replayed    bool
	body        []byte // valid until the connection's next request
}

// conn is one keep-alive connection to a server.
type conn struct {
	c  net.Conn
	br *bufio.Reader
	bw *bufio.Writer
	// body is the buffer answers' bodies are read into.
	body []byte
}

func dial(addr string) (*conn, error) {
	c, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err != nil {
		return nil, err
	}
	return &conn{c: c, br: bufio.NewReaderSize(c, 16<<10), bw: bufio.NewWriterSize(c, 4<<10)}, nil
}

func (c *conn) close() { c.c.Close() }

// do sends the payload with key and reads the answer.
func (c *conn) do(key string) (answer, error) {
	c.c.SetDeadline(time.Now().Add(ioTimeout))
	c.bw.Write(requestHead)
	c.bw.WriteString(key)
	c.bw.Write(requestSep)
	c.bw.Write(payload)
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
	for {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			return a, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(": "))
		if !ok {
			return a, fmt.Errorf("header line %q", line)
		}
		switch string(name) {
		case "Content-Length":
			if length, err = strconv.Atoi(string(value)); err != nil {
				return a, fmt.Errorf("Content-Length %q", value)
			}
		case "Content-Type":
			a.contentType = string(value)
		case "Idempotent-Replayed":
			a.replayed = string(value) == "true"
		case "Transfer-Encoding":
			return a, errors.New("chunked answer: every scenario should send Content-Length")
		}
	}
	if length < 0 || length > 1<<20 {
		return a, fmt.Errorf("Content-Length %d", length)
	}
	if cap(c.body) < length {
		c.body = make([]byte, length)
	}
	a.body = c.body[:length]
	_, err = io.ReadFull(c.br, a.body)
	return a, err
}

// firstAnswer is the kept copy of a first run's answer, which every
// replay of its key must equal.
type firstAnswer struct {
	status      int
	contentType string
	body        string
}

// checkFirst checks the answer to a key's first request: the handler ran
// (201, its JSON, the key and the whole body it was given), and it was not
// a replay. It returns the run number the handler gave it.
func checkFirst(a answer, key string) (int64, error) {
	if a.status != 201 {
		return 0, fmt.Errorf("first run of %s: status %d: %.200s", key, a.status, a.body)
	}
	if a.replayed {
		return 0, fmt.Errorf("first run of %s answered as a replay", key)
	}
	if a.contentType != "application/json" {
		return 0, fmt.Errorf("first run of %s: Content-Type %q", key, a.contentType)
	}
	body := string(a.body)
	run, ok := field(body, `{"id":"pay_`, `"`)
	if !ok {
		return 0, fmt.Errorf("first run of %s: body %q", key, body)
	}
	if k, _ := field(body, `"key":"`, `"`); k != key {
		return 0, fmt.Errorf("first run of %s answered for key %q", key, k)
	}
	if n, _ := field(body, `"bytes":`, `,`); n != strconv.Itoa(len(payload)) {
		return 0, fmt.Errorf("first run of %s: the handler read %s bytes of %d", key, n, len(payload))
	}
	return strconv.ParseInt(run, 10, 64)
}

// checkReplay checks a repeat's answer against the first answer.
func checkReplay(a answer, key string, first firstAnswer) error {
	if a.status != first.status || a.contentType != first.contentType || string(a.body) != first.body {
		return fmt.Errorf("repeat of %s: %d %q %q, first answer %d %q %q", key, a.status, a.contentType, a.body, first.status, first.contentType, first.body)
	}
	if !a.replayed {
		return fmt.Errorf("repeat of %s not marked Idempotent-Replayed", key)
	}
	return nil
}

// field returns the text of s between the first prefix and the next end.
func field(s, prefix, end string) (string, bool) {
	_, rest, ok := strings.Cut(s, prefix)
	if !ok {
		return "", false
	}
	v, _, ok := strings.Cut(rest, end)
	return v, ok
}

// histogram counts latencies in buckets about 3% wide.
type histogram struct {
	counts [64 * 32]uint64
	n      uint64
}

func bucketOf(ns int64) int {
	if ns < 32 {
		return int(max(ns, 0))
	}
	e := bits.Len64(uint64(ns)) - 6 // keep the top 6 bits: 32 buckets an octave
	return e*32 + int(uint64(ns)>>e)
}

func bucketValue(i int) int64 {
	if i < 32 {
		return int64(i)
	}
	e := (i - 32) / 32
	m := int64((i-32)%32 + 32)
	return (m<<e + (m+1)<<e) / 2
}

func (h *histogram) add(d time.Duration) {
	h.counts[bucketOf(int64(d))]++
	h.n++
}

func (h *histogram) merge(o *histogram) {
	for i := range h.counts {
		h.counts[i] += o.counts[i]
	}
	h.n += o.n
}

// quantile returns the latency at quantile q (0 to 1).
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	want := uint64(q * float64(h.n))
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen > want {
			return time.Duration(bucketValue(i))
		}
	}
	return time.Duration(bucketValue(len(h.counts) - 1))
}

// phase is what a cell's requests do: fresh keys (every request a first
// run) or repeated keys (every request a repeat of a seeded key).
type phase string

const (
	fresh  phase = "first run"
	replay phase = "replay"
)

// load is the client side of one cell: conns connections sending
// requests for a fixed time.
type load struct {
	scenario string
	addr     string
	conns    int
	phase    phase
	prefix   string        // makes the cell's keys unique in the run
	keys     []string      // replay: the seeded keys
	firsts   []firstAnswer // replay: their first answers
}

// loadResult is the client's account of a cell.
type loadResult struct {
	requests int64
	elapsed  time.Duration
	hist     histogram
	runIDs   []int64 // run numbers of answers the handler produced
	errors   int64
	firstErr error
}

// seed sends each replay key once, over up to conns connections, and keeps
// the first answers.
func (l *load) seed(n int) error {
	l.keys = make([]string, n)
	l.firsts = make([]firstAnswer, n)
	for i := range l.keys {
		l.keys[i] = l.prefix + "-k" + strconv.Itoa(i)
	}
	var wg sync.WaitGroup
	errs := make(chan error, l.conns)
	for w := range min(l.conns, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := dial(l.addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.close()
			for i := w; i < n; i += l.conns {
				a, err := c.do(l.keys[i])
				if err == nil {
					_, err = checkFirst(a, l.keys[i])
				}
				if err != nil {
					errs <- fmt.Errorf("seeding: %w", err)
					return
				}
				l.firsts[i] = firstAnswer{a.status, a.contentType, string(a.body)}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// run drives the server for d and checks every answer.
func (l *load) run(d time.Duration) (*loadResult, error) {
	conns := make([]*conn, l.conns)
	for i := range conns {
		c, err := dial(l.addr)
		if err != nil {
			return nil, err
		}
		defer c.close()
		conns[i] = c
	}
	type workerResult struct {
		n      int64
		hist   histogram
		runIDs []int64
		errors int64
		err    error
	}
	results := make([]workerResult, l.conns)
	var stop atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	for w, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := &results[w]
			fail := func(err error) {
				res.errors++
				if res.err == nil {
					res.err = err
				}
			}
			keyBuf := []byte(l.prefix + "-w" + strconv.Itoa(w) + "-")
			base := len(keyBuf)
			for i := 0; !stop.Load(); i++ {
				var key string
				var first *firstAnswer
				if l.phase == replay {
					k := (w + i*l.conns) % len(l.keys)
					key, first = l.keys[k], &l.firsts[k]
				} else {
					key = string(strconv.AppendInt(keyBuf[:base], int64(i), 10))
				}
				t := time.Now()
				a, err := c.do(key)
				res.hist.add(time.Since(t))
				res.n++
				if err != nil {
					// The connection is in an unknown state: stop this worker.
					fail(err)
					return
				}
				if first != nil && idempotent(l.scenario) {
					if err := checkReplay(a, key, *first); err != nil {
						fail(err)
					}
					continue
				}
				run, err := checkFirst(a, key)
				if err != nil {
					fail(err)
					continue
				}
				res.runIDs = append(res.runIDs, run)
			}
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	out := &loadResult{elapsed: time.Since(start)}
	for i := range results {
		r := &results[i]
		out.requests += r.n
		out.hist.merge(&r.hist)
		out.runIDs = append(out.runIDs, r.runIDs...)
		out.errors += r.errors
		if out.firstErr == nil {
			out.firstErr = r.err
		}
	}
	// Every answer the handler produced must carry a run number of its own.
	slices.Sort(out.runIDs)
	for i := 1; i < len(out.runIDs); i++ {
		if out.runIDs[i] == out.runIDs[i-1] {
			out.errors++
			if out.firstErr == nil {
				out.firstErr = fmt.Errorf("two first runs got the answer of handler run %d", out.runIDs[i])
			}
		}
	}
	return out, nil
}
