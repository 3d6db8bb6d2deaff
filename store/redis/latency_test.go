package redis_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/redistest"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// TestWakeLatency measures, through the middleware with WithWait, the time
// from the first request's keep (Complete returning) to the answer of a
// repeat that waited for it: polling (the store without its Wait, as the
// middleware waits on a store that is no Waiter) and woken (Wait). The
// first request runs in this process or in a second one (this test binary
// run again), on a Store and client of its own; its handler runs for a
// random 20 to 520 ms, so that the keep falls anywhere in the poll's
// pauses. It is a measurement, not a check: it runs only when
// IDEMKEY_WAKE_LATENCY is set, for example
//
//	IDEMKEY_WAKE_LATENCY=40 go test -run TestWakeLatency -v ./store/redis/
//
// (the value is the number of repeats per case).
func TestWakeLatency(t *testing.T) {
	if addr := os.Getenv("IDEMKEY_WAKE_CHILD"); addr != "" {
		wakeChild(t, addr)
		return
	}
	n, _ := strconv.Atoi(os.Getenv("IDEMKEY_WAKE_LATENCY"))
	if n <= 0 {
		t.Skip("a measurement: set IDEMKEY_WAKE_LATENCY to the number of repeats per case")
	}
	addr := redistest.Start(t)
	for _, where := range []string{"in-process", "two processes"} {
		var first firstRunner
		if where == "in-process" {
			first = newLocalFirst(t, addr)
		} else {
			first = newChildFirst(t, addr)
		}
		for _, mode := range []string{"polling", "woken"} {
			var st store.Store = newStore(t, newClient(t, addr))
			if mode == "polling" {
				st = struct{ store.Store }{st} // no Waiter: the middleware polls
			}
			m, err := middleware.New(st, middleware.WithWait(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			h := m.Required()(http.NotFoundHandler()) // never runs: the key is always held
			lat := make([]time.Duration, 0, n)
			for range n {
				key := "latency-" + randomHex(8)
				run := time.Duration(20+rand.IntN(500)) * time.Millisecond
				kept := first.start(t, key, run)
				w := send(h, key, 0)
				answered := time.Now()
				if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
					t.Fatalf("%s %s: repeat answered %d %q, want the replay", where, mode, w.Code, w.Body)
				}
				lat = append(lat, answered.Sub(kept()))
			}
			slices.Sort(lat)
			var sum time.Duration
			for _, d := range lat {
				sum += d
			}
			ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) }
			t.Logf("%-13s %-7s n=%d  mean %s ms  p50 %s ms  p90 %s ms  max %s ms",
				where, mode, n, ms(sum/time.Duration(n)), ms(lat[n/2]), ms(lat[n*9/10]), ms(lat[n-1]))
		}
	}
}

// send sends a POST with key through h; run, when not zero, is how long
// the handler is to run (X-Run, in milliseconds).
func send(h http.Handler, key string, run time.Duration) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewBufferString(`{}`))
	r.Header.Set("Idempotency-Key", key)
	if run > 0 {
		r.Header.Set("X-Run", strconv.FormatInt(run.Milliseconds(), 10))
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// firstRunner runs first requests: start returns once the handler of the
// first request with key runs (for run), and kept returns the moment its
// Complete returned, once it has.
type firstRunner interface {
	start(t *testing.T, key string, run time.Duration) (kept func() time.Time)
}

// firstHandler is the first request's handler: it tells started, runs
// for X-Run and answers 201.
func firstHandler(started func()) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started()
		ms, _ := strconv.Atoi(r.Header.Get("X-Run"))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":1}`))
	})
}

// keepTimer is a Store that tells when each Complete returned.
type keepTimer struct {
	*redis.Store
	kept func(time.Time)
}

func (s keepTimer) Complete(ctx context.Context, key, token string, rec *store.Record, retention time.Duration) error {
	err := s.Store.Complete(ctx, key, token, rec, retention)
	s.kept(time.Now())
	return err
}

// localFirst runs first requests in this process, on a Store of its own.
type localFirst struct {
	h       http.Handler
	started chan struct{}
	kept    chan time.Time
}

func newLocalFirst(t *testing.T, addr string) *localFirst {
	f := &localFirst{started: make(chan struct{}, 1), kept: make(chan time.Time, 1)}
	st := keepTimer{newStore(t, newClient(t, addr)), func(at time.Time) { f.kept <- at }}
	m, err := middleware.New(st)
	if err != nil {
		t.Fatal(err)
	}
	f.h = m.Required()(firstHandler(func() { f.started <- struct{}{} }))
	return f
}

func (f *localFirst) start(t *testing.T, key string, run time.Duration) func() time.Time {
	go send(f.h, key, run)
	<-f.started
	return func() time.Time { return <-f.kept }
}

// childFirst runs first requests in a second process: this test binary,
// run again with IDEMKEY_WAKE_CHILD set to the server's address (see
// wakeChild). It sends "<key> <run in ms>" lines to the child's stdin; the
// child answers "started" when the handler runs and "kept <unix nanos>"
// when its Complete returned (the processes share the machine's clock).
type childFirst struct {
	in  *bufio.Writer
	out *bufio.Scanner
}

func newChildFirst(t *testing.T, addr string) *childFirst {
	cmd := exec.Command(os.Args[0], "-test.run=^TestWakeLatency$", "-test.v")
	cmd.Env = append(os.Environ(), "IDEMKEY_WAKE_CHILD="+addr)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		cmd.Wait()
	})
	return &childFirst{in: bufio.NewWriter(in), out: bufio.NewScanner(out)}
}

// line returns the child's next line that starts with prefix, skipping
// what the test framework prints.
func (f *childFirst) line(t *testing.T, prefix string) string {
	for f.out.Scan() {
		if s, ok := strings.CutPrefix(f.out.Text(), prefix); ok {
			return s
		}
	}
	t.Fatalf("the child process ended: %v", f.out.Err())
	return ""
}

func (f *childFirst) start(t *testing.T, key string, run time.Duration) func() time.Time {
	fmt.Fprintf(f.in, "%s %d\n", key, run.Milliseconds())
	f.in.Flush()
	f.line(t, "started")
	return func() time.Time {
		ns, _ := strconv.ParseInt(f.line(t, "kept "), 10, 64)
		return time.Unix(0, ns)
	}
}

// wakeChild is the second process of TestWakeLatency: it runs the first
// request of each key read from stdin, and says when its handler started
// and when its Complete returned.
func wakeChild(t *testing.T, addr string) {
	var mu sync.Mutex
	say := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Println(s)
	}
	st := keepTimer{newStore(t, newClient(t, addr)), func(at time.Time) { say("kept " + strconv.FormatInt(at.UnixNano(), 10)) }}
	m, err := middleware.New(st)
	if err != nil {
		t.Fatal(err)
	}
	h := m.Required()(firstHandler(func() { say("started") }))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		key, ms, _ := strings.Cut(in.Text(), " ")
		run, _ := strconv.Atoi(ms)
		go send(h, key, time.Duration(run)*time.Millisecond)
	}
}
