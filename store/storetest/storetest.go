// Package storetest checks that a store.Store keeps the promises the
// middleware relies on. It is the conformance suite every store runs in its
// own tests, in the manner of testing/fstest.TestFS.
//
// A store's test file calls Run with a function that builds the store under
// test:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Harness {
//			clock := newFakeClock()
//			s := mystore.New(mystore.WithClock(clock.Now))
//			t.Cleanup(func() { s.Close() })
//			return storetest.Harness{Store: s, Advance: clock.Advance}
//		})
//	}
//
// Run runs one subtest per promise, one after another (never in parallel, so
// that a clock shared between subtests only moves when the subtest that owns
// it moves it). Each subtest asks for a fresh Harness; returning the same
// store every time is fine, because every subtest makes its keys with
// store.KeyName under a random scope of its own, so suites can also run
// against a shared server.
//
// Time is the one thing a store cannot fake on its own. When Harness.Advance
// is set, the suite moves the store's clock with it and runs in no real time
// at all; stores over a backend with a controllable clock (an injected clock
// function, miniredis FastForward) should set it. When Advance is nil the
// suite waits in real time instead, with claims and records that live 200ms
// and waits of 300ms, which takes a few seconds in all.
//
// What the suite holds a store to, beyond the doc comments of store.Store:
//
//   - Claim answers Claimed for a free key, Mine for a key held under the
//     caller's own token, InFlight (with the holder's fingerprint, a
//     remaining life in (0, TTL] and when it was claimed) for a key held
//     under another token, and Completed (with the kept record and its
//     fingerprint) once the key is completed, whoever asks. Result.Record is
//     nil unless Completed.
//   - Complete answers ErrNotOwner, and changes nothing, for a wrong token, a
//     missing key and a lapsed claim; for a key the same token already
//     completed it answers nil and changes nothing (a resent Complete). A
//     completed record can never be overwritten, released or extended.
//   - Release answers nil for a key that holds nothing (a resent Release, a
//     lapsed claim) and ErrNotOwner for a key held by another token or
//     completed.
//   - Complete keeps the record as given: status, header (a nil header and an
//     empty one are the same), body byte for byte (NULs, invalid UTF-8, an
//     empty body, 1 MiB), BodyOmitted, fingerprint, and CreatedAt and
//     CompletedAt to at least millisecond precision (time.Time.Equal).
//   - Claims lapse after their TTL and records after their retention.
//   - A store.Extender's Extend sets a claim's remaining life (longer or
//     shorter) and answers ErrNotOwner as Complete does. The Extend subtests
//     are skipped for a store that is not an Extender.
//   - Under concurrency exactly one of 64 racing claims wins, racing
//     Complete and Release calls by the owner end with either a record one
//     of the successful Completes gave or a free key (never both kinds
//     succeed), and distinct keys never see each other's records.
//   - A call with a context that is already cancelled returns an error and
//     changes nothing.
//   - A store.Inspector's Inspect reports a free key as not found, a claim
//     in flight with its fingerprint, creation time and a remaining life in
//     (0, TTL], and a kept record as given; its Delete deletes only the
//     entry that was seen (never one that replaced it), after which the
//     key is free; its Stats counts the record. The Inspect subtest is
//     skipped for a store that is not an Inspector.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// Harness is one store under test.
type Harness struct {
	// Store is the store under test. It must not be nil.
	Store store.Store
	// Advance moves the store's clock forward by d. When nil the suite
	// waits in real time (keep such TTLs short: the suite uses 200ms claims
	// and retention, sleeping 300ms to get past them).
	Advance func(d time.Duration)
}

// Run runs the conformance suite as subtests of t. newHarness is called once
// per subtest, with that subtest's t (so t.Cleanup runs when the subtest
// ends), and returns a fresh store, or a shared one: the suite uses random
// keys, so stores may be shared.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.run(newSuite(t, newHarness(t)))
		})
	}
}

var cases = []struct {
	name string
	run  func(s *suite)
}{
	{"ClaimFree", testClaimFree},
	{"ClaimInFlight", testClaimInFlight},
	{"ClaimMine", testClaimMine},
	{"CompleteThenClaim", testCompleteThenClaim},
	{"RecordRoundTrip", testRecordRoundTrip},
	{"WrongToken", testWrongToken},
	{"MissingKey", testMissingKey},
	{"ReleaseThenClaim", testReleaseThenClaim},
	{"CompleteOnce", testCompleteOnce},
	{"Resent", testResent},
	{"RemainingTTL", testRemainingTTL},
	{"ClaimExpiry", testClaimExpiry},
	{"RetentionExpiry", testRetentionExpiry},
	{"ExtendLengthens", testExtendLengthens},
	{"ExtendShortens", testExtendShortens},
	{"Fencing", testFencing},
	{"ClaimRace", testClaimRace},
	{"CompleteReleaseRace", testCompleteReleaseRace},
	{"ManyKeys", testManyKeys},
	{"CancelledContext", testCancelledContext},
	{"Inspect", testInspect},
}

// suite is the state one subtest works with.
type suite struct {
	t     *testing.T
	st    store.Store
	adv   func(time.Duration)
	ctx   context.Context
	scope string
	// short is the life of claims and records that the subtest lets lapse;
	// long is the life of everything else, far beyond the subtest's length.
	short, long time.Duration
}

func newSuite(t *testing.T, h Harness) *suite {
	t.Helper()
	if h.Store == nil {
		t.Fatal("storetest: Harness.Store is nil")
	}
	s := &suite{
		t:     t,
		st:    h.Store,
		adv:   h.Advance,
		ctx:   t.Context(),
		scope: "storetest-" + randomHex(16),
		short: 10 * time.Second,
		long:  time.Hour,
	}
	if s.adv == nil {
		s.short = 200 * time.Millisecond
		s.long = time.Minute
	}
	return s
}

// fake reports whether the store's clock is under the suite's control.
func (s *suite) fake() bool { return s.adv != nil }

// key returns the store key of name in this subtest's scope.
func (s *suite) key(name string) string { return store.KeyName(s.scope, name) }

// wait lets d pass on the store's clock.
func (s *suite) wait(d time.Duration) {
	if s.adv != nil {
		s.adv(d)
		return
	}
	time.Sleep(d)
}

// past returns a wait that safely outlasts a life of d.
func past(d time.Duration) time.Duration { return d + d/2 }

func (s *suite) claim(key, token string, fp [32]byte, ttl time.Duration) store.Result {
	s.t.Helper()
	res, err := s.st.Claim(s.ctx, key, store.Claim{Token: token, Fingerprint: fp, TTL: ttl})
	if err != nil {
		s.t.Fatalf("Claim: unexpected error: %v", err)
	}
	return res
}

// claimed claims a free key and fails unless the answer is Claimed.
func (s *suite) claimed(key, token string, fp [32]byte, ttl time.Duration) {
	s.t.Helper()
	res := s.claim(key, token, fp, ttl)
	checkClaimed(s.t, res, fp)
}

// inFlight asks for key under a fresh token and fails unless the answer is
// InFlight with fingerprint fp and a remaining life in (0, maxTTL].
func (s *suite) inFlight(key string, fp [32]byte, maxTTL time.Duration) store.Result {
	s.t.Helper()
	res := s.claim(key, newToken(), randomFP(), s.long)
	checkInFlight(s.t, res, fp, maxTTL)
	return res
}

// completed asks for key under a fresh token and fails unless the answer is
// Completed with a record equal to want.
func (s *suite) completed(key string, want *store.Record) {
	s.t.Helper()
	res := s.claim(key, newToken(), randomFP(), s.long)
	checkCompleted(s.t, res, want)
}

func (s *suite) complete(key, token string, rec *store.Record, retention time.Duration) {
	s.t.Helper()
	if err := s.st.Complete(s.ctx, key, token, rec, retention); err != nil {
		s.t.Fatalf("Complete by the owner: %v", err)
	}
}

// extender returns the store as a store.Extender, and skips the subtest
// when the store does not have that capability.
func (s *suite) extender() store.Extender {
	s.t.Helper()
	ext, ok := s.st.(store.Extender)
	if !ok {
		s.t.Skipf("%T is not a store.Extender", s.st)
	}
	return ext
}

// inspector returns the store as a store.Inspector, and skips the subtest
// when the store does not have that capability.
func (s *suite) inspector() store.Inspector {
	s.t.Helper()
	in, ok := s.st.(store.Inspector)
	if !ok {
		s.t.Skipf("%T is not a store.Inspector", s.st)
	}
	return in
}

// notOwnerExtend checks that Extend answers ErrNotOwner, when the store can
// extend claims.
func (s *suite) notOwnerExtend(op, key, token string, ttl time.Duration) {
	s.t.Helper()
	if ext, ok := s.st.(store.Extender); ok {
		notOwner(s.t, op, ext.Extend(s.ctx, key, token, ttl))
	}
}

// notOwner fails unless err is ErrNotOwner.
func notOwner(t testing.TB, op string, err error) {
	t.Helper()
	if !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("%s: got error %v, want store.ErrNotOwner", op, err)
	}
}

func checkClaimed(t testing.TB, res store.Result, fp [32]byte) {
	t.Helper()
	if res.State != store.Claimed {
		t.Fatalf("Claim of a free key: state %v, want %v", res.State, store.Claimed)
	}
	if res.Fingerprint != fp {
		t.Errorf("Claimed: fingerprint %x, want the claim's %x", res.Fingerprint, fp)
	}
	if res.Record != nil {
		t.Errorf("Claimed: Record is %+v, want nil", res.Record)
	}
}

func checkInFlight(t testing.TB, res store.Result, fp [32]byte, maxTTL time.Duration) {
	t.Helper()
	if res.State != store.InFlight {
		t.Fatalf("Claim of a held key under another token: state %v, want %v", res.State, store.InFlight)
	}
	if res.Fingerprint != fp {
		t.Errorf("InFlight: fingerprint %x, want the holder's %x", res.Fingerprint, fp)
	}
	if res.TTL <= 0 || res.TTL > maxTTL {
		t.Errorf("InFlight: TTL %v, want in (0, %v]", res.TTL, maxTTL)
	}
	if res.ClaimedAt.IsZero() {
		t.Errorf("InFlight: ClaimedAt is zero, want when the holder claimed the key")
	}
	if res.Record != nil {
		t.Errorf("InFlight: Record is %+v, want nil", res.Record)
	}
}

func checkCompleted(t testing.TB, res store.Result, want *store.Record) {
	t.Helper()
	if res.State != store.Completed {
		t.Fatalf("Claim of a completed key: state %v, want %v", res.State, store.Completed)
	}
	if res.Record == nil {
		t.Fatal("Completed: Record is nil")
	}
	if res.Fingerprint != want.Fingerprint {
		t.Errorf("Completed: fingerprint %x, want the record's %x", res.Fingerprint, want.Fingerprint)
	}
	checkRecord(t, res.Record, want)
}

// checkRecord fails unless got holds what want held when it was kept.
func checkRecord(t testing.TB, got, want *store.Record) {
	t.Helper()
	if got.Status != want.Status {
		t.Errorf("record Status %d, want %d", got.Status, want.Status)
	}
	if !sameHeader(got.Header, want.Header) {
		t.Errorf("record Header differs:\n got %v\nwant %v", got.Header, want.Header)
	}
	if !bytes.Equal(got.Body, want.Body) {
		t.Errorf("record Body differs: got %d bytes %.64q, want %d bytes %.64q", len(got.Body), got.Body, len(want.Body), want.Body)
	}
	if got.BodyOmitted != want.BodyOmitted {
		t.Errorf("record BodyOmitted %v, want %v", got.BodyOmitted, want.BodyOmitted)
	}
	if got.Fingerprint != want.Fingerprint {
		t.Errorf("record Fingerprint %x, want %x", got.Fingerprint, want.Fingerprint)
	}
	if !got.CreatedAt.Equal(want.CreatedAt) {
		t.Errorf("record CreatedAt %v, want %v", got.CreatedAt, want.CreatedAt)
	}
	if !got.CompletedAt.Equal(want.CompletedAt) {
		t.Errorf("record CompletedAt %v, want %v", got.CompletedAt, want.CompletedAt)
	}
}

// sameHeader compares headers value by value, in order; nil and empty are
// the same.
func sameHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, av := range a {
		bv, ok := b[k]
		if !ok || !slices.Equal(av, bv) {
			return false
		}
	}
	return true
}

// newRecord returns a small record with the given fingerprint, whose times
// are whole milliseconds.
func newRecord(fp [32]byte, body string) *store.Record {
	created := time.Now().Truncate(time.Millisecond)
	return &store.Record{
		Status: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/orders/" + body},
		},
		Body:        []byte(`{"id":"` + body + `"}`),
		Fingerprint: fp,
		CreatedAt:   created,
		CompletedAt: created.Add(1500 * time.Millisecond),
	}
}

func newToken() string { return randomHex(16) }

// randomFP returns a random fingerprint. crypto/rand.Read never fails.
func randomFP() (fp [32]byte) {
	rand.Read(fp[:])
	return fp
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
