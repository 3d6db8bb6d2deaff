package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkey/idemkey/internal/benchbody"
)

// The request bodies. payload is what a key is first sent with: the
// benchmarks' 1 KiB of JSON, members out of order. reordered is the same
// document with every object's members in order: its canonical fingerprint
// is payload's, so a repeat with it must be a replay. changed differs in
// one number, so a repeat with it must be refused with 422.
var (
	payload   = benchbody.JSON(false)
	reordered = benchbody.JSON(true)
	changed   = bytes.Replace(benchbody.JSON(false), []byte(`"amount":1000`), []byte(`"amount":1001`), 1)
)

// bodyKind names the body a request carries.
type bodyKind int

const (
	bodyFirst     bodyKind = iota // payload
	bodyReordered                 // reordered: a replay is due
	bodyChanged                   // changed: a 422 is due
)

func (k bodyKind) bytes() []byte {
	switch k {
	case bodyReordered:
		return reordered
	case bodyChanged:
		return changed
	}
	return payload
}

// claimLife bounds how long a 409 may go on for one key: the middleware's
// default deadline (30 s) plus its claim margin (5 s), twice over.
const claimLife = 70 * time.Second

// failures counts the checks that failed and keeps the first notes of
// each kind: double runs, wrong replays, and every other failed check.
type failures struct {
	failed       atomic.Int64 // answers that broke a rule other than the two below
	doubleRuns   atomic.Int64 // runs of a key past its first, inside its retention
	wrongReplays atomic.Int64 // repeats not answered with the first answer

	mu      sync.Mutex
	notes   [3][]string // double runs, wrong replays, others
	dropped int
}

// notesPerKind is how many notes of each kind a soak keeps.
const notesPerKind = 5

// add counts a failed check in counter (f.failed, f.doubleRuns or
// f.wrongReplays) and notes it.
func (f *failures) add(counter *atomic.Int64, msg string) {
	counter.Add(1)
	kind := 2
	switch counter {
	case &f.doubleRuns:
		kind = 0
	case &f.wrongReplays:
		kind = 1
	}
	f.note(kind, msg)
}

func (f *failures) note(kind int, msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.notes[kind]) < notesPerKind {
		f.notes[kind] = append(f.notes[kind], msg)
	} else {
		f.dropped++
	}
}

// all returns the notes, double runs first, and how many more there were.
func (f *failures) all() ([]string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var all []string
	for _, n := range f.notes {
		all = append(all, n...)
	}
	return all, f.dropped
}

// tally counts what the soak sent and got.
type tally struct {
	requests  atomic.Int64 // every request sent, retries after a 409 included
	firstRuns atomic.Int64 // answers from a run of the handler
	replays   atomic.Int64 // answers marked Idempotent-Replayed
	conflicts atomic.Int64 // 409 answers
	reused    atomic.Int64 // 422 answers
	refused   atomic.Int64 // 503 answers
	pairs     atomic.Int64 // fresh keys sent twice at the same moment
	repeats   atomic.Int64 // requests that reuse a key sent before, pairs' second halves included
	changed   atomic.Int64 // repeats with a changed body
	netErrors atomic.Int64 // requests without an answer (also counted as failed)
	expired   atomic.Int64 // runs of a key past its first, after its retention: allowed
	oldest    atomic.Int64 // the age of the oldest key repeated, in nanoseconds
}

// mix is the chance, per step of a worker, of each kind of step. A pair
// step sends two requests, every other step one.
type mix struct {
	changed, pair, repeat float64
}

// newMix turns shares of requests into chances per step: reuse of the
// requests repeat a key sent before (pairs' second halves and changed
// bodies included), pairs of them are the second half of a pair, and
// changed of them carry a changed body. With p the pair steps' chance, a
// step sends 1+p requests, of which p are pairs' second halves.
func newMix(reuse, pairs, changedShare float64) (mix, error) {
	if reuse < 0 || reuse > 1 || pairs < 0 || pairs >= 1 || changedShare < 0 || changedShare > 1 {
		return mix{}, fmt.Errorf("-reuse, -pairs and -changed must be from 0 to 1")
	}
	p := pairs / (1 - pairs)
	m := mix{pair: p, changed: changedShare * (1 + p)}
	m.repeat = reuse*(1+p) - m.changed - m.pair
	if m.repeat < 0 {
		return mix{}, fmt.Errorf("-reuse %.3f is less than -pairs %.3f plus -changed %.3f", reuse, pairs, changedShare)
	}
	if m.changed+m.pair+m.repeat > 1 {
		return mix{}, fmt.Errorf("-reuse %.3f leaves no fresh keys beside -pairs %.3f", reuse, pairs)
	}
	return m, nil
}

// entry is a key a worker has sent, which it may send again.
type entry struct {
	key   string
	w     int
	seq   int64
	sent  time.Time
	first *answer // the first run's answer, once seen
}

// driver runs the workers against one target.
type driver struct {
	addr   string
	counts *runCounts
	mix    mix
	// maxAge is how long after its first send a key may be sent again:
	// well inside the retention, so that its record must still be there.
	maxAge time.Duration
	// retention is the middleware's; epoch is the app's.
	retention time.Duration
	epoch     time.Time
	ring      int // keys each worker remembers for repeats
	// pairWork is how long the handler takes for a pair's key.
	pairWork time.Duration
	stop     atomic.Bool
	t        tally
	f        *failures
}

// worker is one client goroutine with two keep-alive connections: the
// second carries the other half of a pair.
type worker struct {
	d      *driver
	id     int
	c1, c2 *conn
	rng    *rand.Rand
	seq    int64
	// recent holds the worker's last keys, older one key in
	// olderEvery, so that it spans a longer time: repeats come from
	// both, half and half, aged from a moment to maxAge.
	recent, older ring
}

func (d *driver) newWorker(id int) (*worker, error) {
	c1, err := dial(d.addr)
	if err != nil {
		return nil, err
	}
	c2, err := dial(d.addr)
	if err != nil {
		c1.close()
		return nil, err
	}
	return &worker{d: d, id: id, c1: c1, c2: c2,
		rng:    rand.New(rand.NewPCG(uint64(id), uint64(time.Now().UnixNano()))),
		recent: ring{keys: make([]*entry, 0, d.ring)},
		older:  ring{keys: make([]*entry, 0, d.ring)}}, nil
}

func (w *worker) close() {
	w.c1.close()
	w.c2.close()
}

func (w *worker) run() {
	defer w.close()
	m := w.d.mix
	for !w.d.stop.Load() {
		u := w.rng.Float64()
		switch {
		case u < m.changed:
			if e := w.pick(true); e != nil {
				w.repeat(e, bodyChanged)
				continue
			}
		case u < m.changed+m.pair:
			if !w.pair() {
				return
			}
			continue
		case u < m.changed+m.pair+m.repeat:
			if e := w.pick(false); e != nil {
				kind := bodyFirst
				if w.rng.IntN(2) == 0 {
					kind = bodyReordered
				}
				w.repeat(e, kind)
				continue
			}
		}
		if !w.fresh() {
			return
		}
	}
}

// newEntry makes the worker's next key.
func (w *worker) newEntry() (*entry, bool) {
	seq := w.seq
	w.seq++
	if err := w.d.counts.ensure(w.id, seq); err != nil {
		w.d.f.add(&w.d.f.failed, err.Error())
		return nil, false
	}
	return &entry{key: keyName(w.id, seq), w: w.id, seq: seq, sent: time.Now()}, true
}

// olderEvery is how many of a worker's keys go by for one that its older
// ring keeps.
const olderEvery = 16

// ring holds the last keys put in it, up to its capacity.
type ring struct {
	keys []*entry
	next int
}

func (r *ring) put(e *entry) {
	if len(r.keys) < cap(r.keys) {
		r.keys = append(r.keys, e)
		return
	}
	r.keys[r.next] = e
	r.next = (r.next + 1) % len(r.keys)
}

func (w *worker) remember(e *entry) {
	w.recent.put(e)
	if e.seq%olderEvery == 0 {
		w.older.put(e)
	}
}

// pick returns a key sent recently enough to send again (one with a first
// answer, when withFirst), or nil.
func (w *worker) pick(withFirst bool) *entry {
	rings := [2]*ring{&w.recent, &w.older}
	if w.rng.IntN(2) == 0 {
		rings[0], rings[1] = rings[1], rings[0]
	}
	for _, r := range rings {
		if len(r.keys) == 0 {
			continue
		}
		for range 4 {
			e := r.keys[w.rng.IntN(len(r.keys))]
			if time.Since(e.sent) < w.d.maxAge && (!withFirst || e.first != nil) {
				return e
			}
		}
	}
	return nil
}

// send posts body with e's key on c (with work for the handler, see app)
// and follows 409s with retries until the answer is something else. It
// reports false when no answer came.
func (w *worker) send(c *conn, e *entry, body []byte, work time.Duration) (answer, bool) {
	deadline := time.Now().Add(claimLife)
	backoff := time.Millisecond
	for {
		w.d.t.requests.Add(1)
		a, err := c.do(e.key, body, work)
		if err != nil {
			w.d.t.netErrors.Add(1)
			w.d.f.add(&w.d.f.failed, fmt.Sprintf("key %s: no answer: %v", e.key, err))
			c.redial()
			return a, false
		}
		if a.status != 409 {
			return a, true
		}
		w.d.t.conflicts.Add(1)
		if err := checkProblem(a, "conflict"); err != nil {
			w.d.f.add(&w.d.f.failed, fmt.Sprintf("key %s: %v", e.key, err))
		}
		if time.Now().After(deadline) {
			w.d.f.add(&w.d.f.failed, fmt.Sprintf("key %s: still 409 after %v", e.key, claimLife))
			return a, true
		}
		// Retry sooner than Retry-After (whole seconds, at least 1): the
		// first run takes milliseconds, and the soak wants pressure.
		time.Sleep(backoff)
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// fresh sends a new key once.
func (w *worker) fresh() bool {
	e, ok := w.newEntry()
	if !ok {
		return false
	}
	a, ok := w.send(w.c1, e, payload, 0)
	if ok {
		w.judge(e, a, bodyFirst, w.d.counts.get(e.w, e.seq))
	}
	w.remember(e)
	return true
}

// repeat sends a key that was sent before, with a body of kind.
func (w *worker) repeat(e *entry, kind bodyKind) {
	w.d.t.repeats.Add(1)
	age := int64(time.Since(e.sent))
	for old := w.d.t.oldest.Load(); age > old && !w.d.t.oldest.CompareAndSwap(old, age); old = w.d.t.oldest.Load() {
	}
	if kind == bodyChanged {
		w.d.t.changed.Add(1)
	}
	before := w.d.counts.get(e.w, e.seq)
	a, ok := w.send(w.c1, e, kind.bytes(), 0)
	if ok {
		w.judge(e, a, kind, w.d.counts.get(e.w, e.seq)-before)
	}
}

// pair sends a new key twice at the same moment, on the worker's two
// connections, so that one of them may find the other in flight.
func (w *worker) pair() bool {
	e, ok := w.newEntry()
	if !ok {
		return false
	}
	w.d.t.pairs.Add(1)
	w.d.t.repeats.Add(1)
	var (
		wg  sync.WaitGroup
		a2  answer
		ok2 bool
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		a2, ok2 = w.send(w.c2, e, payload, w.d.pairWork)
	}()
	a1, ok1 := w.send(w.c1, e, payload, w.d.pairWork)
	wg.Wait()
	runs := w.d.counts.get(e.w, e.seq)
	// Judge the answer from a run first, so that the other is held
	// against it.
	answers := []answer{}
	for _, x := range []struct {
		a  answer
		ok bool
	}{{a1, ok1}, {a2, ok2}} {
		if !x.ok {
			continue
		}
		if x.a.status == 201 && !x.a.replayed {
			answers = append([]answer{x.a}, answers...)
		} else {
			answers = append(answers, x.a)
		}
	}
	fromRuns := 0
	for _, a := range answers {
		if a.status == 201 && !a.replayed {
			fromRuns++
		}
	}
	if ok1 && ok2 && runs != fromRuns {
		w.d.f.add(&w.d.f.failed, fmt.Sprintf("key %s: the handler ran %d times, and %d answers came from runs", e.key, runs, fromRuns))
	}
	for _, a := range answers {
		// Each answer's own share of the runs: one for an answer from a
		// run, none for the others (the count above checked the total).
		ran := 0
		if a.status == 201 && !a.replayed {
			ran = 1
		}
		w.judge(e, a, bodyFirst, ran)
	}
	w.remember(e)
	return true
}

// judge checks one answer to key e sent with a body of kind. ran is how
// many times the handler ran for the key while the request was out.
func (w *worker) judge(e *entry, a answer, kind bodyKind, ran int) {
	d := w.d
	isChanged := kind == bodyChanged
	switch {
	case a.status == 201 && !a.replayed:
		d.t.firstRuns.Add(1)
		run, at, err := checkRun(a, e.key, len(kind.bytes()))
		if err != nil {
			d.f.add(&d.f.failed, err.Error())
		}
		if run > 1 {
			// The key's record was kept after its first request was sent,
			// so it lives at least until then plus the retention: a run
			// that began before that is a double run. A run after it is
			// allowed; it takes a stall longer than the retention less
			// maxAge between the repeat's pick and its claim.
			if at < e.sent.Sub(d.epoch)+d.retention {
				d.f.add(&d.f.doubleRuns, fmt.Sprintf("double run: key %s ran %d times, this run %v after the key was first sent: %q", e.key, run, at-e.sent.Sub(d.epoch), a.body))
			} else {
				d.t.expired.Add(1)
			}
		}
		if ran != 1 {
			d.f.add(&d.f.failed, fmt.Sprintf("key %s: an answer from a run, and the handler ran %d times meanwhile", e.key, ran))
		}
		if e.first == nil {
			e.first = &a
		}
	case a.status == 201:
		d.t.replays.Add(1)
		if ran != 0 {
			d.f.add(&d.f.failed, fmt.Sprintf("key %s: a replay, and the handler ran %d times meanwhile", e.key, ran))
		}
		switch {
		case isChanged:
			d.f.add(&d.f.wrongReplays, fmt.Sprintf("key %s: a changed body was answered with a replay, not 422", e.key))
		case e.first == nil:
			// The first request got no answer from a run (a 503, or no
			// answer at all): the replay must be of a run the handler
			// made once, and becomes the answer to hold others against.
			if run, _, err := checkRun(a, e.key, len(payload)); err != nil || run != 1 || d.counts.get(e.w, e.seq) != 1 {
				d.f.add(&d.f.wrongReplays, fmt.Sprintf("key %s: a replay of a run no client saw: %.200q", e.key, a.body))
			}
			e.first = &a
		case a.headers != e.first.headers || a.body != e.first.body:
			d.f.add(&d.f.wrongReplays, fmt.Sprintf("key %s: replay %q %q differs from the first answer %q %q", e.key, a.headers, a.body, e.first.headers, e.first.body))
		}
	case a.status == 422:
		d.t.reused.Add(1)
		if !isChanged {
			d.f.add(&d.f.failed, fmt.Sprintf("key %s: 422 for the body it was first sent with", e.key))
		} else if err := checkProblem(a, "idempotency_key_reused"); err != nil {
			d.f.add(&d.f.failed, fmt.Sprintf("key %s: %v", e.key, err))
		}
		if ran != 0 {
			d.f.add(&d.f.failed, fmt.Sprintf("key %s: a 422, and the handler ran %d times meanwhile", e.key, ran))
		}
	case a.status == 503:
		// A correct refusal (the store is full or failed), never a
		// failure: but the handler must not have run for it.
		d.t.refused.Add(1)
		if err := checkProblem(a, "unavailable"); err != nil {
			d.f.add(&d.f.failed, fmt.Sprintf("key %s: %v", e.key, err))
		}
		if ran != 0 {
			d.f.add(&d.f.failed, fmt.Sprintf("key %s: a 503, and the handler ran %d times meanwhile", e.key, ran))
		}
	case a.status == 409:
		// send gave up after claimLife, and said so.
	default:
		d.f.add(&d.f.failed, fmt.Sprintf("key %s: unexpected answer %d %.200q", e.key, a.status, a.body))
	}
}

// checkRun checks that an answer came from a run of the handler for key
// that read the whole body, and returns the key's run number it carries
// (1 for the key's first run) and when the run began.
func checkRun(a answer, key string, bodyLen int) (run int, at time.Duration, err error) {
	bad := fmt.Errorf("key %s: answer %.200q is not from a run of the key", key, a.body)
	rest, ok := strings.CutPrefix(a.body, `{"key":"`+key+`","run":`)
	if !ok {
		return 0, 0, bad
	}
	n, rest, ok := strings.Cut(rest, `,"id":`)
	if run, err = strconv.Atoi(n); !ok || err != nil || run < 1 {
		return 0, 0, bad
	}
	_, rest, ok = strings.Cut(rest, `,"at":`)
	n, rest, _ = strings.Cut(rest, `,"bytes":`)
	ns, err := strconv.ParseInt(n, 10, 64)
	if !ok || err != nil {
		return 0, 0, bad
	}
	if rest != strconv.Itoa(bodyLen)+"}\n" {
		return run, time.Duration(ns), fmt.Errorf("key %s: the handler did not read the %d bytes sent: %.200q", key, bodyLen, a.body)
	}
	if !strings.Contains(a.headers, "Content-Type: application/json") {
		return run, time.Duration(ns), fmt.Errorf("key %s: answer headers %q", key, a.headers)
	}
	return run, time.Duration(ns), nil
}

// checkProblem checks one of the middleware's problem answers: its media
// type, its code, and a Retry-After of at least one second on 409 and 503.
func checkProblem(a answer, code string) error {
	if !strings.Contains(a.headers, "Content-Type: application/problem+json") {
		return fmt.Errorf("%d answer headers %q", a.status, a.headers)
	}
	if !strings.Contains(a.body, `"code":"`+code+`"`) {
		return fmt.Errorf("%d answer %.200q lacks code %s", a.status, a.body, code)
	}
	if a.status == 409 || a.status == 503 {
		if n, err := strconv.Atoi(a.retryAfter); err != nil || n < 1 {
			return fmt.Errorf("%d answer with Retry-After %q", a.status, a.retryAfter)
		}
	}
	return nil
}
