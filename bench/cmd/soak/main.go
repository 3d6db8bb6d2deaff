// Command soak runs idemkey's middleware under churn for minutes and checks
// that every key's handler runs at most once.
//
// It serves the middleware on one store, around a handler that counts its
// runs per key, over loopback, and drives it with client goroutines (32 by
// default), each on two keep-alive connections. About 10 % of the requests
// repeat a key sent before, from a moment to half the retention before:
// some as the second half of a pair sent at the same moment as the key's
// first request (so that one may find the other in flight and get 409),
// some with the same document with its members reordered (a replay is
// due), some with a changed body (422 is due), the rest as sent; the
// others carry fresh keys. Records are kept for a short retention
// (-retention, 10 s), so the store's size levels off; the memory store is
// bounded (-max-records, -max-bytes), so that when it fills, claims are
// refused with 503.
//
// Every answer is checked:
//
//   - an answer from a run of the handler is the key's first run (the
//     handler numbers a key's runs), it names the key, the handler read the
//     whole body, and the handler ran once while the request was out;
//   - a replay (Idempotent-Replayed: true) equals the key's first answer
//     in status, body and every header but Date and X-Request-Id, and the
//     handler did not run for it;
//   - a 409 is a problem answer with Retry-After, and is retried (at once,
//     with a short backoff) until the answer is something else, which is
//     then checked as any other;
//   - a changed body gets 422, and the body a key was first sent with never
//     does;
//   - a 503 is a correct refusal, never a failure, but the handler must not
//     run for it; a later repeat of the key may run it, once.
//
// Double runs are runs of the handler for a key past its first that began
// inside the key's retention, counted from when the key was first sent
// (the handler numbers a key's runs and stamps when each began). A run
// after the retention is allowed and counted apart: it takes a stall of
// the machine longer than half the retention between a repeat's pick and
// its claim. Wrong replays are repeats not answered with the key's first
// answer. The soak prints a row at the start, the middle and the end:
// requests per second since the row before, the counts so far, the
// process's goroutines, its heap in use after a garbage collection, and
// the keys and bytes the store holds. It exits 1 on any double run, wrong
// replay or other failed check.
//
// Usage (from bench/):
//
//	go run ./cmd/soak -store memory -d 5m
//	go run ./cmd/soak -store memory -cache -d 5m   # with middleware.WithLocalCache
//	go run ./cmd/soak -store redis -d 5m           # a redis-server of its own, on a free loopback port
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	log.SetFlags(0)
	var (
		storeF    = flag.String("store", "memory", "the store: memory or redis (a redis-server of the soak's own)")
		cache     = flag.Bool("cache", false, "add middleware.WithLocalCache")
		cacheSize = flag.Int("cache-size", 10_000, "records the local cache keeps (with -cache)")
		cacheTTL  = flag.Duration("cache-ttl", time.Minute, "how long the local cache keeps a record (with -cache; never past its retention)")
		d         = flag.Duration("d", 5*time.Minute, "how long the soak runs")
		clients   = flag.Int("clients", 32, "client goroutines, each with two keep-alive connections")
		reuse     = flag.Float64("reuse", 0.10, "share of requests that repeat a key sent before (pairs and changed bodies included)")
		pairs     = flag.Float64("pairs", 0.03, "share of requests that are the second half of a pair: a fresh key sent twice at the same moment")
		changedF  = flag.Float64("changed", 0.03, "share of requests that repeat a key with a changed body")
		retention = flag.Duration("retention", 10*time.Second, "how long records are kept (middleware.WithRetention); keys are repeated only within half of it")
		maxRec    = flag.Int("max-records", 150_000, "memory store: the bound on claims and records (memory.WithMaxRecords)")
		maxBytes  = flag.Int64("max-bytes", 0, "memory store: the bound on the bytes they take (memory.WithMaxBytes); 0 for the store's default, 256 MiB")
		janitor   = flag.Duration("janitor", 2*time.Second, "memory store: how often expired entries are removed (memory.WithJanitorInterval)")
		redisBin  = flag.String("redis-server", "redis-server", "redis store: the redis-server binary")
		redisMem  = flag.String("redis-maxmemory", "", "redis store: a maxmemory for the server (noeviction), to make claims meet a full Redis; default none")
		startAt   = flag.Duration("start", 0, "when the start row is taken (default: a tenth of -d, at most 10 s)")
		every     = flag.Duration("every", 30*time.Second, "how often a progress line goes to standard error")
		ring      = flag.Int("recent", 1024, "keys each client remembers to repeat")
		memProf   = flag.String("memprofile", "", "write a heap profile here at the end, while the clients still run")
		pairWork  = flag.Duration("pair-work", 5*time.Millisecond, "how long the handler takes for a pair's key (at most 1s), so that the pair's second request can find the first in flight; 0 for no wait")
	)
	flag.Parse()
	if *d <= 0 || *clients < 1 || *retention <= 0 || *maxRec < 1 || *maxBytes < 0 || *janitor <= 0 || *every <= 0 || *ring < 1 || *cacheSize < 1 || *cacheTTL <= 0 {
		log.Fatal("soak: -d, -clients, -retention, -max-records, -janitor, -every, -recent, -cache-size and -cache-ttl must be positive, -max-bytes not negative")
	}
	m, err := newMix(*reuse, *pairs, *changedF)
	if err != nil {
		log.Fatalf("soak: %v", err)
	}
	if *startAt <= 0 {
		*startAt = min(10*time.Second, *d/10)
	}
	if *startAt >= *d/2 {
		log.Fatal("soak: -start must come before the middle of -d")
	}
	o := options{
		cfg: config{
			store: *storeF, cache: *cache, cacheSize: *cacheSize, cacheTTL: *cacheTTL,
			retention: *retention, maxRecords: *maxRec, maxBytes: *maxBytes, janitor: *janitor,
			redisBin: *redisBin, redisMaxMem: *redisMem, pool: 2 * *clients,
		},
		d: *d, startAt: *startAt, every: *every, clients: *clients, mix: m,
		ring: *ring, pairWork: *pairWork, progress: os.Stderr, memProfile: *memProf,
	}
	fmt.Fprintf(os.Stderr, "soak: %s, %v, %d clients, retention %v; machine: %s\n", o.cfg.name(), *d, *clients, *retention, machine())
	res, err := soak(o)
	if err != nil {
		log.Fatalf("soak: %v", err)
	}

	fmt.Printf("soak: %s, %v, %d clients, retention %v%s; %s\n", o.cfg.name(), d.Round(time.Second), *clients, *retention, storeNote(o.cfg), machine())
	fmt.Printf("mix: %s\n\n", mixLine(res.tally))
	printTable(os.Stdout, o.cfg.name(), res.rows)
	fmt.Printf("\nafter the clients closed their connections: %d goroutines\n", res.idle)
	if !res.ok() {
		last := res.last()
		fmt.Printf("\nFAILED: %d double runs, %d wrong replays, %d other failed checks\n", last.doubleRuns, last.wrongReplays, last.failed)
		for _, n := range res.notes {
			fmt.Println("  " + n)
		}
		if res.dropped > 0 {
			fmt.Printf("  (%d more)\n", res.dropped)
		}
		os.Exit(1)
	}
	fmt.Println("\nok: no double run, no wrong replay, every answer checked")
}

// options is one soak.
type options struct {
	cfg      config
	d        time.Duration // how long the workers run
	startAt  time.Duration // when the start row is taken
	every    time.Duration // how often a progress line is written
	clients  int
	mix      mix
	ring     int
	pairWork time.Duration
	progress io.Writer // progress lines; nil for none
	// memProfile, when set, is where a heap profile is written at the end,
	// before the clients stop.
	memProfile string
}

// result is what a soak found.
type result struct {
	rows    []row // start, middle, end
	tally   *tally
	idle    int // goroutines after the clients closed their connections
	notes   []string
	dropped int
}

func (r *result) last() row { return r.rows[len(r.rows)-1] }

// ok reports that no check failed.
func (r *result) ok() bool {
	l := r.last()
	return l.doubleRuns == 0 && l.wrongReplays == 0 && l.failed == 0
}

// soak serves the middleware on the configured store, drives it for o.d
// and returns the rows and the failures.
func soak(o options) (*result, error) {
	f := &failures{}
	a := &app{counts: newRunCounts(o.clients), epoch: time.Now(), failures: f}
	t, err := startTarget(o.cfg, a)
	if err != nil {
		return nil, err
	}
	var once sync.Once
	cleanup := func() { once.Do(t.close) }
	defer cleanup()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer func() {
		signal.Stop(sig)
		close(sig)
	}()
	go func() {
		if s, ok := <-sig; ok {
			cleanup()
			log.Fatalf("soak: %v", s)
		}
	}()
	// The workers stop at o.d; a 409 may hold one for up to claimLife more.
	watchdog := time.AfterFunc(o.d+claimLife+30*time.Second, func() {
		cleanup()
		log.Fatalf("soak: the workers did not stop within %v of the end", claimLife+30*time.Second)
	})
	defer watchdog.Stop()

	drv := &driver{addr: t.addr, counts: a.counts, mix: o.mix, maxAge: o.cfg.retention / 2, retention: o.cfg.retention, epoch: a.epoch, ring: o.ring, pairWork: o.pairWork, f: f}
	workers := make([]*worker, o.clients)
	for i := range workers {
		if workers[i], err = drv.newWorker(i); err != nil {
			for _, w := range workers[:i] {
				w.close()
			}
			return nil, err
		}
	}

	s := &sampler{t: t, drv: drv, a: a}
	s.prev = s.take("zero", 0) // the baseline of the start row's rate
	began := time.Now()
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run()
		}()
	}

	marks := []struct {
		name string
		at   time.Duration
	}{{"start", o.startAt}, {"middle", o.d / 2}}
	progress := time.NewTicker(o.every)
	defer progress.Stop()
	end := time.After(o.d)
	next := time.After(marks[0].at)
	res := &result{}
	var last row
loop:
	for {
		select {
		case <-next:
			r := s.take(marks[0].name, time.Since(began))
			res.rows = append(res.rows, r)
			s.prev = r
			marks = marks[1:]
			if len(marks) > 0 {
				next = time.After(marks[0].at - time.Since(began))
			} else {
				next = nil
			}
		case <-progress.C:
			if o.progress != nil {
				s.progress(o.progress, time.Since(began))
			}
		case <-end:
			// The process as it runs at the end; the counts come after
			// the workers stop, so that they include every answer.
			last = s.take("end", time.Since(began))
			if o.memProfile != "" {
				if err := writeHeapProfile(o.memProfile); err != nil {
					log.Printf("soak: %v", err)
				}
			}
			break loop
		}
	}
	drv.stop.Store(true)
	wg.Wait()
	// Every run of the handler must have reached a client as an answer from
	// a run, unless a request went unanswered.
	if ids, runs := a.ids.Load(), drv.t.firstRuns.Load(); drv.t.netErrors.Load() == 0 && ids != runs {
		f.add(&f.failed, fmt.Sprintf("the handler ran %d times, and %d answers came from runs", ids, runs))
	}
	// Every run past a key's first must have been told apart.
	if reruns, told := a.reruns.Load(), f.doubleRuns.Load()+drv.t.expired.Load(); drv.t.netErrors.Load() == 0 && reruns != told {
		f.add(&f.failed, fmt.Sprintf("the handler ran %d times past a key's first, and the clients saw %d", reruns, told))
	}
	res.rows = append(res.rows, s.recount(last))
	runtime.GC()
	res.idle = runtime.NumGoroutine()
	cleanup()
	res.tally = &drv.t
	res.notes, res.dropped = f.all()
	return res, nil
}

func storeNote(cfg config) string {
	switch {
	case cfg.store == "memory" && cfg.maxBytes > 0:
		return fmt.Sprintf(", max records %d, max bytes %d", cfg.maxRecords, cfg.maxBytes)
	case cfg.store == "memory":
		return fmt.Sprintf(", max records %d", cfg.maxRecords)
	case cfg.redisMaxMem != "":
		return ", maxmemory " + cfg.redisMaxMem
	}
	return ""
}

// mixLine says what the soak sent: shares of the requests that were not
// retries after a 409 (each 409 is followed by one retry).
func mixLine(t *tally) string {
	sent := t.requests.Load() - t.conflicts.Load()
	pct := func(n int64) string { return fmt.Sprintf("%.1f %%", 100*float64(n)/float64(max(sent, 1))) }
	return fmt.Sprintf("%d requests and %d retries after 409; repeats %s of the requests (pairs' second halves %s, changed bodies %s), the oldest %.1f s after the key's first request; %d runs after a key's retention (allowed)",
		sent, t.conflicts.Load(), pct(t.repeats.Load()), pct(t.pairs.Load()), pct(t.changed.Load()), time.Duration(t.oldest.Load()).Seconds(), t.expired.Load())
}

// row is one snapshot.
type row struct {
	name                 string
	at                   time.Duration
	requests             int64
	rate                 float64 // requests per second since the row before
	firstRuns, replays   int64
	conflicts, reused    int64
	refused              int64
	doubleRuns           int64
	wrongReplays, failed int64
	goroutines           int
	heapInuse            uint64
	storeKeys            int64
	storeBytes           int64
	storeErr             error
}

type sampler struct {
	t    *target
	drv  *driver
	a    *app
	prev row // the row rates are measured from
}

// take makes a row: the counts so far, and the process after a garbage
// collection.
func (s *sampler) take(name string, at time.Duration) row {
	r := s.counts(name, at)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r.heapInuse = ms.HeapInuse
	r.goroutines = runtime.NumGoroutine()
	r.storeKeys, r.storeBytes, r.storeErr = s.t.keys()
	return r
}

// recount replaces the counts of r with those now, once the workers have
// stopped and every answer is in. The time, the rate and the process's
// figures stay those taken while the workers ran.
func (s *sampler) recount(r row) row {
	c := s.counts(r.name, r.at)
	c.rate, c.goroutines, c.heapInuse = r.rate, r.goroutines, r.heapInuse
	c.storeKeys, c.storeBytes, c.storeErr = r.storeKeys, r.storeBytes, r.storeErr
	return c
}

// counts makes a row of the counts so far, with the rate since the row
// taken before.
func (s *sampler) counts(name string, at time.Duration) row {
	tl := &s.drv.t
	r := row{
		name: name, at: at,
		requests:     tl.requests.Load(),
		firstRuns:    tl.firstRuns.Load(),
		replays:      tl.replays.Load(),
		conflicts:    tl.conflicts.Load(),
		reused:       tl.reused.Load(),
		refused:      tl.refused.Load(),
		doubleRuns:   s.drv.f.doubleRuns.Load(),
		wrongReplays: s.drv.f.wrongReplays.Load(),
		failed:       s.drv.f.failed.Load(),
	}
	if dt := (at - s.prev.at).Seconds(); dt > 0 {
		r.rate = float64(r.requests-s.prev.requests) / dt
	}
	return r
}

// progress prints the counts so far, without a garbage collection.
func (s *sampler) progress(w io.Writer, at time.Duration) {
	tl := &s.drv.t
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	keys, _, _ := s.t.keys()
	fmt.Fprintf(w, "soak: %5.0fs  %9d requests  %d double runs  %d wrong replays  %d failed  409 %d  422 %d  503 %d  goroutines %d  heap %.0f MiB  keys %d\n",
		at.Seconds(), tl.requests.Load(), s.drv.f.doubleRuns.Load(), s.drv.f.wrongReplays.Load(), s.drv.f.failed.Load(),
		tl.conflicts.Load(), tl.reused.Load(), tl.refused.Load(), runtime.NumGoroutine(), float64(ms.HeapInuse)/(1<<20), keys)
}

// printTable prints the rows as a Markdown table. Store MiB is the
// memory store's own count of its bytes (Stats), or Redis's used_memory.
func printTable(w io.Writer, name string, rows []row) {
	fmt.Fprintln(w, "| store | at | s | req/s | requests | from runs | replays | double runs | wrong replays | failed checks | 409 | 422 | 503 | goroutines | heap in use MiB | store keys | store MiB |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		keys, mib := fmt.Sprint(r.storeKeys), fmt.Sprintf("%.1f", float64(r.storeBytes)/(1<<20))
		if r.storeErr != nil {
			keys, mib = "error: "+r.storeErr.Error(), ""
		}
		fmt.Fprintf(w, "| %s | %s | %.0f | %.0f | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %.1f | %s | %s |\n",
			name, r.name, r.at.Seconds(), r.rate, r.requests, r.firstRuns, r.replays, r.doubleRuns, r.wrongReplays, r.failed,
			r.conflicts, r.reused, r.refused, r.goroutines, float64(r.heapInuse)/(1<<20), keys, mib)
	}
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// machine describes where the soak ran: it shares the machine with its
// server, and often with other work.
func machine() string {
	return fmt.Sprintf("%d CPUs, %s %s/%s, load average %s", runtime.NumCPU(), runtime.Version(), runtime.GOOS, runtime.GOARCH, loadAverage())
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
