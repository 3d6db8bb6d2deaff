package postgres_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
)

// The tests here run requests in child processes: the test binary again,
// running TestHelperProcess with its orders in the environment.

const helperEnv = "IDEMKEY_PG_HELPER"

// stdin holds each child's standard input, to tell it to go.
var stdin = map[*exec.Cmd]io.WriteCloser{}

// helper starts the test binary as a child running mode with env.
func helper(t *testing.T, mode string, env ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.v=false")
	cmd.Env = append(os.Environ(), append([]string{helperEnv + "=" + mode}, env...)...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin[cmd] = in
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd, bufio.NewScanner(out)
}

// TestHelperProcess is the child's side; it does nothing in a normal run.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		t.Skip("runs only as a child of another test")
	}
	if mode == "sqlserver" {
		serveSQLChild(os.Getenv("URL"), os.Getenv("TABLE"))
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("URL"))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	table := os.Getenv("TABLE")
	st, err := postgres.New(ctx, pool, postgres.WithTable(table), postgres.WithSweepInterval(0), postgres.WithCallTimeout(10*time.Second))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	pay := payments{pool: pool, name: `"` + table + `_payments"`}
	switch mode {
	case "server":
		serveChild(st, pool, table)
	case "crash":
		// Claim, pay, say so, and hang until killed.
		c := store.Claim{Token: "child-" + strconv.Itoa(os.Getpid()), Fingerprint: [32]byte{1}, TTL: time.Hour}
		res, tx, err := st.ClaimTx(ctx, os.Getenv("KEY"), c)
		if err != nil || res.State != store.Claimed {
			fmt.Println("error: claim:", res.State, err)
			os.Exit(1)
		}
		if err := pay.insert(tx.NewContext(ctx), os.Getenv("KEY"), "killed child"); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("inserted")
		time.Sleep(time.Minute)
		os.Exit(1)
	case "duplicates":
		keys := strings.Split(os.Getenv("KEYS"), ",")
		dups, _ := strconv.Atoi(os.Getenv("DUPS"))
		fmt.Println("ready")
		bufio.NewScanner(os.Stdin).Scan() // wait for "go"
		var jobs []string
		for _, k := range keys {
			for range dups {
				jobs = append(jobs, k)
			}
		}
		rand.Shuffle(len(jobs), func(i, j int) { jobs[i], jobs[j] = jobs[j], jobs[i] })
		work := make(chan string)
		var runs, inFlight, replays, errs atomic.Int64
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				for k := range work {
					for {
						res, tx, err := st.ClaimTx(ctx, k, store.Claim{Token: strconv.FormatUint(rand.Uint64(), 36), Fingerprint: [32]byte{7}, TTL: time.Minute})
						if err != nil {
							errs.Add(1)
							fmt.Fprintln(os.Stderr, "claim:", err)
							time.Sleep(10 * time.Millisecond)
							continue
						}
						if tx != nil {
							if err := pay.insert(tx.NewContext(ctx), k, strconv.Itoa(os.Getpid())); err != nil {
								tx.Rollback(ctx)
								errs.Add(1)
								continue
							}
							if err := tx.Commit(ctx, record("paid", 7), time.Minute); err != nil {
								errs.Add(1)
								continue
							}
							runs.Add(1)
							break
						}
						if res.State == store.Completed {
							replays.Add(1)
							break
						}
						inFlight.Add(1)
						time.Sleep(2 * time.Millisecond)
					}
				}
			})
		}
		for _, j := range jobs {
			work <- j
		}
		close(work)
		wg.Wait()
		json.NewEncoder(os.Stdout).Encode(map[string]int64{"runs": runs.Load(), "replays": replays.Load(), "in_flight": inFlight.Load(), "errors": errs.Load()})
		os.Exit(0)
	}
	os.Exit(2)
}

// TestCrashKilledOwnerIsTakenOver: a child process claims a key, inserts
// its payment through the request's transaction and is killed (SIGKILL)
// before it commits. The retry takes the key over at once, long before
// the claim's life (an hour) ends, and its payment is the only one. The
// takeover time is measured from the signal to the retry's claim.
func TestCrashKilledOwnerIsTakenOver(t *testing.T) {
	url := sharedURL(t)
	pool := newPool(t, url, 8)
	st, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	ctx := context.Background()
	var times []time.Duration
	for round := range 5 {
		key := newKey()
		cmd, out := helper(t, "crash", "URL="+url, "TABLE="+table, "KEY="+key)
		if !out.Scan() || out.Text() != "inserted" {
			t.Fatalf("round %d: the child said %q", round, out.Text())
		}
		// Alive, the owner holds its key.
		claimTx(t, st, key, newClaim(1), store.InFlight)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		var tx store.Tx
		var tries int
		for tx == nil {
			tries++
			res, got, err := st.ClaimTx(ctx, key, newClaim(1))
			if err != nil {
				t.Fatal(err)
			}
			if res.State != store.InFlight && res.State != store.Claimed {
				t.Fatalf("round %d: the retry got %v", round, res.State)
			}
			if time.Since(start) > 30*time.Second {
				t.Fatalf("round %d: still in flight 30 s after the owner was killed", round)
			}
			tx = got
		}
		d := time.Since(start)
		times = append(times, d)
		t.Logf("round %d: taken over %v after SIGKILL (%d claims; the claim's life was 1h)", round, d.Round(time.Microsecond), tries)
		if err := pay.insert(tx.NewContext(ctx), key, "retry"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx, record("paid", 1), time.Minute); err != nil {
			t.Fatal(err)
		}
		if got := pay.madeBy(t, key); len(got) != 1 || got[0] != "retry" {
			t.Fatalf("round %d: payments %v, want the retry's alone", round, got)
		}
		cmd.Wait()
	}
	slices.Sort(times)
	t.Logf("takeover after SIGKILL: median %v, max %v", times[len(times)/2].Round(time.Microsecond), times[len(times)-1].Round(time.Microsecond))
}

// TestTwoProcessesRunEachKeyOnce: two child processes on one database
// send 150 keys 8 times each (4 from each process, shuffled, 32 at a time
// in each): every key is paid exactly once.
func TestTwoProcessesRunEachKeyOnce(t *testing.T) {
	url := sharedURL(t)
	pool := newPool(t, url, 8)
	_, table := newStore(t, pool)
	pay := newPayments(t, pool, table)
	keys := make([]string, 150)
	for i := range keys {
		keys[i] = newKey()
	}
	var children []*bufio.Scanner
	var cmds []*exec.Cmd
	for range 2 {
		cmd, out := helper(t, "duplicates", "URL="+url, "TABLE="+table, "KEYS="+strings.Join(keys, ","), "DUPS=4")
		if !out.Scan() || out.Text() != "ready" {
			t.Fatalf("a child said %q", out.Text())
		}
		children = append(children, out)
		cmds = append(cmds, cmd)
	}
	for _, cmd := range cmds {
		io.WriteString(stdin[cmd], "go\n")
	}
	var runs int64
	for i, out := range children {
		if !out.Scan() {
			t.Fatalf("child %d said nothing", i)
		}
		var sum map[string]int64
		if err := json.Unmarshal(out.Bytes(), &sum); err != nil {
			t.Fatalf("child %d: %q: %v", i, out.Text(), err)
		}
		t.Logf("child %d: %v", i, sum)
		runs += sum["runs"]
		cmds[i].Wait()
	}
	if runs != 150 {
		t.Errorf("%d runs in all, want 150", runs)
	}
	var total, wrong int
	if err := pool.QueryRow(context.Background(), "SELECT count(*), count(*) FILTER (WHERE n <> 1) FROM (SELECT key, count(*) AS n FROM "+pay.name+" GROUP BY key) k").Scan(&total, &wrong); err != nil {
		t.Fatal(err)
	}
	var rows int
	pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pay.name).Scan(&rows)
	if rows != 150 || total != 150 || wrong != 0 {
		t.Fatalf("%d payments for %d keys, %d keys not paid exactly once; want 150 for 150", rows, total, wrong)
	}
}
