package redis_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/internal/redistest"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// wakeBound is how soon after a keep or a release its waiter must have
// answered: well above a wake's real latency (a fraction of a
// millisecond), well under the poll's longest pause (250 ms).
const wakeBound = 100 * time.Millisecond

// waitResult is what a Wait answered and when.
type waitResult struct {
	ok  bool
	err error
	at  time.Time
}

// startWait starts a Wait on key for c with ctx's time, and returns once
// the waiter is registered on st's subscription.
func startWait(t *testing.T, ctx context.Context, st *redis.Store, key string, c store.Claim) <-chan waitResult {
	t.Helper()
	ch := make(chan waitResult, 1)
	before := redis.Waiting(st, key)
	go func() {
		ok, err := st.Wait(ctx, key, c)
		ch <- waitResult{ok, err, time.Now()}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for redis.Waiting(st, key) == before {
		select {
		case r := <-ch:
			t.Fatalf("Wait returned %v, %v before it was woken", r.ok, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter never registered")
		}
		time.Sleep(time.Millisecond)
	}
	return ch
}

// waitBackends are the servers Wait is tested on: one two clients share,
// a cluster, and miniredis.
func waitBackends(t *testing.T) map[string]func(t *testing.T) (a, b *redis.Store) {
	return map[string]func(t *testing.T) (a, b *redis.Store){
		"standalone": func(t *testing.T) (a, b *redis.Store) {
			addr := redistest.Start(t)
			return newStore(t, newClient(t, addr)), newStore(t, newClient(t, addr))
		},
		"cluster": func(t *testing.T) (a, b *redis.Store) {
			return newStore(t, clusterClient(t)), newStore(t, clusterClient(t))
		},
		"miniredis": func(t *testing.T) (a, b *redis.Store) {
			m := newMini(t)
			return m.store(t), m.store(t)
		},
	}
}

func clusterClient(t *testing.T) *goredis.ClusterClient {
	cl := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: sharedCluster(t).Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { cl.Close() })
	return cl
}

// TestWaitWakes: a repeat waiting on a claim in flight wakes within
// wakeBound of the claim's keep, release or deletion, not before, on the Store that
// holds the claim and on another Store with a client of its own.
func TestWaitWakes(t *testing.T) {
	for name, backend := range waitBackends(t) {
		t.Run(name, func(t *testing.T) {
			a, b := backend(t)
			for _, end := range []string{"complete", "release", "delete"} {
				for _, w := range []struct {
					name string
					st   *redis.Store
				}{{"same store", a}, {"other store", b}} {
					t.Run(end+"/"+w.name, func(t *testing.T) {
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						defer cancel()
						key, first := newKey(), newClaim(1)
						mustClaim(t, a, key, first, store.Claimed)
						waiting := startWait(t, ctx, w.st, key, newClaim(1))
						select {
						case r := <-waiting:
							t.Fatalf("woken before the %s: %v %v", end, r.ok, r.err)
						case <-time.After(50 * time.Millisecond):
						}
						var err error
						switch end {
						case "complete":
							err = a.Complete(ctx, key, first.Token, record("kept", 1), time.Minute)
						case "release":
							err = a.Release(ctx, key, first.Token)
						case "delete":
							// An operator's (idemctl delete) of the claim.
							e, ok, ierr := a.Inspect(ctx, key)
							if ierr != nil || !ok {
								t.Fatalf("Inspect = %v, %v", ok, ierr)
							}
							var deleted bool
							if deleted, err = a.Delete(ctx, key, e); err == nil && !deleted {
								t.Fatal("Delete did not delete the claim it was shown")
							}
						}
						done := time.Now()
						if err != nil {
							t.Fatal(err)
						}
						r := <-waiting
						if !r.ok || r.err != nil {
							t.Fatalf("Wait = %v, %v; want true", r.ok, r.err)
						}
						lat := r.at.Sub(done)
						t.Logf("woken %v after the %s returned", lat, end)
						if lat > wakeBound {
							t.Errorf("woken %v after the %s, want within %v", lat, end, wakeBound)
						}
						if n := redis.Waiting(w.st, key); n != 0 {
							t.Errorf("%d waiters left registered", n)
						}
					})
				}
			}
		})
	}
}

// TestWaitSettled: a Wait on a key that holds no claim of the caller's
// request (kept, free, held for another request) returns true at once,
// so that the caller claims again at once.
func TestWaitSettled(t *testing.T) {
	st, _ := miniStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kept, c := newKey(), newClaim(1)
	mustClaim(t, st, kept, c, store.Claimed)
	if err := st.Complete(ctx, kept, c.Token, record("kept", 1), time.Minute); err != nil {
		t.Fatal(err)
	}
	other := newKey()
	mustClaim(t, st, other, newClaim(2), store.Claimed)
	for name, key := range map[string]string{"kept": kept, "free": newKey(), "another request's": other} {
		var ok bool
		var err error
		if d := timed(func() { ok, err = st.Wait(ctx, key, newClaim(1)) }); !ok || err != nil || d > wakeBound {
			t.Errorf("%s key: Wait = %v, %v after %v; want true at once", name, ok, err, d)
		}
	}
}

// TestWaitEndsAtContext: with nothing to wake it, a Wait returns true
// when its context ends.
func TestWaitEndsAtContext(t *testing.T) {
	st, _ := miniStore(t)
	key := newKey()
	mustClaim(t, st, key, newClaim(1), store.Claimed)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var ok bool
	var err error
	d := timed(func() { ok, err = st.Wait(ctx, key, newClaim(1)) })
	if !ok || err != nil || d < 200*time.Millisecond || d > 200*time.Millisecond+wakeBound {
		t.Fatalf("Wait = %v, %v after %v; want true at the context's end (200ms)", ok, err, d)
	}
}

// TestWaitLapsedClaim: a claim whose owner died lapses without a message;
// its waiter ends at the claim's expiry, not at its own context's end.
func TestWaitLapsedClaim(t *testing.T) {
	st := newStore(t, newClient(t, redistest.Start(t)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	key, c := newKey(), newClaim(1)
	c.TTL = 300 * time.Millisecond
	mustClaim(t, st, key, c, store.Claimed)
	start := time.Now()
	r := <-startWait(t, ctx, st, key, newClaim(1))
	d := time.Since(start)
	t.Logf("waiter of a lapsed claim ended after %v (claim life %v)", d, c.TTL)
	if !r.ok || r.err != nil || d < c.TTL-10*time.Millisecond || d > c.TTL+wakeBound {
		t.Fatalf("Wait = %v, %v after %v; want true at the claim's end (%v)", r.ok, r.err, d, c.TTL)
	}
	if res, err := st.Claim(ctx, key, newClaim(1)); err != nil || res.State != store.Claimed {
		t.Fatalf("claim after the waiter ended: %v, %v; want the lapsed key claimed", res.State, err)
	}
}

// TestWaitRedisRestart: a restart of the server while a repeat waits does
// not keep the waiter past its context; once the subscription is back,
// waiters wake on keeps again.
func TestWaitRedisRestart(t *testing.T) {
	srv := redistest.StartServer(t)
	st := newStore(t, newClient(t, srv.Addr))
	key, c := newKey(), newClaim(1)
	c.TTL = time.Minute
	mustClaim(t, st, key, c, store.Claimed)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	waiting := startWait(t, ctx, st, key, newClaim(1))
	srv.Kill()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	r := <-waiting
	d := time.Since(start)
	t.Logf("waiter across a restart returned %v, %v after %v", r.ok, r.err, d)
	if d > 1500*time.Millisecond+wakeBound {
		t.Fatalf("waiter returned after %v, past its context (1.5s)", d)
	}

	// The restarted server forgot the claim: a new one, waited on once
	// the store has subscribed again, wakes at its keep.
	wakesAfterOutage(t, st, 5*time.Second)
}

// TestWaitClosedClient: once its client is closed, a Store's waiters end
// and later Waits answer false at once (the caller polls, and fails).
func TestWaitClosedClient(t *testing.T) {
	m := newMini(t)
	c := goredis.NewClient(&goredis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	st := newStore(t, c)
	key := newKey()
	mustClaim(t, st, key, newClaim(1), store.Claimed)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	waiting := startWait(t, ctx, st, key, newClaim(1))
	c.Close()
	select {
	case <-waiting:
	case <-time.After(time.Second):
		t.Fatal("the waiter outlived its client by a second")
	}
	var ok bool
	if d := timed(func() { ok, _ = st.Wait(ctx, key, newClaim(1)) }); ok || d > wakeBound {
		t.Fatalf("Wait on a closed client = %v after %v; want false at once", ok, d)
	}
}

// TestMiddlewareWaitReplays: with WithWait, a repeat that finds the first
// request in flight gets its response replayed the moment it is kept,
// instead of 409; through a second Store, as on another instance.
func TestMiddlewareWaitReplays(t *testing.T) {
	addr := redistest.Start(t)
	var runs atomic.Int64
	release := make(chan struct{})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		<-release
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":1}`))
	})
	var hs [2]http.Handler
	for i := range hs {
		m, err := middleware.New(newStore(t, newClient(t, addr)), middleware.WithWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		hs[i] = m.Required()(handler)
	}
	key := "order-" + randomHex(8)
	send := func(h http.Handler) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewBufferString(`{}`))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	first, second := make(chan *httptest.ResponseRecorder), make(chan *httptest.ResponseRecorder)
	go func() { first <- send(hs[0]) }()
	for runs.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	go func() { second <- send(hs[1]) }()
	time.Sleep(100 * time.Millisecond) // let the repeat reach its wait
	close(release)
	a := <-first
	done := time.Now()
	b := <-second
	t.Logf("repeat answered %v after the first", time.Since(done))
	if a.Code != 201 || b.Code != 201 || b.Header().Get("Idempotent-Replayed") != "true" || a.Body.String() != b.Body.String() {
		t.Fatalf("first %d %q, repeat %d (replayed %q) %q: want the repeat to replay the first", a.Code, a.Body, b.Code, b.Header().Get("Idempotent-Replayed"), b.Body)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("%d runs", n)
	}
}

// TestWaitACL: a Redis user without the wake channel's permissions still
// keeps and releases (the scripts' PUBLISH is refused quietly), and its
// Store's Waits answer false at once, so that the middleware polls; with
// them, waiters wake.
func TestWaitACL(t *testing.T) {
	srv := redistest.StartServer(t)
	waitRules := append(slices.Clone(storeRules), "+publish", "+subscribe", "+ping", "&idem:*")
	for _, tc := range []struct {
		name  string
		rules []string
		wakes bool
	}{{"without", storeRules, false}, {"with", waitRules, true}} {
		t.Run(tc.name, func(t *testing.T) {
			user := "waiter-" + tc.name
			args := append([]string{"ACL", "SETUSER", user, "reset", "on", ">pw"}, tc.rules...)
			if _, err := redistest.Do(srv.Addr, args...); err != nil {
				t.Fatal(err)
			}
			c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, Username: user, Password: "pw", ContextTimeoutEnabled: true})
			t.Cleanup(func() { c.Close() })
			st := newStore(t, c)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			// Check says whether waiters can be woken.
			rep, err := st.Check(ctx)
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			var wakeWarnings []string
			for _, w := range rep.Warnings {
				if strings.Contains(w, "PUBLISH") || strings.Contains(w, "SUBSCRIBE") {
					wakeWarnings = append(wakeWarnings, w)
				}
			}
			if tc.wakes && len(wakeWarnings) != 0 || !tc.wakes && len(wakeWarnings) != 2 {
				t.Fatalf("Check's warnings about waking: %q", wakeWarnings)
			}
			key, first := newKey(), newClaim(1)
			mustClaim(t, st, key, first, store.Claimed)
			if !tc.wakes {
				var ok bool
				var err error
				if d := timed(func() { ok, err = st.Wait(ctx, key, newClaim(1)) }); ok || err != nil || d > time.Second {
					t.Fatalf("Wait = %v, %v after %v; want false soon", ok, err, d)
				}
				if d := timed(func() { ok, err = st.Wait(ctx, key, newClaim(1)) }); ok || err != nil || d > wakeBound {
					t.Fatalf("second Wait = %v, %v after %v; want false at once", ok, err, d)
				}
				if err := st.Complete(ctx, key, first.Token, record("kept", 1), time.Minute); err != nil {
					t.Fatalf("complete without PUBLISH: %v", err)
				}
				mustClaim(t, st, key, newClaim(1), store.Completed)
				return
			}
			waiting := startWait(t, ctx, st, key, newClaim(1))
			if err := st.Complete(ctx, key, first.Token, record("kept", 1), time.Minute); err != nil {
				t.Fatal(err)
			}
			done := time.Now()
			if r := <-waiting; !r.ok || r.err != nil || r.at.Sub(done) > wakeBound {
				t.Fatalf("Wait = %v, %v, %v after the keep", r.ok, r.err, r.at.Sub(done))
			}
		})
	}
}

// TestWaitSentinelFailover: through a FailoverClient, a repeat waiting
// while the master dies ends by its context at the latest, and once the
// store has subscribed on the promoted master, waiters wake on its keeps.
func TestWaitSentinelFailover(t *testing.T) {
	ss := redistest.StartSentinel(t, redistest.SentinelConfig{DownAfter: time.Second, FailoverTimeout: 3 * time.Second})
	c := goredis.NewFailoverClient(&goredis.FailoverOptions{
		MasterName:            ss.MasterName,
		SentinelAddrs:         ss.SentinelAddrs(),
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { c.Close() })
	st := newStore(t, c, redis.WithCallTimeout(300*time.Millisecond))
	key, first := newKey(), newClaim(1)
	first.TTL = time.Minute
	mustClaim(t, st, key, first, store.Claimed)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	waiting := startWait(t, ctx, st, key, newClaim(1))
	ss.Master.Kill()
	r := <-waiting
	d := time.Since(start)
	t.Logf("waiter across the master's death returned %v, %v after %v", r.ok, r.err, d)
	if d > 3*time.Second+wakeBound {
		t.Fatalf("waiter returned after %v, past its context (3s)", d)
	}
	wakesAfterOutage(t, st, 20*time.Second)
}

// wakesAfterOutage waits, up to within, until st's claims and waits work
// again, and checks that a waiter then wakes at a keep.
func wakesAfterOutage(t *testing.T, st *redis.Store, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for {
		key, c := newKey(), newClaim(1)
		if res, err := st.Claim(ctx, key, c); err != nil || res.State != store.Claimed {
			if ctx.Err() != nil {
				t.Fatalf("no claim within %v: %v", within, err)
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		ch := make(chan waitResult, 1)
		go func() {
			ok, err := st.Wait(ctx, key, newClaim(1))
			ch <- waitResult{ok, err, time.Now()}
		}()
		for redis.Waiting(st, key) == 0 && len(ch) == 0 {
			time.Sleep(time.Millisecond)
		}
		if len(ch) > 0 {
			if r := <-ch; r.ok || r.err != nil {
				t.Fatalf("Wait = %v, %v before the keep", r.ok, r.err)
			}
			st.Release(ctx, key, c.Token)
			time.Sleep(50 * time.Millisecond) // not subscribed yet: the caller polls
			continue
		}
		if err := st.Complete(ctx, key, c.Token, record("kept", 1), time.Minute); err != nil {
			t.Fatal(err)
		}
		done := time.Now()
		if r := <-ch; !r.ok || r.err != nil || r.at.Sub(done) > wakeBound {
			t.Fatalf("Wait = %v, %v, %v after the keep", r.ok, r.err, r.at.Sub(done))
		}
		return
	}
}

// TestWaitRing: a Ring cannot hold the one subscription (its SUBSCRIBE
// goes to one shard, and panics when none is up): Wait answers false at
// once, so that the middleware polls, on a live ring and a closed one.
func TestWaitRing(t *testing.T) {
	m := newMini(t)
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": m.Addr()}})
	st := newStore(t, ring)
	key := newKey()
	mustClaim(t, st, key, newClaim(1), store.Claimed)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, closed := range []bool{false, true} {
		if closed {
			ring.Close()
		}
		var ok bool
		var err error
		if d := timed(func() { ok, err = st.Wait(ctx, key, newClaim(1)) }); ok || err != nil || d > wakeBound {
			t.Fatalf("Wait on a ring (closed %v) = %v, %v after %v; want false at once", closed, ok, err, d)
		}
	}
}

// TestPublishOnlyWhenWaited: a keep or a release publishes on the wake
// channel only when a repeat waits for the claim (it marked the claim):
// nobody subscribed or not, a claim nobody waits for costs no PUBLISH (in a
// Cluster, a message to every node). On standalone and on a Cluster.
func TestPublishOnlyWhenWaited(t *testing.T) {
	for name, backend := range map[string]func(t *testing.T) (goredis.UniversalClient, *redis.Store){
		"standalone": func(t *testing.T) (goredis.UniversalClient, *redis.Store) {
			c := newClient(t, redistest.Start(t))
			return c, newStore(t, c)
		},
		"cluster": func(t *testing.T) (goredis.UniversalClient, *redis.Store) {
			c := clusterClient(t)
			return c, newStore(t, c)
		},
	} {
		t.Run(name, func(t *testing.T) {
			c, st := backend(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			sub := c.Subscribe(ctx, "idem:v1:settled")
			defer sub.Close()
			if _, err := sub.Receive(ctx); err != nil {
				t.Fatal(err)
			}
			// The channel is the cluster's, shared with the package's other
			// tests, whose late keeps may still publish: count this test's
			// keys only.
			heard := func(ours ...string) []string {
				var keys []string
				for {
					msg, err := sub.ReceiveTimeout(ctx, 200*time.Millisecond)
					if err != nil {
						return keys
					}
					if m, ok := msg.(*goredis.Message); ok && slices.Contains(ours, m.Payload) {
						keys = append(keys, m.Payload)
					}
				}
			}
			for _, end := range []string{"complete", "release"} {
				finish := func(key string, c store.Claim) {
					t.Helper()
					var err error
					if end == "complete" {
						err = st.Complete(ctx, key, c.Token, record("kept", 1), time.Minute)
					} else {
						err = st.Release(ctx, key, c.Token)
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				alone, first := newKey(), newClaim(1)
				mustClaim(t, st, alone, first, store.Claimed)
				finish(alone, first)
				if keys := heard(alone); len(keys) != 0 {
					t.Errorf("%s with nobody waiting published %q", end, keys)
				}

				waited, first := newKey(), newClaim(1)
				mustClaim(t, st, waited, first, store.Claimed)
				waiting := startWait(t, ctx, st, waited, newClaim(1))
				// The waiter marks the claim after registering: see it land.
				waitUntil(t, func() bool {
					e, _, err := st.Inspect(ctx, waited)
					return err == nil && len(e.Fence) > 0 && e.Fence[len(e.Fence)-1] == 'w'
				})
				finish(waited, first)
				if r := <-waiting; !r.ok || r.err != nil {
					t.Fatalf("Wait = %v, %v", r.ok, r.err)
				}
				if keys := heard(alone, waited); !slices.Equal(keys, []string{waited}) {
					t.Errorf("%s with a repeat waiting published %q, want %q once", end, keys, waited)
				}
			}
		})
	}
}

// TestWaitLostMark: a waiter's mark that does not survive (a failover to
// a replica the SETRANGE had not reached) leaves the keep with nobody to
// tell: nothing is published, and the waiter still returns at its
// recheck, well within the claim's life, to claim again.
func TestWaitLostMark(t *testing.T) {
	c := newClient(t, redistest.Start(t))
	st := newStore(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub := c.Subscribe(ctx, "idem:v1:settled")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	key, first := newKey(), newClaim(1)
	mustClaim(t, st, key, first, store.Claimed)
	began := time.Now()
	waiting := startWait(t, ctx, st, key, newClaim(1))
	waitUntil(t, func() bool {
		e, _, err := st.Inspect(ctx, key)
		return err == nil && len(e.Fence) > 0 && e.Fence[len(e.Fence)-1] == 'w'
	})
	// The mark is lost: the value as it was before the waiter marked it.
	v, err := c.Get(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetArgs(ctx, key, v[:len(v)-1], goredis.SetArgs{KeepTTL: true}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, key, first.Token, record("kept", 1), time.Minute); err != nil {
		t.Fatal(err)
	}
	if msg, err := sub.ReceiveTimeout(ctx, 200*time.Millisecond); err == nil {
		t.Errorf("a keep whose claim lost its mark published %v", msg)
	}
	r := <-waiting
	if !r.ok || r.err != nil {
		t.Fatalf("Wait = %v, %v; want true, nil", r.ok, r.err)
	}
	if took := r.at.Sub(began); took >= first.TTL {
		t.Errorf("the waiter returned after %v, not within the claim's life (%v)", took, first.TTL)
	}
	if res, err := st.Claim(ctx, key, newClaim(1)); err != nil || res.State != store.Completed {
		t.Errorf("the claim after the wait: %v, %v; want the kept record", res.State, err)
	}
}

// TestWaitReshard: a repeat waits on a claim whose slot then moves to
// another master (the claim, with the waiter's mark, migrated with it);
// the keep on the new master wakes it, through the Store's one
// subscription, within wakeBound. The slot is moved back at the end.
func TestWaitReshard(t *testing.T) {
	cl := sharedCluster(t)
	a, b := newStore(t, clusterClient(t)), newStore(t, clusterClient(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	key, first := newKey(), newClaim(1)
	slot := strconv.Itoa(redistest.Slot(key))
	src := cl.NodeForSlot(redistest.Slot(key))
	var dst *redistest.Server
	for _, n := range cl.Nodes {
		if n != src {
			dst = n
			break
		}
	}
	do := func(addr string, args ...string) string {
		t.Helper()
		v, err := redistest.Do(addr, args...)
		if err != nil {
			t.Fatalf("%s %v: %v", addr, args, err)
		}
		return v
	}
	move := func(from, to *redistest.Server, keys ...string) {
		fromID, toID := do(from.Addr, "CLUSTER", "MYID"), do(to.Addr, "CLUSTER", "MYID")
		do(to.Addr, "CLUSTER", "SETSLOT", slot, "IMPORTING", fromID)
		do(from.Addr, "CLUSTER", "SETSLOT", slot, "MIGRATING", toID)
		if len(keys) > 0 {
			host, port, _ := strings.Cut(to.Addr, ":")
			do(from.Addr, append([]string{"MIGRATE", host, port, "", "0", "5000", "KEYS"}, keys...)...)
		}
		for _, n := range cl.Nodes {
			do(n.Addr, "CLUSTER", "SETSLOT", slot, "NODE", toID)
		}
	}
	// A Store whose client still maps the slot to its first master
	// after the move: its claim (prefixed: another key in the same slot)
	// is answered MOVED, which go-redis must follow.
	stale := newStore(t, clusterClient(t), redis.WithKeyPrefix("moved:"))
	mustClaim(t, stale, newKey(), newClaim(1), store.Claimed) // the slot map is read
	mustClaim(t, a, key, first, store.Claimed)
	waiting := startWait(t, ctx, b, key, newClaim(1))
	waitUntil(t, func() bool {
		v, _ := redistest.Do(src.Addr, "GET", key)
		return strings.HasSuffix(v, "w")
	})
	move(src, dst, key)
	defer func() { move(dst, src, keysInSlot(t, dst.Addr, slot)...) }()
	if v, _ := redistest.Do(dst.Addr, "GET", key); !strings.HasSuffix(v, "w") {
		t.Fatalf("the claim reached %s without its mark", dst.Addr)
	}
	moved := newClaim(2)
	mustClaim(t, stale, key, moved, store.Claimed)
	if v, _ := redistest.Do(dst.Addr, "GET", "moved:"+key); v == "" {
		t.Errorf("the claim after the move did not reach the slot's new master %s", dst.Addr)
	}
	mustClaim(t, stale, key, newClaim(2), store.InFlight)
	if err := a.Complete(ctx, key, first.Token, record("kept", 1), time.Minute); err != nil {
		t.Fatal(err)
	}
	done := time.Now()
	r := <-waiting
	if !r.ok || r.err != nil {
		t.Fatalf("Wait = %v, %v", r.ok, r.err)
	}
	t.Logf("woken %v after the keep on the slot's new master", r.at.Sub(done))
	if lat := r.at.Sub(done); lat > wakeBound {
		t.Errorf("woken %v after the keep, want within %v", lat, wakeBound)
	}
	mustClaim(t, b, key, newClaim(1), store.Completed)
}

// keysInSlot returns the keys the node at addr holds in slot.
func keysInSlot(t *testing.T, addr, slot string) []string {
	t.Helper()
	v, err := redistest.Do(addr, "CLUSTER", "GETKEYSINSLOT", slot, "1000")
	if err != nil {
		t.Fatal(err)
	}
	if v == "" {
		return nil
	}
	return strings.Split(v, "\n")
}
