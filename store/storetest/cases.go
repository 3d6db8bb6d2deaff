package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

func testClaimFree(s *suite) {
	s.claimed(s.key("free"), newToken(), randomFP(), s.long)
	// A claim on one key leaves its neighbours free.
	s.claimed(s.key("free-2"), newToken(), randomFP(), s.long)
}

func testClaimInFlight(s *suite) {
	key, tok, fp := s.key("in-flight"), newToken(), randomFP()
	s.claimed(key, tok, fp, s.long)
	s.inFlight(key, fp, s.long)
	// A repeat with the same fingerprint under its own token is in flight
	// too: only the owner's token makes Mine.
	res := s.claim(key, newToken(), fp, s.long)
	checkInFlight(s.t, res, fp, s.long)
	// Answering InFlight took nothing from the owner.
	rec := newRecord(fp, "in-flight")
	s.complete(key, tok, rec, s.long)
	s.completed(key, rec)
}

func testClaimMine(s *suite) {
	key, tok, fp := s.key("mine"), newToken(), randomFP()
	s.claimed(key, tok, fp, s.long)
	res := s.claim(key, tok, fp, s.long)
	if res.State != store.Mine {
		s.t.Fatalf("Claim retried with the owner's token: state %v, want %v", res.State, store.Mine)
	}
	if res.Fingerprint != fp {
		s.t.Errorf("Mine: fingerprint %x, want %x", res.Fingerprint, fp)
	}
	if res.Record != nil {
		s.t.Errorf("Mine: Record is %+v, want nil", res.Record)
	}
	s.inFlight(key, fp, s.long)
	rec := newRecord(fp, "mine")
	s.complete(key, tok, rec, s.long)
	// Once completed, the owner's token is no longer special.
	res = s.claim(key, tok, fp, s.long)
	checkCompleted(s.t, res, rec)
}

func testCompleteThenClaim(s *suite) {
	key, tok, fp := s.key("complete"), newToken(), randomFP()
	s.claimed(key, tok, fp, s.long)
	rec := newRecord(fp, "complete")
	s.complete(key, tok, rec, s.long)
	// Every repeat gets the same record, again and again.
	for range 3 {
		s.completed(key, rec)
	}
	// A repeat with a different fingerprint learns the record's, so the
	// middleware can tell a reused key.
	res := s.claim(key, newToken(), randomFP(), s.long)
	checkCompleted(s.t, res, rec)
}

func testRecordRoundTrip(s *suite) {
	big := make([]byte, 1<<20)
	rand.Read(big)
	big[0], big[len(big)/2], big[len(big)-1] = 0, 0, 0
	many := http.Header{}
	for i := range 200 {
		many[fmt.Sprintf("X-Header-%03d", i)] = []string{fmt.Sprint("value ", i), "second, with a comma; and \"quotes\""}
	}
	records := []struct {
		name string
		rec  store.Record
	}{
		{"NilBody", store.Record{Status: http.StatusNoContent, Header: http.Header{"X-Kind": {"no content"}}}},
		{"EmptyBody", store.Record{Status: http.StatusOK, Header: http.Header{"X-Kind": {"empty"}}, Body: []byte{}}},
		{"NilHeader", store.Record{Status: http.StatusAccepted, Body: []byte("accepted")}},
		{"EmptyHeader", store.Record{Status: http.StatusAccepted, Header: http.Header{}, Body: []byte("accepted")}},
		{"BinaryBody", store.Record{
			Status: http.StatusOK,
			Header: http.Header{"Content-Type": {"application/octet-stream"}},
			Body:   []byte("\x00\x01\x00\xff\xfe{\"a\":1}\r\n\x00\x00"),
		}},
		{"OnlyNULs", store.Record{Status: http.StatusOK, Body: make([]byte, 17)}},
		{"BodyOmitted", store.Record{
			Status:      http.StatusOK,
			Header:      http.Header{"Content-Type": {"text/csv"}},
			BodyOmitted: true,
		}},
		{"HeaderValues", store.Record{
			Status: http.StatusOK,
			Header: http.Header{"X-Empty": {""}, "X-Multi": {"b", "a", "b"}, "Link": {"</a>; rel=next", "</b>; rel=prev"}},
			Body:   []byte("ok"),
		}},
		{"ClientError", store.Record{
			Status: http.StatusUnprocessableEntity,
			Header: http.Header{"Content-Type": {"application/problem+json"}},
			Body:   []byte(`{"type":"about:blank","status":422}`),
		}},
		{"Redirect", store.Record{Status: http.StatusSeeOther, Header: http.Header{"Location": {"/orders/7"}}}},
		{"Large", store.Record{Status: http.StatusOK, Header: many, Body: big}},
	}
	for i, r := range records {
		s.t.Run(r.name, func(t *testing.T) {
			sub := *s
			sub.t, sub.ctx = t, t.Context()
			key, tok, fp := sub.key(r.name), newToken(), randomFP()
			sub.claimed(key, tok, fp, sub.long)
			rec := r.rec
			rec.Fingerprint = fp
			rec.CreatedAt = time.Now().Add(-time.Duration(i) * time.Hour).Truncate(time.Millisecond)
			rec.CompletedAt = rec.CreatedAt.Add(time.Duration(i)*time.Second + 7*time.Millisecond)
			want := rec
			want.Header = r.rec.Header.Clone()
			want.Body = append([]byte(nil), r.rec.Body...)
			sub.complete(key, tok, &rec, sub.long)
			sub.completed(key, &want)
		})
	}
}

func testWrongToken(s *suite) {
	key, tok, fp := s.key("wrong-token"), newToken(), randomFP()
	s.claimed(key, tok, fp, s.long)
	wrong := newToken()
	notOwner(s.t, "Complete with a wrong token", s.st.Complete(s.ctx, key, wrong, newRecord(randomFP(), "wrong"), s.long))
	s.notOwnerExtend("Extend with a wrong token", key, wrong, 2*s.long)
	notOwner(s.t, "Release with a wrong token", s.st.Release(s.ctx, key, wrong))
	// Nothing changed: still in flight under the owner's fingerprint, and
	// no longer-lived than the owner made it.
	s.inFlight(key, fp, s.long)

	rec := newRecord(fp, "wrong-token")
	s.complete(key, tok, rec, s.long)
	notOwner(s.t, "Complete of a completed key with a wrong token", s.st.Complete(s.ctx, key, wrong, newRecord(fp, "other"), s.long))
	notOwner(s.t, "Release of a completed key with a wrong token", s.st.Release(s.ctx, key, wrong))
	s.notOwnerExtend("Extend of a completed key with a wrong token", key, wrong, s.long)
	s.completed(key, rec)
}

func testMissingKey(s *suite) {
	key, tok := s.key("missing"), newToken()
	notOwner(s.t, "Complete of a missing key", s.st.Complete(s.ctx, key, tok, newRecord(randomFP(), "missing"), s.long))
	s.notOwnerExtend("Extend of a missing key", key, tok, s.long)
	// A Release that finds nothing has nothing left to do: the key is free,
	// which is what it asks for (a resent Release finds the key so).
	if err := s.st.Release(s.ctx, key, tok); err != nil {
		s.t.Errorf("Release of a missing key: %v, want nil", err)
	}
	// None of them left anything behind: the key is free, even for tok.
	s.claimed(key, tok, randomFP(), s.long)
}

func testReleaseThenClaim(s *suite) {
	key, tokA, fpA := s.key("release"), newToken(), randomFP()
	s.claimed(key, tokA, fpA, s.long)
	if err := s.st.Release(s.ctx, key, tokA); err != nil {
		s.t.Fatalf("Release by the owner: %v", err)
	}
	if err := s.st.Release(s.ctx, key, tokA); err != nil {
		s.t.Errorf("Release resent after it landed: %v, want nil", err)
	}
	notOwner(s.t, "Complete after Release", s.st.Complete(s.ctx, key, tokA, newRecord(fpA, "released"), s.long))
	s.notOwnerExtend("Extend after Release", key, tokA, s.long)

	tokB, fpB := newToken(), randomFP()
	s.claimed(key, tokB, fpB, s.long)
	s.inFlight(key, fpB, s.long)
	notOwner(s.t, "Complete by the releasing owner after another claim", s.st.Complete(s.ctx, key, tokA, newRecord(fpA, "late"), s.long))
	notOwner(s.t, "Release by the releasing owner after another claim", s.st.Release(s.ctx, key, tokA))
	rec := newRecord(fpB, "release")
	s.complete(key, tokB, rec, s.long)
	s.completed(key, rec)

	// A released key is free even for the token that released it.
	key2, tok2 := s.key("release-reclaim"), newToken()
	s.claimed(key2, tok2, randomFP(), s.long)
	if err := s.st.Release(s.ctx, key2, tok2); err != nil {
		s.t.Fatalf("Release by the owner: %v", err)
	}
	s.claimed(key2, tok2, randomFP(), s.long)
}

func testCompleteOnce(s *suite) {
	key, tok, fp := s.key("once"), newToken(), randomFP()
	s.claimed(key, tok, fp, s.long)
	first := newRecord(fp, "first")
	s.complete(key, tok, first, s.long)
	// A second Complete by the owner finds its own record: it counts as
	// kept (it is what a resent Complete whose reply was lost sees), and
	// changes nothing.
	second := newRecord(fp, "second")
	second.Status = http.StatusOK
	if err := s.st.Complete(s.ctx, key, tok, second, s.long); err != nil {
		s.t.Errorf("Complete by the owner of a key it kept: %v, want nil", err)
	}
	notOwner(s.t, "Release of a completed key by its owner", s.st.Release(s.ctx, key, tok))
	s.notOwnerExtend("Extend of a completed key by its owner", key, tok, s.long)
	s.completed(key, first)

	// Neither a second Complete nor an Extend lengthens a record's
	// retention.
	key2, tok2, fp2 := s.key("once-retention"), newToken(), randomFP()
	s.claimed(key2, tok2, fp2, s.long)
	short := newRecord(fp2, "short")
	s.complete(key2, tok2, short, s.short)
	if err := s.st.Complete(s.ctx, key2, tok2, newRecord(fp2, "long"), s.long); err != nil {
		s.t.Errorf("Complete by the owner of a key it kept: %v, want nil", err)
	}
	s.notOwnerExtend("Extend of a completed key by its owner", key2, tok2, s.long)
	s.completed(key2, short)
	s.wait(past(s.short))
	s.claimed(key2, newToken(), randomFP(), s.long)
}

// testResent sends each finishing call twice, as a client library does when
// the first reply is lost: the second finds the first's write and answers as
// it did.
func testResent(s *suite) {
	key, tok, fp := s.key("resent-complete"), newToken(), randomFP()
	s.claimed(key, tok, fp, s.long)
	rec := newRecord(fp, "resent")
	s.complete(key, tok, rec, s.long)
	if err := s.st.Complete(s.ctx, key, tok, rec, s.long); err != nil {
		s.t.Errorf("resent Complete: %v, want nil", err)
	}
	s.completed(key, rec)
	// Another token is still refused.
	notOwner(s.t, "Complete of a kept key by another token", s.st.Complete(s.ctx, key, newToken(), rec, s.long))

	key, tok = s.key("resent-release"), newToken()
	s.claimed(key, tok, fp, s.long)
	for i := range 2 {
		if err := s.st.Release(s.ctx, key, tok); err != nil {
			s.t.Errorf("Release %d: %v, want nil", i+1, err)
		}
	}
	s.claimed(key, newToken(), fp, s.long)
}

func testRemainingTTL(s *suite) {
	key, fp := s.key("remaining"), randomFP()
	s.claimed(key, newToken(), fp, s.long)
	d := s.short / 2
	s.wait(d)
	// Stores that count in milliseconds may round up by one.
	s.inFlight(key, fp, s.long-d+time.Millisecond)
}

func testClaimExpiry(s *suite) {
	key, tokA, fpA := s.key("claim-expiry"), newToken(), randomFP()
	s.claimed(key, tokA, fpA, s.short)
	if s.fake() {
		s.wait(s.short / 2)
		s.inFlight(key, fpA, s.short/2+time.Millisecond)
	}
	s.wait(past(s.short))
	// A lapsed claim can be neither revived nor completed by its owner.
	s.notOwnerExtend("Extend by the owner of a lapsed claim", key, tokA, s.long)
	notOwner(s.t, "Complete by the owner of a lapsed claim", s.st.Complete(s.ctx, key, tokA, newRecord(fpA, "lapsed"), s.long))
	s.claimed(key, newToken(), randomFP(), s.long)
	notOwner(s.t, "Release by the owner of a lapsed claim", s.st.Release(s.ctx, key, tokA))
}

func testRetentionExpiry(s *suite) {
	key, tok, fp := s.key("retention"), newToken(), randomFP()
	s.claimed(key, tok, fp, s.long)
	rec := newRecord(fp, "retention")
	s.complete(key, tok, rec, s.short)
	if s.fake() {
		s.wait(s.short / 2)
		s.completed(key, rec)
	}
	s.wait(past(s.short))
	s.claimed(key, newToken(), randomFP(), s.long)
}

func testExtendLengthens(s *suite) {
	ext := s.extender()
	key, tok, fp := s.key("extend"), newToken(), randomFP()
	s.claimed(key, tok, fp, s.short)
	life := 5 * s.short
	if err := ext.Extend(s.ctx, key, tok, life); err != nil {
		s.t.Fatalf("Extend by the owner: %v", err)
	}
	s.wait(past(s.short))
	// Past the first TTL and still held.
	s.inFlight(key, fp, life-past(s.short)+time.Millisecond)
	s.wait(life)
	// Past the extended life: free again, and the owner lost it.
	s.claimed(key, newToken(), randomFP(), s.long)
	notOwner(s.t, "Complete by the owner of a lapsed extended claim", s.st.Complete(s.ctx, key, tok, newRecord(fp, "late"), s.long))
}

func testExtendShortens(s *suite) {
	ext := s.extender()
	key, tok, fp := s.key("extend-shorter"), newToken(), randomFP()
	s.claimed(key, tok, fp, s.long)
	if err := ext.Extend(s.ctx, key, tok, s.short); err != nil {
		s.t.Fatalf("Extend by the owner: %v", err)
	}
	// Extend sets the remaining life; it does not add to it.
	s.inFlight(key, fp, s.short)
	s.wait(past(s.short))
	s.claimed(key, newToken(), randomFP(), s.long)
}

func testFencing(s *suite) {
	key := s.key("fencing")
	tokA, fpA := newToken(), randomFP()
	s.claimed(key, tokA, fpA, s.short)
	s.wait(past(s.short))
	tokB, fpB := newToken(), randomFP()
	s.claimed(key, tokB, fpB, s.long)

	// A's claim lapsed and B holds the key: A can no longer touch it.
	notOwner(s.t, "Complete by a fenced-off owner", s.st.Complete(s.ctx, key, tokA, newRecord(fpA, "a"), s.long))
	s.notOwnerExtend("Extend by a fenced-off owner", key, tokA, s.long)
	notOwner(s.t, "Release by a fenced-off owner", s.st.Release(s.ctx, key, tokA))
	s.inFlight(key, fpB, s.long)

	recB := newRecord(fpB, "b")
	s.complete(key, tokB, recB, s.long)
	notOwner(s.t, "Complete by a fenced-off owner after the new owner completed", s.st.Complete(s.ctx, key, tokA, newRecord(fpA, "a"), s.long))
	s.completed(key, recB)
}

func testClaimRace(s *suite) {
	const racers, rounds = 64, 4
	for round := range rounds {
		key := s.key(fmt.Sprint("race-", round))
		tokens := make([]string, racers)
		fps := make([][32]byte, racers)
		for i := range racers {
			tokens[i], fps[i] = newToken(), randomFP()
		}
		results := make([]store.Result, racers)
		errs := make([]error, racers)
		race(racers, func(i int) {
			results[i], errs[i] = s.st.Claim(s.ctx, key, store.Claim{Token: tokens[i], Fingerprint: fps[i], TTL: s.long})
		})
		winner := -1
		for i := range racers {
			if errs[i] != nil {
				s.t.Fatalf("round %d: racing Claim: %v", round, errs[i])
			}
			switch results[i].State {
			case store.Claimed:
				if winner >= 0 {
					s.t.Fatalf("round %d: racers %d and %d both got Claimed", round, winner, i)
				}
				winner = i
			case store.InFlight:
			default:
				s.t.Fatalf("round %d: racing Claim: state %v, want %v or %v", round, results[i].State, store.Claimed, store.InFlight)
			}
		}
		if winner < 0 {
			s.t.Fatalf("round %d: no racer got Claimed", round)
		}
		checkClaimed(s.t, results[winner], fps[winner])
		for i := range racers {
			if i != winner {
				checkInFlight(s.t, results[i], fps[winner], s.long)
			}
		}

		// Repeats race too once the winner has completed: all replay.
		rec := newRecord(fps[winner], fmt.Sprint("race-", round))
		s.complete(key, tokens[winner], rec, s.long)
		race(racers, func(i int) {
			results[i], errs[i] = s.st.Claim(s.ctx, key, store.Claim{Token: tokens[i], Fingerprint: fps[winner], TTL: s.long})
		})
		for i := range racers {
			if errs[i] != nil {
				s.t.Fatalf("round %d: racing Claim of a completed key: %v", round, errs[i])
			}
			checkCompleted(s.t, results[i], rec)
		}
	}
}

func testCompleteReleaseRace(s *suite) {
	const racers, rounds = 32, 8
	for round := range rounds {
		key, tok, fp := s.key(fmt.Sprint("finish-race-", round)), newToken(), randomFP()
		s.claimed(key, tok, fp, s.long)
		recs := make([]*store.Record, racers)
		for i := range racers {
			recs[i] = newRecord(fp, fmt.Sprint("finish-", round, "-", i))
		}
		errs := make([]error, racers)
		race(racers, func(i int) {
			if i%2 == 0 {
				errs[i] = s.st.Complete(s.ctx, key, tok, recs[i], s.long)
			} else {
				errs[i] = s.st.Release(s.ctx, key, tok)
			}
		})
		// Exactly one kind of call took effect: the Completes that
		// answered nil (the first kept its record, the rest found it), or
		// the Releases (the first freed the key, the rest found it free).
		var completes, releases []int
		for i, err := range errs {
			switch {
			case err == nil && i%2 == 0:
				completes = append(completes, i)
			case err == nil:
				releases = append(releases, i)
			case !errors.Is(err, store.ErrNotOwner):
				s.t.Fatalf("round %d: racer %d: got error %v, want nil or store.ErrNotOwner", round, i, err)
			}
		}
		switch {
		case len(completes) > 0 && len(releases) > 0:
			s.t.Fatalf("round %d: Completes %v and Releases %v all succeeded", round, completes, releases)
		case len(completes) > 0:
			res := s.claim(key, newToken(), randomFP(), s.long)
			if res.State != store.Completed || res.Record == nil {
				s.t.Fatalf("round %d: after a Complete won: state %v, want %v", round, res.State, store.Completed)
			}
			found := false
			for _, i := range completes {
				if bytes.Equal(res.Record.Body, recs[i].Body) {
					checkRecord(s.t, res.Record, recs[i])
					found = true
				}
			}
			if !found {
				s.t.Fatalf("round %d: kept body %q is none of the successful Completes' %v", round, res.Record.Body, completes)
			}
		case len(releases) > 0:
			s.claimed(key, newToken(), randomFP(), s.long)
		default:
			s.t.Fatalf("round %d: no racer finished the claim", round)
		}
	}
}

func testManyKeys(s *suite) {
	const workers, keys = 8, 32
	type slot struct {
		key, tok string
		fp       [32]byte
		rec      *store.Record
		res      store.Result
		err      error
	}
	var slots [workers][keys]slot
	for w := range workers {
		for k := range keys {
			fp := randomFP()
			slots[w][k] = slot{
				key: s.key(fmt.Sprint("many-", w, "-", k)),
				tok: newToken(),
				fp:  fp,
				rec: newRecord(fp, fmt.Sprint("many-", w, "-", k)),
			}
		}
	}
	// each runs f for every slot, worker w taking the slots of worker
	// (w+shift)%workers, and checks the answers once all are in.
	each := func(shift int, f func(sl *slot), check func(sl *slot)) {
		race(workers, func(w int) {
			for k := range keys {
				f(&slots[(w+shift)%workers][k])
			}
		})
		for w := range workers {
			for k := range keys {
				sl := &slots[w][k]
				if sl.err != nil {
					s.t.Fatalf("%s: %v", sl.rec.Body, sl.err)
				}
				check(sl)
			}
		}
	}
	claim := func(sl *slot) {
		sl.res, sl.err = s.st.Claim(s.ctx, sl.key, store.Claim{Token: sl.tok, Fingerprint: sl.fp, TTL: s.long})
	}
	other := func(sl *slot) {
		sl.res, sl.err = s.st.Claim(s.ctx, sl.key, store.Claim{Token: newToken(), Fingerprint: sl.fp, TTL: s.long})
	}
	each(0, claim, func(sl *slot) { checkClaimed(s.t, sl.res, sl.fp) })
	each(1, other, func(sl *slot) { checkInFlight(s.t, sl.res, sl.fp, s.long) })
	each(2, func(sl *slot) { sl.err = s.st.Complete(s.ctx, sl.key, sl.tok, sl.rec, s.long) }, func(*slot) {})
	each(3, other, func(sl *slot) { checkCompleted(s.t, sl.res, sl.rec) })
}

func testCancelledContext(s *suite) {
	cctx, cancel := context.WithCancel(s.ctx)
	cancel()

	key, tok, fp := s.key("cancelled-claim"), newToken(), randomFP()
	if _, err := s.st.Claim(cctx, key, store.Claim{Token: tok, Fingerprint: fp, TTL: s.long}); err == nil {
		s.t.Error("Claim with a cancelled context: no error")
	}
	s.claimed(key, newToken(), randomFP(), s.long)

	key, tok, fp = s.key("cancelled-complete"), newToken(), randomFP()
	s.claimed(key, tok, fp, s.long)
	if err := s.st.Complete(cctx, key, tok, newRecord(fp, "cancelled"), s.long); err == nil {
		s.t.Error("Complete with a cancelled context: no error")
	}
	s.inFlight(key, fp, s.long)
	rec := newRecord(fp, "live")
	s.complete(key, tok, rec, s.long)
	s.completed(key, rec)

	key, tok, fp = s.key("cancelled-release"), newToken(), randomFP()
	s.claimed(key, tok, fp, s.long)
	if err := s.st.Release(cctx, key, tok); err == nil {
		s.t.Error("Release with a cancelled context: no error")
	}
	s.inFlight(key, fp, s.long)
	if err := s.st.Release(s.ctx, key, tok); err != nil {
		s.t.Fatalf("Release by the owner: %v", err)
	}

	if ext, ok := s.st.(store.Extender); ok {
		key, tok, fp = s.key("cancelled-extend"), newToken(), randomFP()
		s.claimed(key, tok, fp, s.short)
		if err := ext.Extend(cctx, key, tok, s.long); err == nil {
			s.t.Error("Extend with a cancelled context: no error")
		}
		s.wait(past(s.short))
		s.claimed(key, newToken(), randomFP(), s.long)
	}
}

// race runs f(0) to f(n-1) on n goroutines released together, and waits for
// them all.
func race(n int, f func(i int)) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			f(i)
		})
	}
	close(start)
	wg.Wait()
}

func testInspect(s *suite) {
	in := s.inspector()
	key, tok, fp := s.key("inspect"), newToken(), randomFP()
	inspect := func(what string) (store.Entry, bool) {
		s.t.Helper()
		e, found, err := in.Inspect(s.ctx, key)
		if err != nil {
			s.t.Fatalf("Inspect of %s: %v", what, err)
		}
		return e, found
	}
	if _, found := inspect("a free key"); found {
		s.t.Fatal("Inspect found a key nothing claimed")
	}

	s.claimed(key, tok, fp, s.long)
	claim, found := inspect("a claim")
	if !found || claim.State != store.InFlight || claim.Fingerprint != fp || claim.Record != nil ||
		claim.CreatedAt.IsZero() || claim.TTL <= 0 || claim.TTL > s.long || claim.Expired || claim.NoExpiry {
		s.t.Fatalf("Inspect of a claim = %+v, %v; want InFlight with its fingerprint and a life in (0, %v]", claim, found, s.long)
	}

	// The claim is completed: deleting the claim that was seen deletes
	// nothing.
	rec := newRecord(fp, "inspected")
	s.complete(key, tok, rec, s.long)
	if deleted, err := in.Delete(s.ctx, key, claim); deleted || err != nil {
		s.t.Fatalf("Delete of a claim completed since it was seen = %v, %v; want false", deleted, err)
	}
	kept, found := inspect("a record")
	if !found || kept.State != store.Completed || kept.Fingerprint != fp || kept.Record == nil {
		s.t.Fatalf("Inspect of a record = %+v, %v; want Completed", kept, found)
	}
	checkRecord(s.t, kept.Record, rec)

	st, err := in.Stats(s.ctx)
	if err != nil || st.Records < 1 {
		s.t.Fatalf("Stats = %+v, %v; want at least the one record", st, err)
	}

	if deleted, err := in.Delete(s.ctx, key, kept); !deleted || err != nil {
		s.t.Fatalf("Delete of the record seen = %v, %v; want true", deleted, err)
	}
	if _, found := inspect("a deleted key"); found {
		s.t.Fatal("the deleted record is still there")
	}
	if deleted, err := in.Delete(s.ctx, key, kept); deleted || err != nil {
		s.t.Fatalf("a second Delete = %v, %v; want false", deleted, err)
	}
	s.claimed(key, newToken(), randomFP(), s.long)
}
