package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"os"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store/memory"
	idemredis "github.com/idemkey/idemkey/store/redis"
)

// The scenarios, in the order the table lists them. Each runs in a server
// process of its own, so that its CPU time is its own.
const (
	scBare       = "bare"
	scFloor      = "floor"
	scTypical    = "typical"
	scMemory     = "idemkey-memory"
	scRedis      = "idemkey-redis"
	scRedisCache = "idemkey-redis+cache"
	// The pipelined pair: idemkey's Redis store with WithAutoPipeline, and
	// the typical pattern on a go-redis auto-pipelined client, standing in
	// for the fastest peer measured (a library on an auto-pipelining
	// client, four commands per first run, not exactly-once).
	scRedisAP   = "idemkey-redis+ap"
	scTypicalAP = "typical+ap"
)

var scenarios = []string{scBare, scFloor, scTypical, scTypicalAP, scMemory, scRedis, scRedisCache, scRedisAP}

// usesRedis reports whether a scenario keeps its keys in Redis.
func usesRedis(sc string) bool {
	return sc != scBare && sc != scMemory && !usesPostgres(sc) && !usesMySQL(sc)
}

// idempotent reports whether a scenario answers a repeated key with the
// first answer (every one but bare and pg-bare).
func idempotent(sc string) bool { return sc != scBare && sc != scPgBare && sc != scMyBare }

// Settings every scenario shares.
const (
	claimTTL  = 35 * time.Second // idemkey's default deadline (30 s) plus its claim margin
	retention = 24 * time.Hour   // idemkey's default
	maxBody   = 1 << 20          // request body limit, idemkey's default
	// cacheTTL is the life of an entry in idemkey's local replay cache in
	// the idemkey-redis+cache scenario; -cache sets its size.
	cacheTTL = time.Minute
)

// app is the handler every scenario wraps: it reads the request body and
// answers 201 with a small JSON document that names the key it saw and a
// run number, so that the driver can tell every run of the handler apart.
// It counts its runs for the driver's exactly-once check.
type app struct {
	runs atomic.Int64
}

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, err := io.Copy(io.Discard, r.Body)
	if err != nil {
		http.Error(w, "body", http.StatusBadRequest)
		return
	}
	run := a.runs.Add(1)
	var buf [512]byte
	b := append(buf[:0], `{"id":"pay_`...)
	b = strconv.AppendInt(b, run, 10)
	b = append(b, `","key":"`...)
	b = append(b, r.Header.Get("Idempotency-Key")...) // the driver's keys need no escaping
	b = append(b, `","bytes":`...)
	b = strconv.AppendInt(b, n, 10)
	b = append(b, `,"status":"created"}`...)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(b)
}

// serverStats is what a server process reports on its control port.
type serverStats struct {
	Runs  int64 `json:"runs"`  // handler runs so far
	CPUNs int64 `json:"cpuNs"` // user plus system time of the process so far
	// Sent counts the Redis commands the process sent so far, by name:
	// the round trips, as against the commands scripts run inside Redis,
	// which INFO commandstats counts too.
	Sent map[string]int64 `json:"sent"`
	// PGTrips counts the PostgreSQL round trips the process made so far
	// (queries and batches).
	PGTrips int64 `json:"pgTrips"`
	// Memory is what the process allocated and what its collector did so
	// far (runtime/metrics).
	Memory memStats `json:"memory"`
}

// commandCounter is a go-redis hook that counts the commands a client
// sends, by name.
type commandCounter struct {
	mu sync.Mutex
	n  map[string]int64
}

func (c *commandCounter) count(name string) {
	c.mu.Lock()
	c.n[name]++
	c.mu.Unlock()
}

func (c *commandCounter) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

func (c *commandCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (c *commandCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		c.count(cmd.Name())
		return next(ctx, cmd)
	}
}

func (c *commandCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		for _, cmd := range cmds {
			c.count(cmd.Name())
		}
		return next(ctx, cmds)
	}
}

// memStats is what a process allocated, and what its collector spent, so
// far: heap allocations (objects and bytes), the collector's CPU (its
// background and assist work, as runtime/metrics estimates it), and the
// heap's live bytes at the last collection.
type memStats struct {
	Objects   uint64  `json:"objects"`
	Bytes     uint64  `json:"bytes"`
	GCSeconds float64 `json:"gcSeconds"`
	Live      uint64  `json:"live"`
}

var memSamples = []metrics.Sample{
	{Name: "/gc/heap/allocs:objects"},
	{Name: "/gc/heap/allocs:bytes"},
	{Name: "/cpu/classes/gc/total:cpu-seconds"},
	{Name: "/gc/heap/live:bytes"},
}

var memMu sync.Mutex

func processMemory() memStats {
	memMu.Lock()
	defer memMu.Unlock()
	metrics.Read(memSamples)
	return memStats{
		Objects:   memSamples[0].Value.Uint64(),
		Bytes:     memSamples[1].Value.Uint64(),
		GCSeconds: memSamples[2].Value.Float64(),
		Live:      memSamples[3].Value.Uint64(),
	}
}

func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// serve is the server process of one scenario: it listens on two loopback
// ports, the scenario's and a control port for the driver's /stats, prints
// "ready <addr> <control addr>" and serves until its standard input closes
// (the driver exits or closes it).
func serve(sc, redisAddr, pgURL string, poolSize, cacheSize int, profile string) error {
	a := &app{}
	counter := &commandCounter{n: map[string]int64{}}
	trips := &trips{}
	var h http.Handler
	var closeFn func()
	var err error
	switch {
	case usesMySQL(sc):
		if pgURL == "" {
			return errors.New("scenario " + sc + " needs -pg-url (the MySQL URL)")
		}
		h, closeFn, err = myHandler(sc, a, pgURL, poolSize)
	case usesPostgres(sc):
		if pgURL == "" {
			return errors.New("scenario " + sc + " needs -pg-url")
		}
		h, closeFn, err = pgHandler(sc, a, pgURL, poolSize, trips)
	default:
		h, closeFn, err = scenarioHandler(sc, a, redisAddr, poolSize, cacheSize, counter)
	}
	if err != nil {
		return err
	}
	defer closeFn()
	// The CPU profile starts when the driver asks for it, after the
	// warm-up, so that it holds the measured cells alone.
	var prof struct {
		sync.Mutex
		f *os.File
	}
	startProfile := func() error {
		prof.Lock()
		defer prof.Unlock()
		if prof.f != nil {
			return nil
		}
		f, err := os.Create(profile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return err
		}
		prof.f = f
		return nil
	}
	defer func() {
		prof.Lock()
		defer prof.Unlock()
		if prof.f != nil {
			pprof.StopCPUProfile()
			prof.f.Close()
			// The allocations since the process began (the warm-up's
			// too), sampled as the runtime samples them.
			if f, err := os.Create(strings.TrimSuffix(profile, ".pprof") + ".allocs.pprof"); err == nil {
				pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
		}
	}()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	ctl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(os.Stderr, sc+": ", 0)}
	go srv.Serve(ln)
	ctlMux := http.NewServeMux()
	ctlMux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(serverStats{Runs: a.runs.Load(), CPUNs: processCPU(), Sent: counter.snapshot(), PGTrips: trips.Count(), Memory: processMemory()})
	})
	ctlMux.HandleFunc("POST /profile", func(w http.ResponseWriter, r *http.Request) {
		if profile == "" {
			http.Error(w, "no -cpuprofile", http.StatusConflict)
			return
		}
		if err := startProfile(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	go http.Serve(ctl, ctlMux)
	fmt.Printf("ready %s %s\n", ln.Addr(), ctl.Addr())
	// Serve until the driver closes standard input.
	io.Copy(io.Discard, bufio.NewReader(os.Stdin))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	srv.Shutdown(ctx)
	return nil
}

// newRedisClient returns the go-redis client every Redis scenario uses:
// the same options for all, the pool sized to the driver's largest
// concurrency, and ContextTimeoutEnabled as the idemkey store asks.
func newRedisClient(addr string, poolSize int) *goredis.Client {
	return goredis.NewClient(&goredis.Options{
		Addr:                  addr,
		PoolSize:              poolSize,
		MinIdleConns:          poolSize / 4,
		ContextTimeoutEnabled: true,
	})
}

// scenarioHandler builds the handler of scenario sc around a.
func scenarioHandler(sc string, a *app, redisAddr string, poolSize, cacheSize int, counter *commandCounter) (http.Handler, func(), error) {
	nop := func() {}
	switch sc {
	case scBare:
		return a, nop, nil
	case scMemory:
		st, err := memory.New(memory.WithMaxRecords(8_000_000), memory.WithMaxBytes(16<<30))
		if err != nil {
			return nil, nil, err
		}
		mw, err := middleware.New(st)
		if err != nil {
			return nil, nil, err
		}
		return mw.Required()(a), func() { st.Close() }, nil
	}
	if redisAddr == "" {
		return nil, nil, errors.New("scenario " + sc + " needs -redis")
	}
	rdb := newRedisClient(redisAddr, poolSize)
	rdb.AddHook(counter)
	closeFn := func() { rdb.Close() }
	switch sc {
	case scFloor:
		return &floor{rdb: rdb, next: a}, closeFn, nil
	case scTypical:
		return &typical{rdb: rdb, next: a}, closeFn, nil
	case scTypicalAP:
		ap, err := rdb.AutoPipeline()
		if err != nil {
			return nil, nil, err
		}
		return &typical{rdb: ap, next: a}, func() { ap.Close(); rdb.Close() }, nil
	case scRedis, scRedisCache, scRedisAP:
		var sopts []idemredis.Option
		if sc == scRedisAP {
			sopts = append(sopts, idemredis.WithAutoPipeline())
		}
		st, err := idemredis.New(rdb, sopts...)
		if err != nil {
			return nil, nil, err
		}
		var opts []middleware.Option
		if sc == scRedisCache {
			opts = append(opts, middleware.WithLocalCache(cacheSize, cacheTTL))
		}
		mw, err := middleware.New(st, opts...)
		if err != nil {
			return nil, nil, err
		}
		return mw.Required()(a), closeFn, nil
	}
	return nil, nil, fmt.Errorf("unknown scenario %q", sc)
}
