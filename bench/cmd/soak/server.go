package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/redistest"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	idemredis "github.com/idemkey/idemkey/store/redis"
)

// Keys are "k<worker>-<seq>": the worker that made the key and its
// sequence number in that worker. The handler counts its runs per key in
// runCounts, indexed by the two numbers, at one byte a key.
const (
	chunkBits = 16
	chunkKeys = 1 << chunkBits // keys a chunk counts
	maxChunks = 1 << 12        // chunks a worker may use: 268 million keys
)

// chunk holds the run counts of chunkKeys keys, one byte each, four to a
// word.
type chunk [chunkKeys / 4]atomic.Uint32

// runCounts counts the handler's runs of every key the soak sends. A
// worker makes a key's chunk (ensure) before it first sends the key, so
// the handler only ever reads the chunk pointers.
type runCounts struct {
	workers []*[maxChunks]atomic.Pointer[chunk]
}

func newRunCounts(workers int) *runCounts {
	rc := &runCounts{workers: make([]*[maxChunks]atomic.Pointer[chunk], workers)}
	for i := range rc.workers {
		rc.workers[i] = new([maxChunks]atomic.Pointer[chunk])
	}
	return rc
}

func keyName(w int, seq int64) string {
	return "k" + strconv.Itoa(w) + "-" + strconv.FormatInt(seq, 10)
}

// parseKey returns the worker and sequence number of a key the soak made.
func (rc *runCounts) parseKey(key string) (w int, seq int64, ok bool) {
	ws, ss, ok := strings.Cut(strings.TrimPrefix(key, "k"), "-")
	if !ok {
		return 0, 0, false
	}
	w, err1 := strconv.Atoi(ws)
	seq, err2 := strconv.ParseInt(ss, 10, 64)
	if err1 != nil || err2 != nil || w < 0 || w >= len(rc.workers) || seq < 0 || seq>>chunkBits >= maxChunks {
		return 0, 0, false
	}
	return w, seq, true
}

// ensure makes the chunk that counts key seq of worker w. Only worker w
// calls it.
func (rc *runCounts) ensure(w int, seq int64) error {
	if seq>>chunkBits >= maxChunks {
		return fmt.Errorf("worker %d ran out of keys (%d)", w, seq)
	}
	p := &rc.workers[w][seq>>chunkBits]
	if p.Load() == nil {
		p.Store(new(chunk))
	}
	return nil
}

func (rc *runCounts) word(w int, seq int64) (*atomic.Uint32, uint, bool) {
	c := rc.workers[w][seq>>chunkBits].Load()
	if c == nil {
		return nil, 0, false
	}
	i := seq & (chunkKeys - 1)
	return &c[i/4], uint(i%4) * 8, true
}

// add counts one run of a key and returns its runs so far. A count stops
// being exact past 255 runs of one key, which would be 254 double runs
// already.
func (rc *runCounts) add(w int, seq int64) (int, bool) {
	p, shift, ok := rc.word(w, seq)
	if !ok {
		return 0, false
	}
	return int(p.Add(1<<shift) >> shift & 0xff), true
}

// get returns the runs of a key so far.
func (rc *runCounts) get(w int, seq int64) int {
	p, shift, ok := rc.word(w, seq)
	if !ok {
		return 0
	}
	return int(p.Load() >> shift & 0xff)
}

// app is the handler the middleware wraps: it reads the request body and
// answers 201 with a JSON document naming the key, the key's run number
// (1 unless the handler ran twice for it), a run id no other run has, and
// how many bytes of body it read, and when the run began (nanoseconds
// since epoch, on the monotonic clock), so that the soak can tell a second
// run inside the key's retention (a double run) from one after it, which
// the contract allows. A request with a Soak-Work header (a
// duration) makes it take that long, as a handler that writes to a
// database would: the soak sends it with pairs, so that the second half
// of a pair can find the first in flight.
type app struct {
	counts   *runCounts
	epoch    time.Time
	ids      atomic.Int64
	reruns   atomic.Int64 // runs of a key past its first
	failures *failures
}

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Since(a.epoch)
	n, err := io.Copy(io.Discard, r.Body)
	if err != nil {
		http.Error(w, "body", http.StatusBadRequest)
		return
	}
	if work, err := time.ParseDuration(r.Header.Get("Soak-Work")); err == nil && work > 0 {
		time.Sleep(min(work, time.Second))
	}
	key := r.Header.Get("Idempotency-Key")
	wk, seq, ok := a.counts.parseKey(key)
	var run int
	if ok {
		run, ok = a.counts.add(wk, seq)
	}
	if !ok {
		a.failures.add(&a.failures.failed, fmt.Sprintf("the handler ran for a key the soak did not make: %q", key))
		http.Error(w, "unknown key", http.StatusBadRequest)
		return
	}
	if run > 1 {
		// The client that gets this run's answer tells a double run from
		// a run after the key's retention.
		a.reruns.Add(1)
	}
	id := a.ids.Add(1)
	var buf [256]byte
	b := append(buf[:0], `{"key":"`...)
	b = append(b, key...) // the soak's keys need no escaping
	b = append(b, `","run":`...)
	b = strconv.AppendInt(b, int64(run), 10)
	b = append(b, `,"id":`...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, `,"at":`...)
	b = strconv.AppendInt(b, int64(at), 10)
	b = append(b, `,"bytes":`...)
	b = strconv.AppendInt(b, n, 10)
	b = append(b, "}\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+strconv.FormatInt(id, 10))
	w.WriteHeader(http.StatusCreated)
	w.Write(b)
}

// target is the idemkey middleware on one store, around the app, served
// over loopback.
type target struct {
	addr string
	// keys returns how many keys the store holds, claims and records, and
	// the bytes they take as the store counts them (-1 when it does not).
	keys  func() (n, bytes int64, err error)
	close func()
}

// config is what the soak runs against.
type config struct {
	store       string // memory or redis
	cache       bool
	cacheSize   int
	cacheTTL    time.Duration
	retention   time.Duration
	maxRecords  int
	maxBytes    int64 // 0: the store's default
	janitor     time.Duration
	redisBin    string
	redisMaxMem string
	pool        int
	// wrap, when set, wraps the store the middleware uses: the soak's
	// tests give it stores that break the contract, to see it caught.
	wrap func(store.Store) store.Store
}

func (c config) name() string {
	if c.cache {
		return c.store + "+cache"
	}
	return c.store
}

// startTarget builds the store and the middleware around a, and serves
// them on a free loopback port.
func startTarget(cfg config, a *app) (*target, error) {
	t := &target{}
	var closers []func()
	t.close = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	mwOpts := []middleware.Option{middleware.WithRetention(cfg.retention)}
	if cfg.cache {
		mwOpts = append(mwOpts, middleware.WithLocalCache(cfg.cacheSize, cfg.cacheTTL))
	}
	var st store.Store
	switch cfg.store {
	case "memory":
		opts := []memory.Option{memory.WithMaxRecords(cfg.maxRecords), memory.WithJanitorInterval(cfg.janitor)}
		if cfg.maxBytes > 0 {
			opts = append(opts, memory.WithMaxBytes(cfg.maxBytes))
		}
		mst, err := memory.New(opts...)
		if err != nil {
			return nil, err
		}
		closers = append(closers, func() { mst.Close() })
		t.keys = func() (int64, int64, error) {
			st, err := mst.Stats(context.Background())
			return st.Records + st.InFlight + st.Expired, st.Bytes, err
		}
		st = mst
	case "redis":
		var args []string
		if cfg.redisMaxMem != "" {
			args = append(args, "--maxmemory", cfg.redisMaxMem, "--maxmemory-policy", "noeviction")
		}
		srv, err := redistest.Launch(cfg.redisBin, args...)
		if err != nil {
			return nil, err
		}
		closers = append(closers, srv.Close)
		rdb := goredis.NewClient(&goredis.Options{
			Addr:                  srv.Addr,
			PoolSize:              cfg.pool,
			MinIdleConns:          cfg.pool / 4,
			ContextTimeoutEnabled: true,
		})
		closers = append(closers, func() { rdb.Close() })
		t.keys = func() (int64, int64, error) {
			reply, err := redistest.Do(srv.Addr, "DBSIZE")
			if err != nil {
				return 0, 0, err
			}
			n, err := strconv.ParseInt(reply, 10, 64)
			if err != nil {
				return 0, 0, err
			}
			info, err := redistest.Info(srv.Addr, "memory")
			if err != nil {
				return 0, 0, err
			}
			b, err := strconv.ParseInt(info["used_memory"], 10, 64)
			return n, b, err
		}
		if st, err = idemredis.New(rdb); err != nil {
			t.close()
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown store %q (have memory, redis)", cfg.store)
	}
	if cfg.wrap != nil {
		st = cfg.wrap(st)
	}
	mw, err := middleware.New(st, mwOpts...)
	if err != nil {
		t.close()
		return nil, err
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.close()
		return nil, err
	}
	t.addr = ln.Addr().String()
	srv := &http.Server{
		Handler:           mw.Required()(a),
		ReadHeaderTimeout: ioTimeout,
		IdleTimeout:       time.Minute,
		ErrorLog:          log.New(os.Stderr, "soak: server: ", 0),
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		srv.Serve(ln)
	}()
	// Stop the HTTP server first, then the store (closers run in reverse).
	closers = append(closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		wg.Wait()
	})
	return t, nil
}
