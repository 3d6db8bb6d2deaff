package middleware_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/internal/eventname"
	"github.com/idemkey/idemkey/middleware"
	"github.com/idemkey/idemkey/scope"
	"github.com/idemkey/idemkey/store"
)

func TestSlogObserverLogsDigestNeverKey(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f := newFixture(t, middleware.WithObserver(middleware.SlogObserver(log)))
	mw := f.mw.Required()(&counter{})
	const key = "very-secret-key-4711"
	serve(mw, post(key, `{"card":"4242"}`))
	serve(mw, post(key, `{"card":"4242"}`))
	serve(mw, post(key, `{"card":"0000"}`))
	out := buf.String()
	if strings.Contains(out, key) || strings.Contains(out, "4242") {
		t.Fatalf("log holds the key or body:\n%s", out)
	}
	digest := store.DigestOf(store.KeyName(scope.Anonymous, key))
	for _, ev := range []string{"first_attempt", "kept", "replay", "key_reused"} {
		if !strings.Contains(out, `"event":"`+ev+`"`) {
			t.Errorf("no %s event in:\n%s", ev, out)
		}
	}
	if strings.Count(out, digest) != 4 {
		t.Fatalf("digest %s logged %d times, want 4:\n%s", digest, strings.Count(out, digest), out)
	}
}

func TestEventsOfAFirstRunAndItsRepeats(t *testing.T) {
	f := newFixture(t)
	mw := f.mw.Required()(&counter{})
	serve(mw, post("k", `{}`))
	serve(mw, post("k", `{}`))
	got := f.events.kinds()
	want := []middleware.EventKind{middleware.EventFirstAttempt, middleware.EventKept, middleware.EventReplay}
	if len(got) != len(want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("events %v, want %v", got, want)
		}
	}
	f.events.mu.Lock()
	defer f.events.mu.Unlock()
	for _, e := range f.events.events {
		if len(e.KeyDigest) != 64 {
			t.Errorf("%v: digest %q", e.Kind, e.KeyDigest)
		}
	}
	if e := f.events.events[1]; e.Status != http.StatusCreated {
		t.Errorf("kept event status %d", e.Status)
	}
	if middleware.EventStoreError.String() != "store_error" || middleware.EventKind(200).String() != "invalid" {
		t.Error("event names")
	}
}

func TestEventsAfterAClaimCarryItsLatency(t *testing.T) {
	f := newFixture(t)
	h := newBlocker()
	mw := f.mw.Required()(h)
	go serve(mw, post("k", `{}`))
	<-h.started
	serve(mw, post("k", `{}`))          // in flight
	serve(mw, post("k", `{"other":1}`)) // reused
	close(h.release)
	for f.store.completes.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	serve(mw, post("k", `{}`)) // replay
	f.events.mu.Lock()
	defer f.events.mu.Unlock()
	seen := map[middleware.EventKind]bool{}
	for _, e := range f.events.events {
		switch e.Kind {
		case middleware.EventFirstAttempt, middleware.EventInFlight, middleware.EventKeyReused, middleware.EventReplay, middleware.EventKept:
			if e.StoreLatency <= 0 {
				t.Errorf("%v without store latency", e.Kind)
			}
			seen[e.Kind] = true
		}
	}
	if len(seen) != 5 {
		t.Fatalf("events seen %v", seen)
	}
}

// TestSlogObserverWarnsOfAMissingScope: a scope function that names no
// scope is the service's misconfiguration, logged at Warn like a store
// error, not at Debug.
func TestSlogObserverWarnsOfAMissingScope(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	f := newFixture(t, middleware.WithObserver(middleware.SlogObserver(log)),
		middleware.WithScope(func(*http.Request) string { return "" }))
	serve(f.mw.Required()(&counter{}), post("k", `{}`))
	if !strings.Contains(buf.String(), `"event":"scope_missing"`) {
		t.Fatalf("no scope_missing at Warn in:\n%s", buf.String())
	}
}

// TestEventNames: every decision has the name internal/eventname gives it,
// the one idemgrpc gives the same decision on gRPC.
func TestEventNames(t *testing.T) {
	for k, want := range map[middleware.EventKind]string{
		middleware.EventFirstAttempt:    eventname.FirstAttempt,
		middleware.EventReplay:          eventname.Replay,
		middleware.EventInFlight:        eventname.InFlight,
		middleware.EventKeyReused:       eventname.KeyReused,
		middleware.EventKeyMissing:      eventname.KeyMissing,
		middleware.EventKeyInvalid:      eventname.KeyInvalid,
		middleware.EventRequestTooLarge: eventname.RequestTooLarge,
		middleware.EventKept:            eventname.Kept,
		middleware.EventReleased:        eventname.Released,
		middleware.EventOwnershipLost:   eventname.OwnershipLost,
		middleware.EventStoreError:      eventname.StoreError,
		middleware.EventBodyUnreadable:  eventname.BodyUnreadable,
		middleware.EventStoreFull:       eventname.StoreFull,
		middleware.EventScopeMissing:    eventname.ScopeMissing,
		middleware.EventRouteInvalid:    eventname.RouteInvalid,
		middleware.EventKind(0):         eventname.Invalid,
	} {
		if k.String() != want {
			t.Errorf("kind %d: %q, want %q", k, k.String(), want)
		}
	}
}
