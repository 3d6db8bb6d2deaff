package redis_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// testBudget is the call budget of stores in tests that check what the
// store does rather than when: wide, so that a loaded machine running the
// race detector does not turn a slow answer into a failure. The fault tests
// set the default 300ms budget themselves.
const testBudget = 5 * time.Second

// newClient returns a client to addr with the options the package
// documentation recommends.
func newClient(t testing.TB, addr string) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		PoolSize:              64,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// newStore returns a store on c with a call budget of testBudget, unless
// opts set another.
func newStore(t testing.TB, c goredis.UniversalClient, opts ...redis.Option) *redis.Store {
	t.Helper()
	st, err := redis.New(c, append([]redis.Option{redis.WithCallTimeout(testBudget)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// mini is a miniredis whose FastForward also moves the clock of the stores
// on it (see miniStore): claims carry their expiry on the claimer's clock.
type mini struct {
	*miniredis.Miniredis
	offset atomic.Int64
}

func newMini(t *testing.T) *mini { return &mini{Miniredis: miniredis.RunT(t)} }

func (m *mini) FastForward(d time.Duration) {
	m.Miniredis.FastForward(d)
	m.offset.Add(int64(d))
}

func (m *mini) now() time.Time { return time.Now().Add(time.Duration(m.offset.Load())) }

// store returns a store on m whose clock moves with m's.
func (m *mini) store(t testing.TB, opts ...redis.Option) *redis.Store {
	st := newStore(t, newClient(t, m.Addr()), opts...)
	redis.SetClock(st, m.now)
	return st
}

// miniStore returns a store on a fresh miniredis, with one clock.
func miniStore(t *testing.T, opts ...redis.Option) (*redis.Store, *mini) {
	t.Helper()
	mr := newMini(t)
	return mr.store(t, opts...), mr
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// newKey returns a fresh store key in a random scope.
func newKey() string { return store.KeyName("test-"+randomHex(4), randomHex(8)) }

func newClaim(fp byte) store.Claim {
	return store.Claim{Token: randomHex(16), Fingerprint: [32]byte{fp}, TTL: 5 * time.Second}
}

func record(body string, fp byte) *store.Record {
	return &store.Record{
		Status:      201,
		Header:      http.Header{"Content-Type": {"application/json"}},
		Body:        []byte(body),
		Fingerprint: [32]byte{fp},
		CreatedAt:   time.Unix(1767225600, 0),
		CompletedAt: time.Unix(1767225601, 0),
	}
}

func mustClaim(t *testing.T, st store.Store, key string, c store.Claim, want store.State) store.Result {
	t.Helper()
	res, err := st.Claim(context.Background(), key, c)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if res.State != want {
		t.Fatalf("claim state = %v, want %v", res.State, want)
	}
	return res
}

func TestLifecycle(t *testing.T) {
	st, mr := miniStore(t)
	ctx := context.Background()
	key := newKey()
	a, b := newClaim(1), newClaim(2)

	res := mustClaim(t, st, key, a, store.Claimed)
	if res.Fingerprint != a.Fingerprint {
		t.Errorf("claimed fingerprint = %x", res.Fingerprint[:1])
	}
	mustClaim(t, st, key, a, store.Mine)
	res = mustClaim(t, st, key, b, store.InFlight)
	if res.Fingerprint != a.Fingerprint {
		t.Errorf("in-flight fingerprint = %x, want the holder's", res.Fingerprint[:1])
	}
	if res.TTL <= 0 || res.TTL > a.TTL {
		t.Errorf("in-flight TTL = %v, want in (0, %v]", res.TTL, a.TTL)
	}
	mr.FastForward(2 * time.Second)
	if res := mustClaim(t, st, key, b, store.InFlight); res.TTL > 3*time.Second {
		t.Errorf("TTL after 2s of 5s = %v", res.TTL)
	}

	for name, err := range map[string]error{
		"complete": st.Complete(ctx, key, b.Token, record("b", 2), time.Hour),
		"release":  st.Release(ctx, key, b.Token),
		"extend":   st.Extend(ctx, key, b.Token, time.Minute),
	} {
		if !errors.Is(err, store.ErrNotOwner) {
			t.Errorf("%s by a stranger: %v, want ErrNotOwner", name, err)
		}
	}
	if err := st.Extend(ctx, key, a.Token, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := mr.TTL(key); got != time.Minute {
		t.Errorf("TTL after extend = %v, want 1m", got)
	}
	want := record(`{"id":1}`, 1)
	if err := st.Complete(ctx, key, a.Token, want, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := mr.TTL(key); got != time.Hour {
		t.Errorf("TTL of record = %v, want retention 1h", got)
	}
	for _, c := range []store.Claim{a, b} {
		res := mustClaim(t, st, key, c, store.Completed)
		if res.Record == nil || string(res.Record.Body) != `{"id":1}` || res.Record.Status != 201 ||
			res.Record.Header.Get("Content-Type") != "application/json" || res.Fingerprint != want.Fingerprint ||
			!res.Record.CreatedAt.Equal(want.CreatedAt) || !res.Record.CompletedAt.Equal(want.CompletedAt) {
			t.Errorf("replay = %+v", res.Record)
		}
	}
	// A record is no claim: nobody, its writer included, can change it. A
	// second complete by the writer finds its own record and counts as kept
	// (it is what a resent complete sees), writing nothing.
	kept, _ := mr.Get(key)
	if err := st.Complete(ctx, key, a.Token, record("again", 1), time.Minute); err != nil {
		t.Errorf("complete of its own record by the writer: %v, want nil", err)
	}
	for name, err := range map[string]error{
		"complete by a stranger": st.Complete(ctx, key, b.Token, record("again", 2), time.Hour),
		"release":                st.Release(ctx, key, a.Token),
		"extend":                 st.Extend(ctx, key, a.Token, time.Minute),
	} {
		if !errors.Is(err, store.ErrNotOwner) {
			t.Errorf("%s of a record: %v, want ErrNotOwner", name, err)
		}
	}
	if v, _ := mr.Get(key); v != kept || mr.TTL(key) != time.Hour {
		t.Errorf("record changed: TTL %v", mr.TTL(key))
	}
	mr.FastForward(time.Hour)
	mustClaim(t, st, key, b, store.Claimed)
}

// TestRawDigestKept: a record's raw digest is kept beside its
// fingerprint and comes back with the replay, and a record kept without
// one comes back with a zero digest.
func TestRawDigestKept(t *testing.T) {
	st, _ := miniStore(t)
	ctx := context.Background()
	for _, raw := range [][32]byte{{1, 2, 3, 31: 4}, {}} {
		key, c := newKey(), newClaim(1)
		mustClaim(t, st, key, c, store.Claimed)
		rec := record("x", 1)
		rec.RawDigest = raw
		if err := st.Complete(ctx, key, c.Token, rec, time.Minute); err != nil {
			t.Fatal(err)
		}
		res := mustClaim(t, st, key, newClaim(1), store.Completed)
		if res.Record.RawDigest != raw || res.Record.Fingerprint != rec.Fingerprint {
			t.Errorf("replayed raw digest %x, fingerprint %x; want %x, %x", res.Record.RawDigest, res.Record.Fingerprint, raw, rec.Fingerprint)
		}
	}
}

func TestRelease(t *testing.T) {
	st, mr := miniStore(t)
	ctx := context.Background()
	key := newKey()
	a := newClaim(1)
	mustClaim(t, st, key, a, store.Claimed)
	if err := st.Release(ctx, key, a.Token); err != nil {
		t.Fatal(err)
	}
	if mr.Exists(key) {
		t.Fatal("released claim still stored")
	}
	// A second release finds the key free, as it asks: what a resent
	// release sees.
	if err := st.Release(ctx, key, a.Token); err != nil {
		t.Errorf("second release: %v, want nil", err)
	}
	if err := st.Complete(ctx, key, a.Token, record("x", 1), time.Hour); !errors.Is(err, store.ErrNotOwner) {
		t.Errorf("complete after release: %v, want ErrNotOwner", err)
	}
	if mr.Exists(key) {
		t.Fatal("complete after release wrote a record")
	}
	mustClaim(t, st, key, newClaim(2), store.Claimed)
}

func TestLapsedClaim(t *testing.T) {
	st, mr := miniStore(t)
	ctx := context.Background()
	key := newKey()
	a, b := newClaim(1), newClaim(2)
	a.TTL = time.Second
	mustClaim(t, st, key, a, store.Claimed)
	mr.FastForward(999 * time.Millisecond)
	mustClaim(t, st, key, b, store.InFlight)
	mr.FastForward(time.Millisecond)
	mustClaim(t, st, key, b, store.Claimed)
	if err := st.Complete(ctx, key, a.Token, record("late", 1), time.Hour); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("late complete: %v, want ErrNotOwner", err)
	}
	if err := st.Complete(ctx, key, b.Token, record("b", 2), time.Hour); err != nil {
		t.Fatal(err)
	}
	if res := mustClaim(t, st, key, a, store.Completed); string(res.Record.Body) != "b" {
		t.Errorf("record body %q, want the new owner's", res.Record.Body)
	}
}

func TestTTLRoundsUpToMilliseconds(t *testing.T) {
	st, mr := miniStore(t)
	key := newKey()
	c := newClaim(1)
	c.TTL = 1500 * time.Microsecond
	mustClaim(t, st, key, c, store.Claimed)
	if got := mr.TTL(key); got != 2*time.Millisecond {
		t.Errorf("TTL = %v, want 2ms", got)
	}
}

func TestInvalidArguments(t *testing.T) {
	st, mr := miniStore(t)
	ctx := context.Background()
	key := newKey()
	ok := newClaim(1)
	bad := map[string]store.Claim{
		"empty token": {Token: "", TTL: time.Second},
		"long token":  {Token: strings.Repeat("t", redis.MaxTokenLen+1), TTL: time.Second},
		"zero TTL":    {Token: "t", TTL: 0},
		"negative":    {Token: "t", TTL: -time.Second},
	}
	for name, c := range bad {
		if _, err := st.Claim(ctx, key, c); err == nil || errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s: err = %v, want an argument error", name, err)
		}
	}
	mustClaim(t, st, key, ok, store.Claimed)
	if err := st.Complete(ctx, key, ok.Token, nil, time.Hour); err == nil {
		t.Error("nil record accepted")
	}
	if err := st.Complete(ctx, key, ok.Token, record("x", 1), 0); err == nil {
		t.Error("zero retention accepted")
	}
	if err := st.Extend(ctx, key, ok.Token, 0); err == nil {
		t.Error("zero extend accepted")
	}
	if err := st.Complete(ctx, key, ok.Token, &store.Record{Status: 1 << 20}, time.Hour); err == nil {
		t.Error("status 1<<20 accepted")
	}
	// None of the refused calls changed the claim.
	mustClaim(t, st, key, ok, store.Mine)
	if got := mr.TTL(key); got != ok.TTL {
		t.Errorf("TTL = %v, want %v", got, ok.TTL)
	}
}

func TestUnreadableValue(t *testing.T) {
	st, mr := miniStore(t)
	ctx := context.Background()
	for name, v := range map[string]string{
		"future record": "\x32\x03tok\x00" + strings.Repeat("x", 60),
		"future claim":  "\x31\x03tok" + strings.Repeat("x", 40),
		"damaged":       "\x12\x00\x00",
	} {
		key := newKey()
		mr.Set(key, v)
		_, err := st.Claim(ctx, key, newClaim(1))
		if !errors.Is(err, redis.ErrUnreadable) || errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s: claim err = %v, want ErrUnreadable and not ErrUnavailable", name, err)
		}
		if got, _ := mr.Get(key); got != v {
			t.Errorf("%s: claim changed the value", name)
		}
	}
}

func TestBackendErrorsAreUnavailable(t *testing.T) {
	// go-redis retries READONLY, LOADING, MASTERDOWN and CLUSTERDOWN until
	// the call's budget ends (the error is then the deadline); OOM and ERR
	// come back at once with the server's words.
	for msg, retried := range map[string]bool{
		"OOM command not allowed when used memory > 'maxmemory'.": false,
		"ERR unexpected": false,
		"READONLY You can't write against a read only replica.":                            true,
		"LOADING Redis is loading the dataset in memory":                                   true,
		"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.": true,
		"CLUSTERDOWN The cluster is down":                                                  true,
	} {
		t.Run(strings.Fields(msg)[0], func(t *testing.T) {
			st, mr := miniStore(t, redis.WithCallTimeout(200*time.Millisecond))
			ctx := context.Background()
			key := newKey()
			c := newClaim(1)
			mustClaim(t, st, key, c, store.Claimed)
			mr.SetError(msg)
			_, err := st.Claim(ctx, newKey(), newClaim(1))
			checkUnavailable(t, "claim", err)
			var rerr goredis.Error
			if !retried && (!errors.As(err, &rerr) || !strings.HasPrefix(rerr.Error(), strings.Fields(msg)[0])) {
				t.Errorf("claim err %v does not carry the server's error", err)
			}
			if retried && !errors.Is(err, context.DeadlineExceeded) && !errors.As(err, &rerr) {
				t.Errorf("claim err %v carries neither the deadline nor the server's error", err)
			}
			checkUnavailable(t, "complete", st.Complete(ctx, key, c.Token, record("x", 1), time.Hour))
			checkUnavailable(t, "release", st.Release(ctx, key, c.Token))
			checkUnavailable(t, "extend", st.Extend(ctx, key, c.Token, time.Minute))
		})
	}
}

func checkUnavailable(t *testing.T, op string, err error) {
	t.Helper()
	if !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("%s: err = %v, want ErrUnavailable", op, err)
	}
	if errors.Is(err, store.ErrNotOwner) {
		t.Errorf("%s: backend failure reported as ErrNotOwner", op)
	}
}

func TestClosedServerIsUnavailable(t *testing.T) {
	st, mr := miniStore(t)
	mr.Close()
	_, err := st.Claim(context.Background(), newKey(), newClaim(1))
	checkUnavailable(t, "claim", err)
}

func TestScriptsLoadThemselves(t *testing.T) {
	// A server that lost its script cache (restart, failover, SCRIPT FLUSH)
	// gets the scripts again by EVAL.
	st, mr := miniStore(t)
	ctx := context.Background()
	key := newKey()
	c := newClaim(1)
	mustClaim(t, st, key, c, store.Claimed)
	cl := newClient(t, mr.Addr())
	if err := cl.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, key, c.Token, record("x", 1), time.Hour); err != nil {
		t.Fatalf("complete after SCRIPT FLUSH: %v", err)
	}
	mustClaim(t, st, key, newClaim(2), store.Completed)
}

func TestNew(t *testing.T) {
	mr := miniredis.RunT(t)
	c := newClient(t, mr.Addr())
	if _, err := redis.New(nil); err == nil {
		t.Error("nil client accepted")
	}
	for name, o := range map[string]redis.Option{
		"nil option":        nil,
		"zero call timeout": redis.WithCallTimeout(0),
		"negative timeout":  redis.WithCallTimeout(-time.Second),
		"zero replicas":     redis.WithWaitReplicas(0, time.Second),
		"zero wait timeout": redis.WithWaitReplicas(1, 0),
		"sub-ms wait":       redis.WithWaitReplicas(1, time.Microsecond),
		"negative replicas": redis.WithWaitReplicas(-1, time.Second),
	} {
		if _, err := redis.New(c, o); err == nil || !strings.HasPrefix(err.Error(), "idemkey: redis: ") {
			t.Errorf("%s: error %v, want one prefixed idemkey: redis:", name, err)
		}
	}
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": mr.Addr()}})
	defer ring.Close()
	if _, err := redis.New(ring, redis.WithWaitReplicas(1, time.Second)); err == nil {
		t.Error("WithWaitReplicas accepted a Ring, which cannot pin a connection")
	}
	if _, err := redis.New(ring); err != nil {
		t.Errorf("Ring without WAIT refused: %v", err)
	}
	if _, err := redis.New(ring, redis.WithAutoPipeline()); err == nil {
		t.Error("WithAutoPipeline accepted a Ring, which go-redis cannot pipeline automatically")
	}
	if _, err := redis.New(c, redis.WithAutoPipeline()); err != nil {
		t.Errorf("WithAutoPipeline refused a Client: %v", err)
	}
	if _, err := redis.New(c, redis.WithCallTimeout(time.Second), redis.WithWaitReplicas(1, time.Second),
		redis.WithEvictionWarning(), redis.WithContextTimeouts(true)); err != nil {
		t.Errorf("valid options refused: %v", err)
	}
}

// TestNewReportsEveryProblem: one call to New names every invalid option,
// every nil option (by position) and a nil client, not only the first.
func TestNewReportsEveryProblem(t *testing.T) {
	_, err := redis.New(nil,
		redis.WithCallTimeout(-time.Second),
		nil,
		redis.WithEvictionWarning(),
		redis.WithWaitReplicas(0, time.Second),
	)
	if err == nil {
		t.Fatal("New accepted a nil client and three bad options")
	}
	for _, want := range []string{"nil client", "WithCallTimeout(-1s)", "option 2 is nil", "WithWaitReplicas(0, 1s)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	t.Logf("New: %v", err)
}

// TestClaimFindsV1Claim: a claim written by an earlier release (version 1,
// which does not carry its expiry) is reported in flight, its remaining
// life asked of the server.
func TestClaimFindsV1Claim(t *testing.T) {
	st, mr := miniStore(t)
	key := newKey()
	created := time.Unix(1767225600, 0)
	// tag, owner, fingerprint {7, 0, ...}, created-at
	b := []byte{0x11, 3, 'o', 'l', 'd', 7}
	b = append(b, make([]byte, 31)...)
	b = binary.BigEndian.AppendUint64(b, uint64(created.UnixNano()))
	mr.Set(key, string(b))
	mr.SetTTL(key, 20*time.Second)
	res := mustClaim(t, st, key, newClaim(1), store.InFlight)
	if res.Fingerprint != [32]byte{7} || !res.ClaimedAt.Equal(created) || res.TTL != 20*time.Second {
		t.Errorf("v1 claim found as %+v, want fingerprint 07.., claimed at %v, 20s left", res, created)
	}
	// Its owner's token is an earlier release's: no caller of this one
	// can complete or release it.
	if err := st.Complete(context.Background(), key, "old", record("x", 7), time.Hour); !errors.Is(err, store.ErrNotOwner) {
		t.Errorf("complete of a v1 claim: %v, want ErrNotOwner", err)
	}
}

// TestExtendMovesExpiry: the remaining life an in-flight answer reports
// comes from the claim's value, which Extend rewrites with the key's TTL.
func TestExtendMovesExpiry(t *testing.T) {
	st, mr := miniStore(t)
	ctx := context.Background()
	key, a := newKey(), newClaim(1)
	mustClaim(t, st, key, a, store.Claimed)
	for _, life := range []time.Duration{time.Hour, 2 * time.Second} {
		if err := st.Extend(ctx, key, a.Token, life); err != nil {
			t.Fatal(err)
		}
		mr.FastForward(time.Second)
		res := mustClaim(t, st, key, newClaim(2), store.InFlight)
		// The store's clock also moves with real time, which miniredis's
		// TTLs do not: allow for the time the test itself takes.
		want := life - time.Second
		if res.TTL > want || res.TTL < want-time.Second || mr.TTL(key) != want {
			t.Errorf("extended to %v, a second later: reported %v, key's TTL %v; want %v", life, res.TTL, mr.TTL(key), want)
		}
	}
}
