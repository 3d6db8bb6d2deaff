package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/fingerprint"
	"github.com/idemkey/idemkey/internal/redistest"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/scope"
	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// service is a payment endpoint behind the real middleware on a Redis
// store, on a redis-server of the test's own.
type service struct {
	url     string
	rdb     *goredis.Client
	st      *redis.Store
	handler http.Handler
	runs    int

	mu      sync.Mutex
	digests []string // key digests from the middleware's events
}

const paymentBody = `{"id":"pay_1","amount":10,"currency":"EUR"}`

func newService(t *testing.T) *service {
	t.Helper()
	addr := redistest.Start(t)
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	st, err := redis.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	s := &service{url: "redis://" + addr + "/0", rdb: rdb, st: st}
	idem, err := middleware.New(st, middleware.WithObserver(func(r *http.Request, e middleware.Event) {
		s.mu.Lock()
		s.digests = append(s.digests, e.KeyDigest)
		s.mu.Unlock()
	}))
	if err != nil {
		t.Fatal(err)
	}
	s.handler = idem.Required()(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.runs++
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/pay_1")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(paymentBody))
	}))
	return s
}

func paymentRequest(user, key string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":10,"currency":"EUR"}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	return r.WithContext(scope.NewContext(r.Context(), user))
}

func (s *service) pay(t *testing.T, user, key string) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	s.handler.ServeHTTP(w, paymentRequest(user, key))
	return w
}

// idemctl runs the command with the service's Redis and the given stdin,
// and returns its exit status and output.
func (s *service) idemctl(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), append([]string{"--redis", s.url}, args...), strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func decodeEntry(t *testing.T, out string) entry {
	t.Helper()
	var e entry
	if err := json.Unmarshal([]byte(out), &e); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	return e
}

func TestShowFindsAndDescribesARecord(t *testing.T) {
	s := newService(t)
	if w := s.pay(t, "alice", "k1"); w.Code != http.StatusCreated {
		t.Fatalf("first payment: %d %s", w.Code, w.Body)
	}
	wantFP := fingerprint.Default(paymentRequest("alice", "k1"), []byte(`{"amount":10,"currency":"EUR"}`))
	wantKey := store.KeyName("alice", "k1")

	// By scope and key.
	code, out, errOut := s.idemctl(t, "", "--json", "show", "--scope", "alice", "--key", "k1")
	if code != 0 {
		t.Fatalf("show: exit %d: %s", code, errOut)
	}
	e := decodeEntry(t, out)
	if !e.Found || e.State != "completed" || e.Key != wantKey || e.Status != 201 {
		t.Errorf("show: %+v", e)
	}
	if e.Fingerprint != hex.EncodeToString(wantFP[:]) {
		t.Errorf("fingerprint %s, want %x", e.Fingerprint, wantFP)
	}
	if e.BodyBytes == nil || *e.BodyBytes != len(paymentBody) || e.BodyOmitted {
		t.Errorf("body bytes %v omitted %v, want %d", e.BodyBytes, e.BodyOmitted, len(paymentBody))
	}
	if e.Headers["Location"] == nil || e.Headers["Location"][0] != "/payments/pay_1" {
		t.Errorf("headers %v", e.Headers)
	}
	// Kept for the default retention of 24 hours; the test does not take
	// an hour.
	if e.TTLSeconds <= (23*time.Hour).Seconds() || e.TTLSeconds > (24*time.Hour).Seconds() {
		t.Errorf("ttl %v s, want just under %v", e.TTLSeconds, 24*time.Hour)
	}
	if e.CreatedAt == nil || e.AgeSeconds < 0 || e.AgeSeconds > time.Hour.Seconds() || e.CompletedAt == nil || e.CompletedAt.Before(*e.CreatedAt) {
		t.Errorf("created %v age %v completed %v", e.CreatedAt, e.AgeSeconds, e.CompletedAt)
	}
	if e.ValueBytes <= len(paymentBody) || e.MemoryBytes < int64(e.ValueBytes) {
		t.Errorf("value %d bytes, memory %d bytes", e.ValueBytes, e.MemoryBytes)
	}
	if e.Body != nil {
		t.Errorf("body printed without --body")
	}

	// By the digest the middleware reported in its events, as a log line
	// would carry it; --json after the command works as well.
	s.mu.Lock()
	digest := s.digests[0]
	s.mu.Unlock()
	if digest != store.DigestOf(wantKey) {
		t.Fatalf("event digest %s, key %s", digest, wantKey)
	}
	code, out, errOut = s.idemctl(t, "", "show", "--digest", strings.ToUpper(digest), "--json", "--body")
	if code != 0 {
		t.Fatalf("show --digest: exit %d: %s", code, errOut)
	}
	byDigest := decodeEntry(t, out)
	if byDigest.Key != wantKey || byDigest.Fingerprint != e.Fingerprint || byDigest.Body == nil || *byDigest.Body != paymentBody {
		t.Errorf("show --digest: %+v", byDigest)
	}

	// As text.
	code, out, _ = s.idemctl(t, "", "show", "--scope", "alice", "--key", "k1")
	for _, want := range []string{"completed", "201 Created", hex.EncodeToString(wantFP[:]), digest, "Location: /payments/pay_1", fmt.Sprintf(" %d bytes\n", len(paymentBody))} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("text output (exit %d) lacks %q:\n%s", code, want, out)
		}
	}

	// Another scope's key of the same name is not there.
	code, out, _ = s.idemctl(t, "", "--json", "show", "--scope", "bob", "--key", "k1")
	if e := decodeEntry(t, out); code != 1 || e.Found || e.Key != store.KeyName("bob", "k1") {
		t.Errorf("bob's k1: exit %d, %+v", code, e)
	}
}

func TestShowInFlight(t *testing.T) {
	s := newService(t)
	key := store.KeyName("alice", "running")
	fp := [32]byte{0xab}
	if _, err := s.st.Claim(context.Background(), key, store.Claim{Token: "t1", Fingerprint: fp, TTL: 35 * time.Second}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := s.idemctl(t, "", "--json", "show", "--scope", "alice", "--key", "running")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	e := decodeEntry(t, out)
	if e.State != "in_flight" || e.Fingerprint != hex.EncodeToString(fp[:]) || e.Status != 0 || e.BodyBytes != nil ||
		e.TTLSeconds <= 0 || e.TTLSeconds > 35 {
		t.Errorf("in-flight claim shown as %+v", e)
	}
	if strings.Contains(out, "t1") {
		t.Errorf("output shows the owner token:\n%s", out)
	}
}

func TestDeleteAsksThenDeletes(t *testing.T) {
	s := newService(t)
	s.pay(t, "alice", "k1")
	key := store.KeyName("alice", "k1")
	exists := func() bool {
		n, err := s.rdb.Exists(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}

	// Declined.
	code, out, errOut := s.idemctl(t, "n\n", "delete", "--scope", "alice", "--key", "k1")
	if code != 1 || !exists() || !strings.Contains(errOut, "Delete "+key+"?") || !strings.Contains(errOut, "run the handler again") {
		t.Fatalf("declined: exit %d, exists %v\nstdout %s\nstderr %s", code, exists(), out, errOut)
	}
	// No answer at all (stdin closed) declines too.
	if code, _, _ := s.idemctl(t, "", "delete", "--scope", "alice", "--key", "k1"); code != 1 || !exists() {
		t.Fatalf("no answer: exit %d, exists %v", code, exists())
	}

	// A replay still comes from the store, so the handler ran once.
	if w := s.pay(t, "alice", "k1"); w.Header().Get("Idempotent-Replayed") != "true" || s.runs != 1 {
		t.Fatalf("before deletion: replayed %q, runs %d", w.Header().Get("Idempotent-Replayed"), s.runs)
	}

	// Confirmed.
	code, out, errOut = s.idemctl(t, "yes\n", "--json", "delete", "--scope", "alice", "--key", "k1")
	if code != 0 || exists() {
		t.Fatalf("confirmed: exit %d, exists %v\n%s%s", code, exists(), out, errOut)
	}
	var d struct {
		Deleted bool   `json:"deleted"`
		State   string `json:"state"`
		Key     string `json:"key"`
	}
	if err := json.Unmarshal([]byte(out), &d); err != nil || !d.Deleted || d.State != "completed" || d.Key != key {
		t.Errorf("delete --json: %v %+v\n%s", err, d, out)
	}

	// Gone: show says so, and a retry runs the handler again.
	if code, _, _ := s.idemctl(t, "", "show", "--scope", "alice", "--key", "k1"); code != 1 {
		t.Errorf("show after delete: exit %d", code)
	}
	if w := s.pay(t, "alice", "k1"); w.Header().Get("Idempotent-Replayed") != "" || s.runs != 2 {
		t.Errorf("after deletion: replayed %q, runs %d", w.Header().Get("Idempotent-Replayed"), s.runs)
	}

	// --yes deletes by digest without asking; deleting again finds nothing.
	code, out, errOut = s.idemctl(t, "", "delete", "--yes", "--digest", store.DigestOf(key))
	if code != 0 || exists() || errOut != "" || !strings.Contains(out, "deleted") {
		t.Errorf("delete --yes: exit %d, exists %v\n%s%s", code, exists(), out, errOut)
	}
	if code, out, _ := s.idemctl(t, "", "delete", "--yes", "--digest", store.DigestOf(key)); code != 1 || !strings.Contains(out, "nothing to delete") {
		t.Errorf("second delete: exit %d\n%s", code, out)
	}
}

// A value that changes between the question and the answer is not deleted.
func TestDeleteOnlyWhatWasShown(t *testing.T) {
	s := newService(t)
	s.pay(t, "alice", "k1")
	key := store.KeyName("alice", "k1")
	// The answer arrives after the value changed.
	stdin := readerFunc(func(p []byte) (int, error) {
		if err := s.rdb.Set(context.Background(), key, "\x12changed", time.Hour).Err(); err != nil {
			t.Error(err)
		}
		return copy(p, "y\n"), nil
	})
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"--redis", s.url, "--json", "delete", "--scope", "alice", "--key", "k1"}, stdin, &out, &errOut)
	var d deleted
	json.Unmarshal(out.Bytes(), &d)
	if code != 1 || d.Deleted || d.Reason != "changed" {
		t.Errorf("exit %d, %s", code, out.String())
	}
	if v, _ := s.rdb.Get(context.Background(), key).Result(); v != "\x12changed" {
		t.Errorf("value now %q", v)
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

func TestStats(t *testing.T) {
	s := newService(t)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		s.pay(t, "alice", k)
	}
	if _, err := s.st.Claim(ctx, store.KeyName("bob", "running"), store.Claim{Token: "t", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	// Not idemkey's, or not readable by this version.
	s.rdb.Set(ctx, "session:42", "x", 0)
	s.rdb.Set(ctx, store.KeyName("carol", "future"), "\x31later format", 0)

	code, out, errOut := s.idemctl(t, "", "--json", "stats", "--count", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var sum summary
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		t.Fatal(err)
	}
	if sum.Keys != 5 || sum.Records != 3 || sum.InFlight != 1 || sum.Unreadable != 1 {
		t.Errorf("counted %+v", sum)
	}
	if !sum.Exact || sum.Sampled != 5 || sum.EstimatedBytes != sum.SampledBytes || sum.BytesPerKey <= 0 {
		t.Errorf("memory %+v", sum)
	}
	if len(sum.Nodes) != 1 || sum.Nodes[0].DBSize != 6 || sum.Nodes[0].UsedMemory <= 0 || sum.Nodes[0].MaxmemoryPolicy == "" {
		t.Errorf("nodes %+v", sum.Nodes)
	}

	// A sample smaller than the store estimates from the mean.
	code, out, _ = s.idemctl(t, "", "--json", "stats", "--sample", "2")
	sum = summary{}
	json.Unmarshal([]byte(out), &sum)
	if code != 0 || sum.Exact || sum.Sampled != 2 || sum.Keys != 5 || sum.EstimatedBytes != int64(sum.BytesPerKey*5) {
		t.Errorf("sampled stats: exit %d %+v", code, sum)
	}

	// Text.
	code, out, _ = s.idemctl(t, "", "stats")
	for _, want := range []string{"records", "in flight", "unreadable", "maxmemory-policy", "WARNING: no maxmemory"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("text stats lack %q:\n%s", want, out)
		}
	}
	// With a maxmemory set, that warning goes.
	if err := s.rdb.ConfigSet(ctx, "maxmemory", "256mb").Err(); err != nil {
		t.Fatal(err)
	}
	code, out, _ = s.idemctl(t, "", "stats")
	if code != 0 || strings.Contains(out, "no maxmemory") || !strings.Contains(out, "maxmemory 268435456") {
		t.Errorf("stats with maxmemory set:\n%s", out)
	}
}

func TestUsage(t *testing.T) {
	// Usage errors are found before any store is reached: not even one
	// named by the environment.
	t.Setenv("DATABASE_URL", "")
	t.Setenv("REDIS_URL", "")
	for name, args := range map[string][]string{
		"no command":       {},
		"unknown command":  {"list"},
		"no key":           {"show", "--scope", "alice"},
		"digest and key":   {"show", "--digest", strings.Repeat("a", 64), "--key", "k"},
		"short digest":     {"show", "--digest", "abc"},
		"not hex":          {"delete", "--digest", strings.Repeat("g", 64)},
		"stray argument":   {"stats", "extra"},
		"bad count":        {"stats", "--count", "0"},
		"bad url":          {"--redis", "http://x", "stats"},
		"unknown flag":     {"show", "--scope", "a", "--key", "k", "--bogus"},
		"unknown top flag": {"--bogus", "stats"},
	} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, strings.NewReader(""), &out, &errOut); code != 2 {
			t.Errorf("%s: exit %d, want 2 (%s)", name, code, errOut.String())
		}
	}
}

// --help names every store each command works on: stats counts on
// Redis, PostgreSQL and MySQL alike.
func TestHelpNamesTheStores(t *testing.T) {
	var out, errOut bytes.Buffer
	run(context.Background(), []string{"--help"}, strings.NewReader(""), &out, &errOut)
	help := out.String() + errOut.String()
	i := strings.Index(help, "  stats ")
	if i < 0 {
		t.Fatalf("no stats in --help:\n%s", help)
	}
	stats := help[i:]
	if j := strings.Index(stats, "\n\n"); j >= 0 {
		stats = stats[:j]
	}
	for _, name := range []string{"Redis", "PostgreSQL", "MySQL"} {
		if !strings.Contains(stats, name) {
			t.Errorf("--help's stats line does not name %s:\n%s", name, stats)
		}
	}
}

func TestUnreachable(t *testing.T) {
	var out, errOut bytes.Buffer
	// Port 1 on loopback refuses connections.
	code := run(context.Background(), []string{"--redis", "redis://127.0.0.1:1/0", "--timeout", "5s", "show", "--scope", "a", "--key", "k"}, strings.NewReader(""), &out, &errOut)
	if code != 1 || errOut.Len() == 0 {
		t.Errorf("exit %d, stderr %q", code, errOut.String())
	}
}

// TestGlobalFlagsAfterTheCommand: the flags that choose the store and the
// output are accepted after the command as well as before it (idemctl show
// --redis URL ... used to fail with "flag provided but not defined").
func TestGlobalFlagsAfterTheCommand(t *testing.T) {
	s := newService(t)
	if w := s.pay(t, "alice", "k1"); w.Code != http.StatusCreated {
		t.Fatalf("first payment: %d %s", w.Code, w.Body)
	}
	for name, args := range map[string][]string{
		"after":           {"show", "--redis", s.url, "--json", "--timeout", "10s", "--scope", "alice", "--key", "k1"},
		"after, = form":   {"show", "--scope", "alice", "--redis=" + s.url, "--key", "k1", "--json=true"},
		"split":           {"--json", "show", "--scope", "alice", "--key", "k1", "--redis", s.url},
		"before":          {"--redis", s.url, "--json", "show", "--scope", "alice", "--key", "k1"},
		"after overrides": {"--redis", "redis://127.0.0.1:1/0", "show", "--redis", s.url, "--json", "--scope", "alice", "--key", "k1"},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), args, strings.NewReader(""), &out, &errOut)
		if code != 0 {
			t.Errorf("%s: exit %d: %s", name, code, errOut.String())
			continue
		}
		if e := decodeEntry(t, out.String()); !e.Found || e.State != "completed" || e.Status != http.StatusCreated {
			t.Errorf("%s: %+v", name, e)
		}
	}
	// A global flag's bad value after the command is a usage error too.
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"stats", "--redis", "http://x"}, strings.NewReader(""), &out, &errOut); code != exitUsage {
		t.Errorf("stats --redis http://x: exit %d, want %d (%s)", code, exitUsage, errOut.String())
	}
}
