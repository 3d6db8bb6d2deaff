package redis_test

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/redistest"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// The benchmarks run against a redis-server of their own on loopback, with
// 16 and 64 goroutines (RunParallel) on many keys: the concurrency of a
// service's requests. Every operation is a real round trip, so ns/op is
// bound by the server, the loopback and the other processes on the machine
// as much as by the store. Besides allocs/op they report CPU per operation,
// which a busy machine disturbs less than time: client-µs/op is this
// process's user and system CPU (the store, go-redis, the benchmark loop and
// the runtime), redis-µs/op the server's (INFO used_cpu_user and
// used_cpu_sys), both divided by the operations run.

// benchConcurrency is how many goroutines run each benchmark at once.
var benchConcurrency = []int{16, 64}

// benchModes are the ways the store sends its commands: each on a pooled
// connection of its own (the default, named by concurrency alone), and
// through the client's automatic pipeliner.
var benchModes = []struct {
	name string
	opts []redis.Option
}{
	{"", nil},
	{"autopipeline/", []redis.Option{redis.WithAutoPipeline()}},
}

// forEachCase runs bench once per mode and concurrency.
func forEachCase(b *testing.B, bench func(b *testing.B, conc int, opts []redis.Option)) {
	for _, m := range benchModes {
		for _, conc := range benchConcurrency {
			b.Run(fmt.Sprintf("%sc=%d", m.name, conc), func(b *testing.B) { bench(b, conc, m.opts) })
		}
	}
}

// benchStore starts a server and returns a store on it with the options the
// package documentation recommends (a pool of 128 connections), and the
// server's address.
func benchStore(b *testing.B, opts ...redis.Option) (*redis.Store, string) {
	b.Helper()
	addr := redistest.Start(b)
	c := goredis.NewClient(&goredis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		PoolSize:              128,
	})
	b.Cleanup(func() { c.Close() })
	// A budget wide enough that a stall of this shared machine does not
	// end a run: the benchmarks measure cost, the fault tests the budget.
	st, err := redis.New(c, append([]redis.Option{redis.WithCallTimeout(testBudget)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	return st, addr
}

// runParallel runs an operation on conc goroutines, as b.RunParallel does,
// and reports CPU per operation. setup runs once per goroutine before the
// loop and returns the operation. Before the clock starts, conc goroutines
// run the operation at once: the pool holds its connections and the server
// its scripts before anything is measured.
func runParallel(b *testing.B, addr string, conc int, setup func() func()) {
	b.Helper()
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() { setup()() })
	}
	wg.Wait()
	b.ReportAllocs()
	b.SetParallelism((conc + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	m := startCPU(b, addr)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		op := setup()
		for pb.Next() {
			op()
		}
	})
	b.StopTimer()
	m.report(b)
}

// cpuMeter measures the CPU this process and a Redis server spend, and the
// commands the server runs.
type cpuMeter struct {
	addr  string
	redis time.Duration
	self  time.Duration
	cmds  map[string]commandStat
}

func startCPU(b *testing.B, addr string) *cpuMeter {
	return &cpuMeter{addr: addr, redis: redisCPU(b, addr), self: selfCPU(b), cmds: commandStats(b, addr)}
}

// report reports, per operation, redis-µs/op, the server's CPU (INFO
// used_cpu_user and used_cpu_sys: running commands, reading and writing
// sockets, the event loop), and client-µs/op, this process's CPU. It logs
// what the server ran meanwhile (INFO commandstats): each command's calls
// per operation and its time per call. A script's own calls are listed
// under their names too, and their time is part of the script's.
func (m *cpuMeter) report(b *testing.B) {
	r := redisCPU(b, m.addr) - m.redis
	s := selfCPU(b) - m.self
	b.ReportMetric(float64(r)/1e3/float64(b.N), "redis-µs/op")
	b.ReportMetric(float64(s)/1e3/float64(b.N), "client-µs/op")
	after := commandStats(b, m.addr)
	var lines []string
	for name, a := range after {
		d := commandStat{calls: a.calls - m.cmds[name].calls, usec: a.usec - m.cmds[name].usec}
		if d.calls > 0 {
			lines = append(lines, fmt.Sprintf("%s %.2f/op %.2fµs/call", name, float64(d.calls)/float64(b.N), float64(d.usec)/float64(d.calls)))
		}
	}
	slices.Sort(lines)
	b.Logf("commands: %s", strings.Join(lines, ", "))
}

type commandStat struct{ calls, usec int64 }

// commandStats returns INFO commandstats by command name, INFO left out.
func commandStats(b *testing.B, addr string) map[string]commandStat {
	b.Helper()
	f, err := redistest.Info(addr, "commandstats")
	if err != nil {
		b.Fatal(err)
	}
	m := make(map[string]commandStat)
	for k, v := range f {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok || name == "info" {
			continue
		}
		var st commandStat
		for field := range strings.SplitSeq(v, ",") {
			if n, ok := strings.CutPrefix(field, "calls="); ok {
				st.calls, _ = strconv.ParseInt(n, 10, 64)
			}
			if n, ok := strings.CutPrefix(field, "usec="); ok {
				st.usec, _ = strconv.ParseInt(n, 10, 64)
			}
		}
		m[name] = st
	}
	return m
}

// redisCPU returns the user and system CPU the server has spent.
func redisCPU(b *testing.B, addr string) time.Duration {
	b.Helper()
	f, err := redistest.Info(addr, "cpu")
	if err != nil {
		b.Fatal(err)
	}
	var d time.Duration
	for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
		s, err := strconv.ParseFloat(f[k], 64)
		if err != nil {
			b.Fatalf("INFO cpu %s: %v", k, err)
		}
		d += time.Duration(s * 1e9)
	}
	return d
}

// selfCPU returns the user and system CPU this process has spent.
func selfCPU(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchRecord() *store.Record {
	body := make([]byte, 1024)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	return &store.Record{
		Status:      201,
		Header:      http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/42"}},
		Body:        body,
		Fingerprint: [32]byte{1},
		CreatedAt:   time.Now(),
		CompletedAt: time.Now(),
	}
}

// BenchmarkFirstRun is the store's part of a first request: a claim on a
// fresh key, then complete with a 1 KiB response.
func BenchmarkFirstRun(b *testing.B) {
	forEachCase(b, func(b *testing.B, conc int, opts []redis.Option) {
		{
			st, addr := benchStore(b, opts...)
			rec := benchRecord()
			scope := "bench-" + randomHex(4)
			var n atomic.Int64
			ctx := context.Background()
			b.SetBytes(int64(len(rec.Body)))
			runParallel(b, addr, conc, func() func() {
				c := store.Claim{Token: randomHex(16), Fingerprint: rec.Fingerprint, TTL: 30 * time.Second}
				return func() {
					key := store.KeyName(scope, strconv.FormatInt(n.Add(1), 10))
					res, err := st.Claim(ctx, key, c)
					if err != nil || res.State != store.Claimed {
						b.Fatalf("claim: %v %v", res.State, err)
					}
					if err := st.Complete(ctx, key, c.Token, rec, time.Minute); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	})
}

// BenchmarkReplay is the store's part of a repeat: one claim that finds a
// kept 1 KiB response, over 1024 keys.
func BenchmarkReplay(b *testing.B) {
	forEachCase(b, func(b *testing.B, conc int, opts []redis.Option) {
		{
			st, addr := benchStore(b, opts...)
			rec := benchRecord()
			ctx := context.Background()
			const keys = 1024
			names := make([]string, keys)
			scope := "bench-" + randomHex(4)
			for i := range names {
				names[i] = store.KeyName(scope, strconv.Itoa(i))
				c := store.Claim{Token: randomHex(16), Fingerprint: rec.Fingerprint, TTL: time.Minute}
				if _, err := st.Claim(ctx, names[i], c); err != nil {
					b.Fatal(err)
				}
				if err := st.Complete(ctx, names[i], c.Token, rec, time.Hour); err != nil {
					b.Fatal(err)
				}
			}
			var n atomic.Int64
			b.SetBytes(int64(len(rec.Body)))
			runParallel(b, addr, conc, func() func() {
				c := store.Claim{Token: randomHex(16), Fingerprint: rec.Fingerprint, TTL: time.Minute}
				return func() {
					res, err := st.Claim(ctx, names[n.Add(1)%keys], c)
					if err != nil || res.State != store.Completed {
						b.Fatalf("claim: %v %v", res.State, err)
					}
				}
			})
		}
	})
}

// BenchmarkInFlight is the store's part of a repeat that finds the first
// request still running: one claim that finds another's claim.
func BenchmarkInFlight(b *testing.B) {
	forEachCase(b, func(b *testing.B, conc int, opts []redis.Option) {
		{
			st, addr := benchStore(b, opts...)
			ctx := context.Background()
			const keys = 1024
			names := make([]string, keys)
			scope := "bench-" + randomHex(4)
			for i := range names {
				names[i] = store.KeyName(scope, strconv.Itoa(i))
				if _, err := st.Claim(ctx, names[i], store.Claim{Token: randomHex(16), TTL: time.Hour}); err != nil {
					b.Fatal(err)
				}
			}
			var n atomic.Int64
			runParallel(b, addr, conc, func() func() {
				c := store.Claim{Token: randomHex(16), TTL: time.Minute}
				return func() {
					res, err := st.Claim(ctx, names[n.Add(1)%keys], c)
					if err != nil || res.State != store.InFlight {
						b.Fatalf("claim: %v %v", res.State, err)
					}
				}
			})
		}
	})
}

// BenchmarkKeepCluster is a first run's claim and keep on a three-master
// Cluster, with nobody waiting: it reports the cluster bus messages each
// keep costs (bus-msgs/op: CLUSTER INFO cluster_stats_messages_sent,
// summed over the masters, before and after) and the masters' CPU
// (redis-µs/op, INFO used_cpu_user and used_cpu_sys summed). The keep's
// PUBLISH on the wake channel is broadcast over the bus to every node.
func BenchmarkKeepCluster(b *testing.B) {
	cl := sharedCluster(b)
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true, PoolSize: 16})
	b.Cleanup(func() { c.Close() })
	st, err := redis.New(c, redis.WithCallTimeout(testBudget))
	if err != nil {
		b.Fatal(err)
	}
	rec := benchRecord()
	scope := "bench-" + randomHex(4)
	ctx := context.Background()
	sent := func() (msgs int64, cpu float64) {
		for _, addr := range cl.Addrs() {
			reply, err := redistest.Do(addr, "CLUSTER", "INFO")
			if err != nil {
				b.Fatal(err)
			}
			n, _ := strconv.ParseInt(redistest.ParseInfo(reply)["cluster_stats_messages_sent"], 10, 64)
			msgs += n
			info, err := redistest.Info(addr, "cpu")
			if err != nil {
				b.Fatal(err)
			}
			u, _ := strconv.ParseFloat(info["used_cpu_user"], 64)
			s, _ := strconv.ParseFloat(info["used_cpu_sys"], 64)
			cpu += u + s
		}
		return msgs, cpu
	}
	m0, c0 := sent()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		key := store.KeyName(scope, strconv.Itoa(i))
		cm := store.Claim{Token: randomHex(16), Fingerprint: rec.Fingerprint, TTL: 30 * time.Second}
		if _, err := st.Claim(ctx, key, cm); err != nil {
			b.Fatal(err)
		}
		if err := st.Complete(ctx, key, cm.Token, rec, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	m1, c1 := sent()
	b.ReportMetric(float64(m1-m0)/float64(b.N), "bus-msgs/op")
	b.ReportMetric((c1-c0)*1e6/float64(b.N), "redis-µs/op")
}

// BenchmarkKeepWaiters is a first run's claim and keep on a standalone
// server with a second Store subscribed to the wake channel, with nobody
// waiting on the key and with one repeat waiting (Wait on the second
// Store, registered before the keep): redis-µs/op is the server's CPU per
// first run (INFO used_cpu_user and used_cpu_sys), the waiter's commands
// included. The waiter's case pauses a millisecond per operation for the
// waiter to mark the claim, so its ns/op is not the store's.
func BenchmarkKeepWaiters(b *testing.B) {
	for _, waiter := range []bool{false, true} {
		name := "nobody"
		if waiter {
			name = "waiter"
		}
		b.Run(name, func(b *testing.B) {
			a, addr := benchStore(b)
			c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
			b.Cleanup(func() { c.Close() })
			w, err := redis.New(c, redis.WithCallTimeout(testBudget))
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			rec := benchRecord()
			scope := "bench-" + randomHex(4)
			// Subscribe w: a Wait on a free key returns at once, and the
			// subscription stays for a minute.
			if _, err := w.Wait(ctx, store.KeyName(scope, "warm"), store.Claim{Token: "x"}); err != nil {
				b.Fatal(err)
			}
			cpu := func() float64 {
				info, err := redistest.Info(addr, "cpu")
				if err != nil {
					b.Fatal(err)
				}
				u, _ := strconv.ParseFloat(info["used_cpu_user"], 64)
				s, _ := strconv.ParseFloat(info["used_cpu_sys"], 64)
				return u + s
			}
			c0 := cpu()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				key := store.KeyName(scope, strconv.Itoa(i))
				cm := store.Claim{Token: randomHex(16), Fingerprint: rec.Fingerprint, TTL: 30 * time.Second}
				if _, err := a.Claim(ctx, key, cm); err != nil {
					b.Fatal(err)
				}
				var done chan struct{}
				if waiter {
					done = make(chan struct{})
					go func() {
						defer close(done)
						if ok, err := w.Wait(ctx, key, store.Claim{Token: randomHex(16), Fingerprint: rec.Fingerprint}); !ok || err != nil {
							b.Errorf("Wait = %v, %v", ok, err)
						}
					}()
					for redis.Waiting(w, key) == 0 {
						time.Sleep(50 * time.Microsecond)
					}
					time.Sleep(time.Millisecond) // for the mark
				}
				if err := a.Complete(ctx, key, cm.Token, rec, time.Minute); err != nil {
					b.Fatal(err)
				}
				if done != nil {
					<-done
				}
			}
			b.StopTimer()
			b.ReportMetric((cpu()-c0)*1e6/float64(b.N), "redis-µs/op")
		})
	}
}
