// Command load measures what idempotency costs a net/http service, side by
// side with the alternatives, in one run on one machine.
//
// It starts a redis-server of its own on a free loopback port, and one
// server process per scenario, each around the same handler (it reads a
// 1 KiB JSON body and answers 201 with a small JSON document):
//
//   - bare: the handler alone;
//   - floor: a hand-written layer that makes exactly the Redis calls idemkey
//     needs, a claim script and then a store script, and nothing else;
//   - typical: what most idempotency libraries do: GET the stored response,
//     SET NX a lock, run, SET the response, DEL the lock;
//   - typical+ap: the same on a go-redis auto-pipelined client, the stand-in
//     for the fastest peer measured (a library on an auto-pipelining
//     client);
//   - idemkey-memory, idemkey-redis, idemkey-redis+cache, idemkey-redis+ap:
//     idemkey's middleware on the memory store, on the Redis store, on the
//     Redis store with the local replay cache (middleware.WithLocalCache),
//     and on the Redis store with redis.WithAutoPipeline.
//
// With -scenarios postgres (or any of their names) it runs the PostgreSQL
// scenarios instead, on a cluster of its own (initdb on a free loopback
// port, as the postgres user when run as root), around the same handler
// with one INSERT of the payment: pg-bare (the handler in a transaction of
// its own, no idempotency), pg-typical (the hand-written pattern: SELECT,
// INSERT the key's row, the handler's INSERT, UPDATE, in one transaction),
// idemkey-pg (store/postgres as a plain store: the INSERT on its own) and
// idemkey-pg-tx (the INSERT in the request's transaction, committed with
// the record). Their table reports PostgreSQL round trips and the
// cluster's CPU per request.
//
// For each scenario it drives the server over keep-alive connections on
// loopback for a fixed time with fresh keys (every request a first run) and
// with repeated keys (every request a replay of a key seeded before), at
// each concurrency (-conns), in several rounds whose order rotates so that
// a change in the machine's load falls on every scenario alike. Every
// answer is checked: a first run must come from its own run of the handler
// (its key, the whole body, a run number no other answer has, and the
// server's count of handler runs must equal the number of first runs), and a
// replay must equal the first answer byte for byte, with
// Idempotent-Replayed: true, without running the handler. A scenario with
// any failed check is marked FAILED and the command exits 1.
//
// It prints the machine, then one table: requests per second and their
// ratio to bare and to floor in the same run, latency percentiles, server
// CPU per request (from the server process's getrusage), and Redis
// commands, command time (INFO commandstats) and Redis CPU (INFO cpu) per
// request. It stops by itself: every cell runs for -d, and the whole run is
// bounded by -timeout.
//
// Usage (from bench/):
//
//	go run ./cmd/load                      # every scenario, 16 and 64 connections, 3 rounds of 3 s
//	go run ./cmd/load -d 5s -rounds 5      # longer
//	go run ./cmd/load -scenarios bare,idemkey-redis -conns 64
//	go run ./cmd/load -scenarios postgres  # the PostgreSQL scenarios
//	go run ./cmd/load -svg out/ratios.svg  # the chart elsewhere (default load-targets.svg; "" for none)
//
// Beside the table it writes the targets' ratios as an SVG bar chart
// (-svg): one bar per target and concurrency, its target drawn across it.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemkey/idemkey/internal/pgtest"
	"github.com/idemkey/idemkey/internal/redistest"
)

func main() {
	log.SetFlags(0)
	var (
		d         = flag.Duration("d", 3*time.Second, "how long each cell (scenario, phase, concurrency) runs in each round")
		rounds    = flag.Int("rounds", 3, "rounds; each runs every cell once, scenarios in a rotating order")
		connsFlag = flag.String("conns", "16,64", "concurrencies: keep-alive connections, each with one request at a time")
		scFlag    = flag.String("scenarios", strings.Join(scenarios, ","), "scenarios to run")
		keys      = flag.Int("keys", 1024, "keys seeded for each replay cell")
		redisBin  = flag.String("redis-server", "redis-server", "the redis-server binary")
		timeout   = flag.Duration("timeout", 0, "bound on the whole run (default: 3x the planned time plus 2 minutes)")

		serveSc   = flag.String("serve", "", "internal: run as the server process of this scenario")
		redisAddr = flag.String("redis-addr", "", "internal: the Redis address for -serve")
		pgURL     = flag.String("pg-url", "", "internal: the PostgreSQL URL for -serve")
		pgFsync   = flag.Bool("pg-fsync", true, "run the PostgreSQL scenarios' cluster with fsync on, as in production (off: commits do not wait for the disk)")
		mysqlURL  = flag.String("mysql-url", "", "a MySQL or MariaDB server for the MySQL scenarios, as mysql://user@host:port/ (a database is made on it for the run, and dropped; it must allow the scenarios' connections, 4x the largest concurrency and more); default: a MariaDB the driver starts")
		pgBouncer = flag.Bool("pg-bouncer", false, "reach the PostgreSQL scenarios' cluster through a PgBouncer in transaction mode (a server connection per connection of the largest concurrency), with pgx in exec mode")
		pool      = flag.Int("pool", 64, "internal: go-redis pool size for -serve")
		cacheSize = flag.Int("cache", 10_000, "records the idemkey-redis+cache scenario keeps in its local replay cache")
		profile   = flag.String("cpuprofile", "", "write each server process's CPU profile, from the end of the warm-up on, to this directory, as SCENARIO.pprof")
		phasesF   = flag.String("phases", "first,replay", "phases to run: first (fresh keys), replay (repeated keys)")
		svgPath   = flag.String("svg", "load-targets.svg", `write the targets' ratios as an SVG bar chart to this file; "" writes none`)
	)
	flag.Parse()
	if *serveSc != "" {
		if err := serve(*serveSc, *redisAddr, *pgURL, *pool, *cacheSize, *profile); err != nil {
			log.Fatalf("load: serve %s: %v", *serveSc, err)
		}
		return
	}

	var connsList []int
	for _, s := range strings.Split(*connsFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 1024 {
			log.Fatalf("load: -conns: %q is not a concurrency from 1 to 1024", s)
		}
		connsList = append(connsList, n)
	}
	var scs []string
	for _, s := range strings.Split(*scFlag, ",") {
		s = strings.TrimSpace(s)
		switch {
		case s == "postgres":
			scs = append(scs, pgScenarios...)
		case s == "mysql":
			scs = append(scs, myScenarios...)
		case slices.Contains(scenarios, s), slices.Contains(pgScenarios, s), slices.Contains(myScenarios, s):
			scs = append(scs, s)
		default:
			log.Fatalf("load: unknown scenario %q (have %s, %s, %s, or postgres or mysql for all of those)", s,
				strings.Join(scenarios, ", "), strings.Join(pgScenarios, ", "), strings.Join(myScenarios, ", "))
		}
	}
	var phases []phase
	for _, s := range strings.Split(*phasesF, ",") {
		switch strings.TrimSpace(s) {
		case "first":
			phases = append(phases, fresh)
		case "replay":
			phases = append(phases, replay)
		default:
			log.Fatalf("load: -phases: %q is neither first nor replay", s)
		}
	}
	if *d <= 0 || *rounds < 1 || *keys < 1 || *cacheSize < 1 {
		log.Fatal("load: -d, -rounds, -keys and -cache must be positive")
	}
	maxConns := slices.Max(connsList)
	planned := time.Duration(*rounds*len(connsList)*len(phases)*len(scs))*(*d) + time.Duration(len(scs))*time.Second
	if *timeout == 0 {
		*timeout = 3*planned + 2*time.Minute
	}

	r := &runner{d: *d, keys: *keys}
	defer r.cleanup()
	// Stop by ourselves, whatever happens: on a signal, and at -timeout.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		r.cleanup()
		log.Fatalf("load: %v", s)
	}()
	watchdog := time.AfterFunc(*timeout, func() {
		r.cleanup()
		log.Fatalf("load: the run took longer than -timeout %v", *timeout)
	})
	defer watchdog.Stop()

	needRedis := slices.ContainsFunc(scs, usesRedis)
	var err error
	if needRedis {
		if r.redis, err = redistest.Launch(*redisBin); err != nil {
			log.Fatalf("load: %v", err)
		}
	}
	if slices.ContainsFunc(scs, usesPostgres) {
		if r.pg, err = launchPostgres(*pgFsync); err != nil {
			r.cleanup()
			log.Fatalf("load: %v", err)
		}
		r.pgURL = r.pg.URL
		if *pgBouncer {
			// One server connection per connection of the largest
			// concurrency, as the store's pool has: what is measured is
			// the pooler's hop, not a queue in it.
			if r.bouncer, err = pgtest.LaunchPgBouncer(r.pg.URL, pgtest.PoolSize(maxConns+8), pgtest.MaxClientConn(4*maxConns+64)); err != nil {
				r.cleanup()
				log.Fatalf("load: %v", err)
			}
			r.pgURL = r.bouncer.URL + "&default_query_exec_mode=exec"
		}
	}
	if slices.ContainsFunc(scs, usesMySQL) {
		if *mysqlURL != "" {
			r.my, err = launchMySQL(*mysqlURL)
		} else {
			r.my, err = launchMariaDB()
		}
		if err != nil {
			r.cleanup()
			log.Fatalf("load: %v", err)
		}
	}
	r.servers = map[string]*serverProc{}
	for _, sc := range scs {
		addr, url := "", ""
		if r.redis != nil {
			addr = r.redis.Addr
		}
		if r.pg != nil {
			url = r.pgURL
		}
		if usesMySQL(sc) {
			url = r.my.url
		}
		prof := ""
		if *profile != "" {
			prof = filepath.Join(*profile, sc+".pprof")
		}
		p, err := startServer(sc, addr, url, maxConns, *cacheSize, prof)
		if err != nil {
			r.cleanup()
			log.Fatalf("load: start %s: %v", sc, err)
		}
		r.servers[sc] = p
	}

	m := machine(r)
	fmt.Fprintf(os.Stderr, "load: %d scenarios x %d phases x %v connections x %d rounds of %v (about %v)\n",
		len(scs), len(phases), connsList, *rounds, *d, planned.Round(time.Second))

	// Warm up every server (go-redis pools, scripts cached, heaps grown):
	// a second of first runs at the largest concurrency, checked but not
	// counted.
	for _, sc := range scs {
		if _, err := r.cell(sc, maxConns, fresh, "warm", time.Second); err != nil {
			r.cleanup()
			log.Fatalf("load: warm-up of %s: %v", sc, err)
		}
	}
	if *profile != "" {
		for _, sc := range scs {
			if err := r.servers[sc].startProfile(); err != nil {
				r.cleanup()
				log.Fatalf("load: profile of %s: %v", sc, err)
			}
		}
	}
	results := map[cellKey]*cellAgg{}
	for round := 1; round <= *rounds; round++ {
		for _, conns := range connsList {
			for _, ph := range phases {
				order := rotate(scs, round-1)
				for _, sc := range order {
					c, err := r.cell(sc, conns, ph, "r"+strconv.Itoa(round), *d)
					if err != nil {
						r.cleanup()
						log.Fatalf("load: %s %s %d: %v", sc, ph, conns, err)
					}
					k := cellKey{sc, conns, ph}
					if results[k] == nil {
						results[k] = &cellAgg{}
					}
					results[k].add(c)
					fmt.Fprintf(os.Stderr, "load: round %d  %-20s %-9s %3d conns  %8.0f req/s  %d errors\n",
						round, sc, ph, conns, c.rate(), c.errors)
				}
			}
		}
	}
	m.loadAfter = loadAverage()
	failed, bars := report(os.Stdout, m, scs, connsList, phases, results, *d, *rounds)
	r.cleanup()
	if *svgPath != "" {
		title := fmt.Sprintf("idemkey load driver: req/s ratios against their baselines (%d rounds of %v)", *rounds, *d)
		if err := writeChartFile(*svgPath, title, bars); err != nil {
			log.Printf("load: -svg: %v", err)
			failed = true
		} else {
			fmt.Fprintf(os.Stderr, "load: chart of the targets written to %s\n", *svgPath)
		}
	}
	if failed {
		os.Exit(1)
	}
}

func rotate(s []string, n int) []string {
	n %= len(s)
	return append(slices.Clone(s[n:]), s[:n]...)
}

// runner holds the processes of a run.
type runner struct {
	d       time.Duration
	keys    int
	redis   *redistest.Server
	pg      *pgtest.Server
	bouncer *pgtest.PgBouncer // in front of pg, with -pg-bouncer
	pgURL   string            // how the servers reach pg
	my      *mysqlRun         // the MySQL scenarios' database
	servers map[string]*serverProc
	once    sync.Once
}

func (r *runner) cleanup() {
	r.once.Do(func() {
		for _, p := range r.servers {
			p.stop()
		}
		if r.redis != nil {
			r.redis.Close()
		}
		if r.bouncer != nil {
			r.bouncer.Close()
		}
		if r.pg != nil {
			r.pg.Close()
		}
		if r.my != nil {
			r.my.Close()
		}
	})
}

type cellKey struct {
	scenario string
	conns    int
	phase    phase
}

// cellAgg adds up a cell's rounds.
type cellAgg struct {
	requests  int64
	elapsed   time.Duration
	hist      histogram
	serverCPU time.Duration
	runs      int64
	redis     redisDelta
	sent      map[string]int64 // Redis commands the server process sent
	pgTrips   int64            // PostgreSQL round trips the server process made
	pgCPU     time.Duration    // the PostgreSQL cluster's CPU time
	// mem is what the server process allocated and its collector spent
	// (Live: the live heap after the cell's last round).
	mem      memStats
	errors   int64
	firstErr error
}

func (a *cellAgg) sentTotal() int64 {
	var n int64
	for _, v := range a.sent {
		n += v
	}
	return n
}

func (a *cellAgg) add(o *cellAgg) {
	a.requests += o.requests
	a.elapsed += o.elapsed
	a.hist.merge(&o.hist)
	a.serverCPU += o.serverCPU
	a.runs += o.runs
	a.redis.add(o.redis)
	a.pgTrips += o.pgTrips
	a.pgCPU += o.pgCPU
	a.mem.Objects += o.mem.Objects
	a.mem.Bytes += o.mem.Bytes
	a.mem.GCSeconds += o.mem.GCSeconds
	a.mem.Live = o.mem.Live
	if a.sent == nil {
		a.sent = map[string]int64{}
	}
	for k, v := range o.sent {
		a.sent[k] += v
	}
	a.errors += o.errors
	if a.firstErr == nil {
		a.firstErr = o.firstErr
	}
}

func (a *cellAgg) rate() float64 {
	if a.elapsed <= 0 {
		return 0
	}
	return float64(a.requests) / a.elapsed.Seconds()
}

func (a *cellAgg) per(x float64) float64 {
	if a.requests == 0 {
		return 0
	}
	return x / float64(a.requests)
}

// cell runs one scenario at one concurrency in one phase for d, and
// measures it.
func (r *runner) cell(sc string, conns int, ph phase, tag string, d time.Duration) (*cellAgg, error) {
	p := r.servers[sc]
	short := map[phase]string{fresh: "f", replay: "p"}[ph]
	l := &load{scenario: sc, addr: p.addr, conns: conns, phase: ph,
		prefix: fmt.Sprintf("%s-%s-c%d-%s", sc, tag, conns, short)}
	if ph == replay {
		if err := l.seed(r.keys); err != nil {
			return nil, err
		}
	}
	s0, err := p.stats()
	if err != nil {
		return nil, err
	}
	var rs0 redisStats
	if r.redis != nil {
		if rs0, err = readRedisStats(r.redis.Addr); err != nil {
			return nil, err
		}
	}
	var pg0 time.Duration
	var my0 int64
	switch {
	case usesMySQL(sc):
		if pg0, err = r.my.CPU(); err == nil {
			my0, err = r.my.trips()
		}
		if err != nil {
			return nil, err
		}
	case r.pg != nil:
		if pg0, err = r.pg.CPU(); err != nil {
			return nil, err
		}
	}
	res, err := l.run(d)
	if err != nil {
		return nil, err
	}
	s1, err := p.stats()
	if err != nil {
		return nil, err
	}
	c := &cellAgg{requests: res.requests, elapsed: res.elapsed, hist: res.hist,
		serverCPU: time.Duration(s1.CPUNs - s0.CPUNs), runs: s1.Runs - s0.Runs,
		errors: res.errors, firstErr: res.firstErr, sent: map[string]int64{},
		pgTrips: s1.PGTrips - s0.PGTrips,
		mem: memStats{Objects: s1.Memory.Objects - s0.Memory.Objects, Bytes: s1.Memory.Bytes - s0.Memory.Bytes,
			GCSeconds: s1.Memory.GCSeconds - s0.Memory.GCSeconds, Live: s1.Memory.Live}}
	switch {
	case usesMySQL(sc):
		my1, err := r.my.trips()
		if err != nil {
			return nil, err
		}
		cpu1, err := r.my.CPU()
		if err != nil {
			return nil, err
		}
		c.pgTrips, c.pgCPU = my1-my0-1, cpu1-pg0 // (the first trips query counts itself)
	case r.pg != nil:
		pg1, err := r.pg.CPU()
		if err != nil {
			return nil, err
		}
		c.pgCPU = pg1 - pg0
	}
	for name, n := range s1.Sent {
		if dn := n - s0.Sent[name]; dn > 0 {
			c.sent[name] = dn
		}
	}
	if r.redis != nil {
		rs1, err := readRedisStats(r.redis.Addr)
		if err != nil {
			return nil, err
		}
		c.redis = rs0.delta(rs1)
	}
	// Exactly once: the handler ran once for every first run, and never
	// for a replay.
	want := res.requests
	if ph == replay && idempotent(sc) {
		want = 0
	}
	if c.runs != want {
		c.errors++
		if c.firstErr == nil {
			c.firstErr = fmt.Errorf("the handler ran %d times for %d requests (want %d)", c.runs, res.requests, want)
		}
	}
	return c, nil
}

// serverProc is one scenario's server process.
type serverProc struct {
	scenario  string
	cmd       *exec.Cmd
	stdin     io.WriteCloser
	addr, ctl string
	done      chan struct{}
	client    *http.Client
}

func startServer(sc, redisAddr, pgURL string, pool, cacheSize int, profile string) (*serverProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-serve", sc, "-redis-addr", redisAddr, "-pg-url", pgURL, "-pool", strconv.Itoa(pool),
		"-cache", strconv.Itoa(cacheSize), "-cpuprofile", profile)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &serverProc{scenario: sc, cmd: cmd, stdin: stdin, done: make(chan struct{}),
		client: &http.Client{Timeout: 10 * time.Second}}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err == nil {
			f := strings.Fields(line)
			if len(f) == 3 && f[0] == "ready" {
				p.addr, p.ctl = f[1], f[2]
			} else {
				err = fmt.Errorf("server said %q", line)
			}
		}
		ready <- err
		io.Copy(io.Discard, stdout)
		cmd.Wait()
		close(p.done)
	}()
	select {
	case err = <-ready:
	case <-time.After(30 * time.Second):
		err = errors.New("server did not start within 30s")
	}
	if err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// stop closes the server's standard input, which makes it shut down, and
// kills it by its PID if it has not exited within 3 seconds.
func (p *serverProc) stop() {
	p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(3 * time.Second):
		syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func (p *serverProc) stats() (serverStats, error) {
	var s serverStats
	resp, err := p.client.Get("http://" + p.ctl + "/stats")
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// startProfile starts the server's CPU profile (-cpuprofile).
func (p *serverProc) startProfile() error {
	resp, err := p.client.Post("http://"+p.ctl+"/profile", "", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return nil
}

// machineInfo describes where the run ran.
type machineInfo struct {
	cpus       int
	model      string
	goVersion  string
	redis      string
	postgres   string
	mysql      string
	loadBefore string
	loadAfter  string
}

func machine(r *runner) *machineInfo {
	m := &machineInfo{cpus: runtime.NumCPU(), goVersion: runtime.Version(), loadBefore: loadAverage()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.model = strings.TrimSpace(v)
				break
			}
		}
	}
	if r.redis != nil {
		if info, err := redistest.Info(r.redis.Addr, "server"); err == nil {
			m.redis = info["redis_version"]
		}
	}
	if r.my != nil {
		m.mysql = r.my.version
	}
	if r.pg != nil {
		m.postgres = postgresVersion(r.pg.URL)
		if r.bouncer != nil {
			m.postgres += " through PgBouncer " + r.bouncer.Version + " (transaction mode)"
		}
	}
	return m
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// report prints the machine, the table and the targets, reports whether
// any check failed, and returns the targets measured, for the chart.
func report(w io.Writer, m *machineInfo, scs []string, connsList []int, phases []phase, results map[cellKey]*cellAgg, d time.Duration, rounds int) (bool, []ratioBar) {
	fmt.Fprintf(w, "machine: %d CPUs, %s; %s; Redis %s; PostgreSQL %s; MySQL %s; load average %s before, %s after\n",
		m.cpus, cmp.Or(m.model, "unknown CPU"), m.goVersion, cmp.Or(m.redis, "-"), cmp.Or(m.postgres, "-"), cmp.Or(m.mysql, "-"), m.loadBefore, m.loadAfter)
	fmt.Fprintf(w, "each row: %d rounds of %v; 1 KiB JSON POST, 201 with a 90-byte JSON answer\n\n", rounds, d)
	var pgs, mys []string
	pgs, scs = splitFunc(scs, usesPostgres)
	mys, scs = splitFunc(scs, usesMySQL)
	failed := false
	var bars []ratioBar
	if len(scs) > 0 {
		failed, bars = reportRedis(w, scs, connsList, phases, results)
	}
	if len(pgs) > 0 {
		if len(scs) > 0 {
			fmt.Fprintln(w)
		}
		pgFailed, pgBars := reportPostgres(w, pgs, connsList, phases, results)
		failed = failed || pgFailed
		bars = append(bars, pgBars...)
	}
	if len(mys) > 0 {
		if len(scs)+len(pgs) > 0 {
			fmt.Fprintln(w)
		}
		myFailed, myBars := reportMySQL(w, m.mysql, mys, connsList, phases, results)
		failed = failed || myFailed
		bars = append(bars, myBars...)
	}
	return failed, bars
}

// reportRedis prints the table, the commands and the targets of the
// scenarios that are not PostgreSQL's, reports whether a check failed, and
// returns the targets measured.
func reportRedis(w io.Writer, scs []string, connsList []int, phases []phase, results map[cellKey]*cellAgg) (bool, []ratioBar) {
	fmt.Fprintln(w, "| conns | keys | scenario | req/s | x bare | x floor | p50 ms | p99 ms | server us/req | Redis cmds/req | Redis cmd us/req | Redis CPU us/req | checks |")
	fmt.Fprintln(w, "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	failed := false
	for _, conns := range connsList {
		for _, ph := range phases {
			bare := results[cellKey{scBare, conns, ph}]
			fl := results[cellKey{scFloor, conns, ph}]
			for _, sc := range scs {
				c := results[cellKey{sc, conns, ph}]
				check := "ok"
				if c.errors > 0 {
					failed = true
					check = fmt.Sprintf("FAILED (%d): %v", c.errors, c.firstErr)
				}
				fmt.Fprintf(w, "| %d | %s | %s | %.0f | %s | %s | %.2f | %.2f | %.1f | %.2f | %.1f | %.1f | %s |\n",
					conns, ph, sc, c.rate(), ratio(c, bare), ratio(c, fl),
					ms(c.hist.quantile(0.5)), ms(c.hist.quantile(0.99)),
					c.per(float64(c.serverCPU.Microseconds())),
					c.per(float64(c.sentTotal())), c.per(c.redis.sentUsec(c.sent)), c.per(c.redis.cpu*1e6),
					check)
			}
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Redis commands per request at the largest concurrency: sent by the server, and run inside Redis (scripts' commands included)")
	conns := slices.Max(connsList)
	for _, ph := range phases {
		for _, sc := range scs {
			c := results[cellKey{sc, conns, ph}]
			if c.sentTotal() == 0 && len(c.redis.calls) == 0 {
				continue
			}
			fmt.Fprintf(w, "  %-9s %-20s sent: %s; run: %s\n", ph, sc, perRequest(c, c.sent), perRequest(c, c.redis.calls))
		}
	}
	printMemory(w, scs, connsList, phases, results)
	return failed, targets(w, scs, connsList, phases, results)
}

// printMemory prints, for every cell, what the server process allocated
// per request and what its collector spent, and its live heap after the
// cell: the cost of memory under load, which an in-process benchmark of
// one request does not show.
func printMemory(w io.Writer, scs []string, connsList []int, phases []phase, results map[cellKey]*cellAgg) {
	fmt.Fprintln(w, "\nServer memory per request (heap allocations and bytes, the collector's CPU), and the live heap after the cell:")
	for _, conns := range connsList {
		for _, ph := range phases {
			for _, sc := range scs {
				c := results[cellKey{sc, conns, ph}]
				fmt.Fprintf(w, "  %2d %-9s %-20s %5.1f allocs %6.0f B  GC %5.1f us  live %4.0f MB\n", conns, ph, sc,
					c.per(float64(c.mem.Objects)), c.per(float64(c.mem.Bytes)), c.per(c.mem.GCSeconds*1e6), float64(c.mem.Live)/(1<<20))
			}
		}
	}
}

// targets prints the ratios the project holds itself to, each against its
// target, at every concurrency, and returns them.
func targets(w io.Writer, scs []string, connsList []int, phases []phase, results map[cellKey]*cellAgg) []ratioBar {
	var ts []target
	for _, ph := range phases {
		memory, floor := 0.62, 0.95
		if ph == replay {
			memory, floor = 0.75, 1.0
		}
		ts = append(ts,
			target{"idemkey-redis / floor", scRedis, scFloor, ph, floor},
			target{"idemkey-redis / typical", scRedis, scTypical, ph, 1.0},
			target{"idemkey-redis+ap / floor", scRedisAP, scFloor, ph, 1.3},
			target{"idemkey-redis+ap / typical+ap", scRedisAP, scTypicalAP, ph, 1.2},
			target{"idemkey-memory / bare", scMemory, scBare, ph, memory})
	}
	if slices.Contains(phases, replay) {
		ts = append(ts, target{"idemkey-redis+cache / bare", scRedisCache, scBare, replay, 0.85})
	}
	bars := measure(ts, scs, connsList, phases, results)
	printTargets(w, 32, bars)
	if slices.Contains(scs, scMemory) && slices.Contains(scs, scBare) {
		// What the middleware itself costs: the server's CPU per request
		// on the memory store over the bare handler's.
		fmt.Fprintln(w, "\nServer CPU idemkey-memory adds over bare (us/req; target first run <= 10, replay <= 6; * marks a miss):")
		for _, ph := range phases {
			limit := 10.0
			if ph == replay {
				limit = 6
			}
			var parts []string
			for _, conns := range connsList {
				m, b := results[cellKey{scMemory, conns, ph}], results[cellKey{scBare, conns, ph}]
				added := m.per(float64(m.serverCPU.Microseconds())) - b.per(float64(b.serverCPU.Microseconds()))
				mark := ""
				if added > limit {
					mark = "*"
				}
				parts = append(parts, fmt.Sprintf("%d conns %.1f%s", conns, added, mark))
			}
			fmt.Fprintf(w, "  %-9s %s\n", ph, strings.Join(parts, ", "))
		}
	}
	return bars
}

func perRequest(c *cellAgg, m map[string]int64) string {
	var parts []string
	for _, name := range slices.Sorted(mapKeys(m)) {
		parts = append(parts, fmt.Sprintf("%s %.2f", name, c.per(float64(m[name]))))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func ratio(c, base *cellAgg) string {
	if c == nil || base == nil || base.rate() == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", c.rate()/base.rate())
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
