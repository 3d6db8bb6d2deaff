package datalayers_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/middleware"
)

// The tests run each data layer on each database: a middleware server
// whose handler writes a payment through the layer, on the request's
// transaction.

// forEach runs f for each database and data layer, as subtests.
func forEach(t *testing.T, f func(t *testing.T, d *database, l layer)) {
	for _, d := range databases {
		for _, l := range layers {
			t.Run(d.name+"/"+l.name, func(t *testing.T) { f(t, d, l) })
		}
	}
}

// payHandler writes a payment for the request's key through a data layer
// bound to the request's transaction. Request headers change what it
// does next:
//
//	X-Crash: call crash (the helper process's says "inserted" and hangs)
//	X-Commit: commit the transaction itself, through the layer
//	X-Status: answer this status instead of 201
type payHandler struct {
	d     *database
	bind  func(context.Context, *sql.Tx) (writer, error)
	by    string
	crash func()
	runs  atomic.Int64
}

// paid is the handler's answer.
type paid struct {
	ID  string `json:"id"`
	Key string `json:"key"`
	By  string `json:"by"`
}

func (h *payHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.runs.Add(1)
	ctx := r.Context()
	key, _ := idemkey.FromContext(ctx)
	tx := h.d.tx(ctx)
	if tx == nil {
		http.Error(w, "no transaction", http.StatusInternalServerError)
		return
	}
	dl, err := h.bind(ctx, tx)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	p := payment{ID: rand.Text(), Key: key.Value, Amount: 10, By: h.by}
	if err := dl.insert(p); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if r.Header.Get("X-Crash") != "" && h.crash != nil {
		h.crash()
	}
	if r.Header.Get("X-Commit") != "" {
		if err := dl.commit(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	status := http.StatusCreated
	if s := r.Header.Get("X-Status"); s != "" {
		status, _ = strconv.Atoi(s)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(paid{ID: p.ID, Key: p.Key, By: p.By})
}

// newService returns the middleware on st in front of a payHandler
// writing through l on db, as a service would set it up.
func newService(st txStore, d *database, db *sql.DB, l layer, by string) (http.Handler, *payHandler, error) {
	bind, err := l.open(d, db)
	if err != nil {
		return nil, nil, err
	}
	m, err := middleware.New(st)
	if err != nil {
		return nil, nil, err
	}
	h := &payHandler{d: d, bind: bind, by: by}
	return m.Required(middleware.Deadline(30 * time.Second))(h), h, nil
}

// serve starts the service on e in this process.
func serve(t *testing.T, e *env, l layer, by string) (*httptest.Server, *payHandler) {
	t.Helper()
	svc, h, err := newService(e.st, e.d, e.db, l, by)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(svc)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, h
}

type answer struct {
	status   int
	body     string
	replayed bool
	err      error
}

// paid decodes the answer's body.
func (a answer) paid(t testing.TB) paid {
	t.Helper()
	var p paid
	if err := json.Unmarshal([]byte(a.body), &p); err != nil {
		t.Fatalf("the answer %d %q: %v", a.status, a.body, err)
	}
	return p
}

var client = &http.Client{Timeout: time.Minute}

// post sends a payment request with key and the extra headers (name,
// value, ...).
func post(url, key string, hdr ...string) answer {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":10,"currency":"EUR"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: string(b), replayed: resp.Header.Get(idemkey.HeaderReplayed) == "true", err: err}
}

// TestOneKey32: 32 concurrent requests with one key run the handler once
// and make one payment, the first answer's; every other answer is 409 or
// a replay of the first, and a later request replays it too.
func TestOneKey32(t *testing.T) {
	forEach(t, func(t *testing.T, d *database, l layer) {
		e := newEnv(t, d)
		srv, h := serve(t, e, l, "server")
		key := rand.Text()
		const n = 32
		answers := make([]answer, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				answers[i] = post(srv.URL, key)
			})
		}
		close(start)
		wg.Wait()
		var first *answer
		count := map[string]int{}
		for i, a := range answers {
			if a.err != nil {
				t.Fatal(a.err)
			}
			count[fmt.Sprint(a.status, map[bool]string{true: " replayed"}[a.replayed])]++
			if a.status == http.StatusCreated && !a.replayed {
				first = &answers[i]
			}
		}
		t.Logf("%v", count)
		if first == nil || count["201"] != 1 || count["201"]+count["201 replayed"]+count["409"] != n {
			t.Fatalf("%v, want one first 201 and the rest replays or 409", count)
		}
		for _, a := range answers {
			if a.replayed && a.body != first.body {
				t.Errorf("a replay %q, want the first answer %q", a.body, first.body)
			}
		}
		if runs := h.runs.Load(); runs != 1 {
			t.Errorf("the handler ran %d times, want 1", runs)
		}
		if who := e.madeBy(t, key); len(who) != 1 {
			t.Fatalf("%d payments for the key, want 1", len(who))
		}
		if id, want := e.paymentID(t, key), first.paid(t).ID; id != want {
			t.Errorf("the payment is %s, want the first answer's %s", id, want)
		}
		r := post(srv.URL, key)
		if r.err != nil || r.status != http.StatusCreated || !r.replayed || r.body != first.body {
			t.Fatalf("a later request: %d replayed=%v %q %v, want the first answer %q replayed", r.status, r.replayed, r.body, r.err, first.body)
		}
	})
}

// TestKillMidWrite: a process serving the same handler is killed
// (SIGKILL) after the handler's write through the layer, before the
// commit. The write dies with its transaction: the retry on a surviving
// process runs the handler at once (201, not a replay) and its payment is
// the only one for the key.
func TestKillMidWrite(t *testing.T) {
	forEach(t, func(t *testing.T, d *database, l layer) {
		e := newEnv(t, d)
		srv, _ := serve(t, e, l, "survivor")
		cmd, out := helper(t, e, l)
		if !out.Scan() || !strings.HasPrefix(out.Text(), "listening ") {
			t.Fatalf("the child said %q", out.Text())
		}
		childURL := strings.TrimPrefix(out.Text(), "listening ")
		key := rand.Text()
		first := make(chan answer, 1)
		go func() { first <- post(childURL, key, "X-Crash", "1") }()
		if !out.Scan() || out.Text() != "inserted" {
			t.Fatalf("the child said %q, want \"inserted\"", out.Text())
		}
		if who := e.madeBy(t, key); len(who) != 0 {
			t.Fatalf("payments %v seen before the child's commit", who)
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		var retry answer
		for {
			// The server may not have seen the child's connection
			// close yet: until then the key is held (409).
			retry = post(srv.URL, key)
			if retry.status != http.StatusConflict || time.Since(start) > 5*time.Second {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		took := time.Since(start)
		if a := <-first; a.err == nil {
			t.Fatalf("the killed child answered %d %s", a.status, a.body)
		}
		if retry.err != nil {
			t.Fatal(retry.err)
		}
		who := e.madeBy(t, key)
		if retry.status != http.StatusCreated || retry.replayed || !slices.Equal(who, []string{"survivor"}) {
			t.Fatalf("the retry: %d replayed=%v %s, payments %v; want 201, not a replay, and the survivor's payment alone", retry.status, retry.replayed, retry.body, who)
		}
		if id, want := e.paymentID(t, key), retry.paid(t).ID; id != want {
			t.Errorf("the payment is %s, want the retry's %s", id, want)
		}
		if r := post(srv.URL, key); r.status != http.StatusCreated || !r.replayed || r.body != retry.body {
			t.Errorf("a later request: %d replayed=%v %q, want the retry's answer %q replayed", r.status, r.replayed, r.body, retry.body)
		}
		t.Logf("the retry ran %v after the kill", took.Round(time.Millisecond))
	})
}

// TestHandlerCommits: the handler commits the request's transaction
// itself, through the layer. Its payment and its claim commit together:
// answered 500 after that, the key stays held (the retry gets 409 and
// does not run the handler) rather than let a retry pay twice; answered
// 201, the answer is kept and replayed. Either way, one payment.
func TestHandlerCommits(t *testing.T) {
	forEach(t, func(t *testing.T, d *database, l layer) {
		e := newEnv(t, d)
		srv, h := serve(t, e, l, "server")
		cases := []struct {
			name        string
			status      string
			retry       int
			retryReplay bool
		}{
			{"then 500", "500", http.StatusConflict, false},
			{"then 201", "201", http.StatusCreated, true},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				key := rand.Text()
				a := post(srv.URL, key, "X-Commit", "1", "X-Status", c.status)
				if a.err != nil {
					t.Fatal(a.err)
				}
				if strconv.Itoa(a.status) != c.status {
					t.Fatalf("first: %d %s, want %s", a.status, a.body, c.status)
				}
				runs := h.runs.Load()
				r := post(srv.URL, key)
				if r.err != nil {
					t.Fatal(r.err)
				}
				if r.status != c.retry || r.replayed != c.retryReplay {
					t.Fatalf("retry: %d replayed=%v %s, want %d replayed=%v", r.status, r.replayed, r.body, c.retry, c.retryReplay)
				}
				if c.retryReplay && r.body != a.body {
					t.Errorf("replay %q, want the first answer %q", r.body, a.body)
				}
				if ran := h.runs.Load() - runs; ran != 0 {
					t.Errorf("the retry ran the handler")
				}
				if who := e.madeBy(t, key); !slices.Equal(who, []string{"server"}) {
					t.Fatalf("payments for the key: %v, want the first request's alone", who)
				}
				if id, want := e.paymentID(t, key), a.paid(t).ID; id != want {
					t.Errorf("the payment is %s, want the first answer's %s", id, want)
				}
			})
		}
	})
}

// The helper process is the test binary again, running TestHelperProcess
// with its orders in the environment.
const (
	helperEnv   = "IDEMKEY_DATALAYERS_HELPER"
	databaseEnv = "IDEMKEY_DATALAYERS_DATABASE"
	layerEnv    = "IDEMKEY_DATALAYERS_LAYER"
	urlEnv      = "IDEMKEY_DATALAYERS_URL"
	nsEnv       = "IDEMKEY_DATALAYERS_NS"
)

// helper starts a child serving the service on e's namespace, through l.
// It kills the child when the test ends; the child exits by itself when
// its standard input closes (the parent died).
func helper(t *testing.T, e *env, l layer) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.v=false")
	cmd.Env = append(os.Environ(), helperEnv+"=serve", databaseEnv+"="+e.d.name, layerEnv+"="+l.name, urlEnv+"="+e.url, nsEnv+"="+e.ns)
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
		cmd.Process.Kill()
		cmd.Wait()
		in.Close()
	})
	return cmd, bufio.NewScanner(out)
}

// TestHelperProcess is the child's side; it does nothing in a normal run.
// It serves the service on a free port and says where; a request with
// X-Crash says "inserted" after the handler's write and hangs until the
// process is killed.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("runs only as a child of another test")
	}
	fail := func(err error) {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(1)
	}()
	var d *database
	for _, c := range databases {
		if c.name == os.Getenv(databaseEnv) {
			d = c
		}
	}
	l, ok := layerNamed(os.Getenv(layerEnv))
	if d == nil || !ok {
		fail(fmt.Errorf("no database %q or layer %q", os.Getenv(databaseEnv), os.Getenv(layerEnv)))
	}
	ctx := context.Background()
	ns := os.Getenv(nsEnv)
	db, err := d.open(os.Getenv(urlEnv), ns, 10)
	if err != nil {
		fail(err)
	}
	st, err := d.newStore(ctx, db, ns)
	if err != nil {
		fail(err)
	}
	svc, h, err := newService(st, d, db, l, "killed child")
	if err != nil {
		fail(err)
	}
	h.crash = func() {
		fmt.Println("inserted")
		select {}
	}
	srv := httptest.NewServer(svc)
	fmt.Println("listening " + srv.URL)
	select {}
}
