package middleware

import (
	"net/http"
	"strconv"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/rawdigest"
	"github.com/idemkey/idemkey/store"
)

// cached answers a request whose key's kept response is in the local
// cache, as completed does. With the default fingerprint, a repeat whose
// raw digest equals one already found to match the record has the same
// fingerprint, so the fingerprint (which canonicalises the body and costs
// several times the digest) is computed only for a repeat whose bytes
// differ from those seen before. fresh is as for completed.
func (m *Middleware) cached(w http.ResponseWriter, r *http.Request, skey string, rec *store.Record, raw [32]byte, hasRaw bool, body []byte, ev Event, fresh string) {
	if !m.cfg.defaultFingerprint {
		m.completed(w, r, rec, m.cfg.fingerprint(r, body) == rec.Fingerprint, ev, fresh, nil)
		return
	}
	d := rawdigest.Of(r, body)
	if hasRaw && d == raw || d == rec.RawDigest {
		m.replay(w, r, rec, ev, fresh, nil)
		return
	}
	same := m.cfg.fingerprint(r, body) == rec.Fingerprint
	if same {
		m.cache.learn(skey, rec, d)
	}
	m.completed(w, r, rec, same, ev, fresh, nil)
}

// completed answers a request whose key holds a kept response: the replay
// when it was kept for the same request, 422 when not. fresh is a new
// request id made for the request (see newToken), or "". slot is room
// for the replayed headers' values, as for replay.
func (m *Middleware) completed(w http.ResponseWriter, r *http.Request, rec *store.Record, same bool, ev Event, fresh string, slot []string) {
	if !same {
		ev.Kind = EventKeyReused
		m.refuseWithID(w, r, ev, problemKeyReused, 0, fresh)
		return
	}
	m.replay(w, r, rec, ev, fresh, slot)
}

// replay writes a kept response, under the repeat's own request id. The
// response's header values are copies, in slot when it has room for them
// (the attempt's own array: no allocation), else in a new array.
func (m *Middleware) replay(w http.ResponseWriter, r *http.Request, rec *store.Record, ev Event, fresh string, slot []string) {
	if m.observed() {
		ev.Kind, ev.Status, ev.Size = EventReplay, rec.Status, recordSize(rec)
		m.emit(r, ev)
	}
	// The repeat's own id, read before the kept headers are copied in.
	id := m.requestID(w, r, fresh)
	h := w.Header()
	n := 0
	for _, v := range rec.Header {
		n += len(v)
	}
	// One array holds the kept values and the four the replay may add.
	values := slot
	if len(values) >= n+4 {
		values = values[:n+4]
	} else {
		values = make([]string, n+4)
	}
	for k, v := range rec.Header {
		n := copy(values, v)
		h[k] = values[:n:n]
		values = values[n:]
	}
	// set is h.Set for a canonical name, with the value slot taken from
	// values.
	set := func(name, v string) {
		values[0] = v
		h[name] = values[:1:1]
		values = values[1:]
	}
	set(idemkey.HeaderReplayed, "true")
	if id != "" {
		set(idemkey.HeaderRequestID, id)
	}
	if rec.BodyOmitted {
		set(idemkey.HeaderBodyOmitted, "true")
	}
	if bodyAllowed(rec.Status) {
		set("Content-Length", strconv.Itoa(len(rec.Body)))
	}
	w.WriteHeader(rec.Status)
	if len(rec.Body) > 0 && bodyAllowed(rec.Status) {
		w.Write(rec.Body)
	}
}

// recordSize is the bytes a record keeps: its body, and its headers' names
// and values.
func recordSize(rec *store.Record) int {
	n := len(rec.Body)
	for k, vs := range rec.Header {
		n += len(k)
		for _, v := range vs {
			n += len(v)
		}
	}
	return n
}
