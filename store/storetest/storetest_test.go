package storetest_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/storetest"
)

// refStore is a plain store: one lock, one map, a clock that moves only when
// told to. With flaw set it breaks one promise on purpose.
type refStore struct {
	mu   sync.Mutex
	now  time.Time
	m    map[string]*refEntry
	flaw string
}

type refEntry struct {
	token   string
	fp      [32]byte
	ttl     time.Duration
	claimed time.Time
	expires time.Time
	rec     *store.Record
}

func newRefStore(flaw string) *refStore {
	return &refStore{now: time.Unix(1_700_000_000, 0), m: map[string]*refEntry{}, flaw: flaw}
}

func (s *refStore) advance(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = s.now.Add(d)
}

// live returns key's entry unless it is missing or lapsed.
func (s *refStore) live(key string) *refEntry {
	e := s.m[key]
	if e == nil {
		return nil
	}
	if !s.now.Before(e.expires) && (s.flaw != "claims-never-lapse" || e.rec != nil) {
		delete(s.m, key)
		return nil
	}
	return e
}

func (s *refStore) ctxErr(ctx context.Context) error {
	if s.flaw == "ignores-context" {
		return nil
	}
	return ctx.Err()
}

func (s *refStore) Claim(ctx context.Context, key string, c store.Claim) (store.Result, error) {
	if err := s.ctxErr(ctx); err != nil {
		return store.Result{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.live(key)
	switch {
	case e == nil:
		s.m[key] = &refEntry{token: c.Token, fp: c.Fingerprint, ttl: c.TTL, claimed: s.now, expires: s.now.Add(c.TTL)}
		return store.Result{State: store.Claimed, Fingerprint: c.Fingerprint}, nil
	case e.rec != nil:
		return store.Result{State: store.Completed, Fingerprint: e.fp, Record: e.rec}, nil
	case e.token == c.Token && s.flaw != "no-mine":
		return store.Result{State: store.Mine, Fingerprint: e.fp}, nil
	}
	ttl := e.expires.Sub(s.now)
	if s.flaw == "ttl-not-remaining" {
		ttl = e.ttl
	}
	res := store.Result{State: store.InFlight, Fingerprint: e.fp, TTL: ttl, ClaimedAt: e.claimed}
	if s.flaw == "no-claimed-at" {
		res.ClaimedAt = time.Time{}
	}
	return res, nil
}

// owned returns key's entry when token holds it in flight.
func (s *refStore) owned(key, token string) *refEntry {
	e := s.live(key)
	switch {
	case e == nil:
		return nil
	case e.rec != nil && s.flaw != "completed-stays-owned":
		return nil
	case e.token != token && s.flaw != "ignores-token":
		return nil
	}
	return e
}

func (s *refStore) Complete(ctx context.Context, key, token string, rec *store.Record, retention time.Duration) error {
	if err := s.ctxErr(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.live(key); e != nil && e.rec != nil && e.token == token && s.flaw != "completed-stays-owned" {
		if s.flaw == "resent-complete-refused" {
			return store.ErrNotOwner
		}
		return nil // kept already, by this token
	}
	e := s.owned(key, token)
	if e == nil {
		return store.ErrNotOwner
	}
	if s.flaw == "body-stops-at-nul" {
		kept := *rec
		if i := bytes.IndexByte(kept.Body, 0); i >= 0 {
			kept.Body = kept.Body[:i]
		}
		rec = &kept
	}
	e.rec, e.fp, e.expires = rec, rec.Fingerprint, s.now.Add(retention)
	return nil
}

func (s *refStore) Release(ctx context.Context, key, token string) error {
	if err := s.ctxErr(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live(key) == nil && s.flaw != "release-missing-refused" {
		return nil // nothing holds the key: it is free, as asked
	}
	if s.owned(key, token) == nil {
		return store.ErrNotOwner
	}
	delete(s.m, key)
	return nil
}

func (s *refStore) Extend(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := s.ctxErr(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.owned(key, token)
	if e == nil {
		return store.ErrNotOwner
	}
	if s.flaw == "extend-adds" {
		e.expires = e.expires.Add(ttl)
	} else {
		e.expires = s.now.Add(ttl)
	}
	return nil
}

func TestReferenceStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		s := newRefStore("")
		return storetest.Harness{Store: s, Advance: s.advance}
	})
}

// baseStore hides every method but those of store.Store.
type baseStore struct{ store.Store }

// A store without the optional capabilities runs every subtest but those
// of the capability it lacks.
func TestReferenceStoreWithoutExtend(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		s := newRefStore("")
		return storetest.Harness{Store: baseStore{s}, Advance: s.advance}
	})
}

func TestReferenceStoreShared(t *testing.T) {
	s := newRefStore("")
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		return storetest.Harness{Store: s, Advance: s.advance}
	})
}

// flawEnv names, in a child process that TestSuiteCatchesFlaws starts, the
// flaw of the store the child runs the suite against.
const flawEnv = "STORETEST_FLAW"

// TestSuiteCatchesFlaws checks that the suite fails a store that breaks a
// promise, in the subtest that covers that promise. Each flawed store runs
// in a child process, because a failing suite fails the test that runs it.
func TestSuiteCatchesFlaws(t *testing.T) {
	if flaw := os.Getenv(flawEnv); flaw != "" {
		storetest.Run(t, func(t *testing.T) storetest.Harness {
			s := newRefStore(flaw)
			return storetest.Harness{Store: s, Advance: s.advance}
		})
		return
	}
	for flaw, subtest := range map[string]string{
		"ignores-token":           "WrongToken",
		"completed-stays-owned":   "CompleteOnce",
		"claims-never-lapse":      "ClaimExpiry",
		"extend-adds":             "ExtendShortens",
		"no-mine":                 "ClaimMine",
		"ttl-not-remaining":       "RemainingTTL",
		"ignores-context":         "CancelledContext",
		"body-stops-at-nul":       "RecordRoundTrip",
		"resent-complete-refused": "Resent",
		"release-missing-refused": "MissingKey",
		"no-claimed-at":           "ClaimInFlight",
	} {
		t.Run(flaw, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestSuiteCatchesFlaws$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), flawEnv+"="+flaw)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a store whose flaw is %q:\n%s", flaw, out)
			}
			if want := "--- FAIL: TestSuiteCatchesFlaws/" + subtest + " "; !strings.Contains(string(out), want) {
				t.Fatalf("the suite did not fail %s for the flaw %q:\n%s", subtest, flaw, out)
			}
		})
	}
}
