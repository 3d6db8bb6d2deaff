package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// The two hand-written idempotency layers the table measures idemkey
// against. Both are as lean as a careful engineer would write them for one
// service: the key header, the body read up to the limit, a SHA-256 of
// the request, the handler into a buffer, then the answer; no time budget
// per call, no handler deadline, no events, no canonical JSON.

// floor makes exactly the Redis calls idemkey needs, written by hand: one
// claim script (claim a free key, or answer what holds it) and, after the
// handler, one store script (keep the response if the claim is still this
// request's). Its cost is the bar idemkey on Redis has to reach.
type floor struct {
	rdb  *goredis.Client
	next http.Handler
}

var (
	floorClaim = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1`)
	floorStore = goredis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1`)
	floorRelease = goredis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])`)
)

// The floor's values: a claim is 'F' | token | fingerprint; a kept
// response is 'R' | fingerprint | status (3 digits) | content-type length
// (1 byte) | content-type | body.
func (f *floor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, body, ok := readKeyed(w, r)
	if !ok {
		return
	}
	fp := requestHash(r, body)
	rkey := "floor:{" + key + "}"
	claim := "F" + rand.Text() + string(fp[:])
	ctx := r.Context()
	res, err := floorClaim.Run(ctx, f.rdb, []string{rkey}, claim, claimTTL.Milliseconds()).Result()
	if err != nil {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	if v, ok := res.(string); ok {
		switch {
		case v[0] == 'F' && len(v) > 32:
			if v[len(v)-32:] != string(fp[:]) {
				http.Error(w, "key reused", http.StatusUnprocessableEntity)
				return
			}
			http.Error(w, "in flight", http.StatusConflict)
		case v[0] == 'R' && len(v) >= 37 && len(v) >= 37+int(v[36]):
			if v[1:33] != string(fp[:]) {
				http.Error(w, "key reused", http.StatusUnprocessableEntity)
				return
			}
			status, _ := strconv.Atoi(v[33:36])
			n := int(v[36])
			h := w.Header()
			h.Set("Content-Type", v[37:37+n])
			h.Set("Idempotent-Replayed", "true")
			h.Set("Content-Length", strconv.Itoa(len(v)-37-n))
			w.WriteHeader(status)
			io.WriteString(w, v[37+n:])
		default:
			http.Error(w, "unreadable record", http.StatusInternalServerError)
		}
		return
	}
	bw := &bufWriter{h: w.Header()}
	r.Body = io.NopCloser(bytes.NewReader(body))
	f.next.ServeHTTP(bw, r)
	if bw.status == 0 {
		bw.status = http.StatusOK
	}
	dctx := context.WithoutCancel(ctx)
	if bw.status >= 500 {
		floorRelease.Run(dctx, f.rdb, []string{rkey}, claim)
	} else {
		ct := w.Header().Get("Content-Type")
		rec := make([]byte, 0, 37+len(ct)+len(bw.body))
		rec = append(rec, 'R')
		rec = append(rec, fp[:]...)
		rec = strconv.AppendInt(rec, int64(bw.status), 10)
		rec = append(rec, byte(len(ct)))
		rec = append(rec, ct...)
		rec = append(rec, bw.body...)
		floorStore.Run(dctx, f.rdb, []string{rkey}, claim, rec, retention.Milliseconds())
	}
	bw.send(w)
}

// typical does what most idempotency libraries do: GET the stored
// response; on a miss SET NX a lock, run the handler, SET the response
// (JSON-encoded), DEL the lock. Four commands on a first run, one on a
// replay. It is not exactly-once: a request whose GET misses just before
// another finishes can take the lock after that one deletes it, and run
// again.
type typical struct {
	rdb  typicalClient
	next http.Handler
}

// typicalClient is what the typical pattern asks of Redis: a client, or an
// auto-pipelined one.
type typicalClient interface {
	Get(ctx context.Context, key string) *goredis.StringCmd
	SetNX(ctx context.Context, key string, value any, expiration time.Duration) *goredis.BoolCmd
	Set(ctx context.Context, key string, value any, expiration time.Duration) *goredis.StatusCmd
	Del(ctx context.Context, keys ...string) *goredis.IntCmd
}

type typicalRecord struct {
	Status      int                 `json:"status"`
	Header      map[string][]string `json:"header"`
	Body        []byte              `json:"body"`
	RequestHash string              `json:"request_hash"`
}

func (t *typical) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, body, ok := readKeyed(w, r)
	if !ok {
		return
	}
	fp := requestHash(r, body)
	hash := hex.EncodeToString(fp[:])
	ctx := r.Context()
	rkey, lkey := "typical:resp:"+key, "typical:lock:"+key
	v, err := t.rdb.Get(ctx, rkey).Bytes()
	switch {
	case err == nil:
		var rec typicalRecord
		if err := json.Unmarshal(v, &rec); err != nil {
			http.Error(w, "unreadable record", http.StatusInternalServerError)
			return
		}
		if rec.RequestHash != hash {
			http.Error(w, "key reused", http.StatusUnprocessableEntity)
			return
		}
		h := w.Header()
		for k, vs := range rec.Header {
			h[k] = vs
		}
		h.Set("Idempotent-Replayed", "true")
		h.Set("Content-Length", strconv.Itoa(len(rec.Body)))
		w.WriteHeader(rec.Status)
		w.Write(rec.Body)
		return
	case !errors.Is(err, goredis.Nil):
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	locked, err := t.rdb.SetNX(ctx, lkey, rand.Text(), claimTTL).Result()
	if err != nil {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	if !locked {
		http.Error(w, "in flight", http.StatusConflict)
		return
	}
	bw := &bufWriter{h: w.Header()}
	r.Body = io.NopCloser(bytes.NewReader(body))
	t.next.ServeHTTP(bw, r)
	if bw.status == 0 {
		bw.status = http.StatusOK
	}
	dctx := context.WithoutCancel(ctx)
	if bw.status < 500 {
		data, _ := json.Marshal(typicalRecord{Status: bw.status, Header: w.Header().Clone(), Body: bw.body, RequestHash: hash})
		t.rdb.Set(dctx, rkey, data, retention)
	}
	t.rdb.Del(dctx, lkey)
	bw.send(w)
}

// readKeyed reads the key header and the body, or answers 400 or 413.
func readKeyed(w http.ResponseWriter, r *http.Request) (key string, body []byte, ok bool) {
	key = r.Header.Get("Idempotency-Key")
	if key == "" || len(key) > 255 {
		http.Error(w, "key missing or invalid", http.StatusBadRequest)
		return "", nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		http.Error(w, "request too large", http.StatusRequestEntityTooLarge)
		return "", nil, false
	}
	return key, body, true
}

// requestHash is the hand-written layers' request fingerprint: SHA-256
// over the method, the escaped path and query, and the raw body.
func requestHash(r *http.Request, body []byte) [32]byte {
	h := sha256.New()
	io.WriteString(h, r.Method)
	h.Write([]byte{0})
	io.WriteString(h, r.URL.RequestURI())
	h.Write([]byte{0})
	h.Write(body)
	var fp [32]byte
	h.Sum(fp[:0])
	return fp
}

// bufWriter holds a handler's response: the status and body; the headers
// go straight to the real writer's map.
type bufWriter struct {
	h      http.Header
	status int
	body   []byte
}

func (b *bufWriter) Header() http.Header { return b.h }

func (b *bufWriter) WriteHeader(code int) {
	if b.status == 0 {
		b.status = code
	}
}

func (b *bufWriter) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	b.body = append(b.body, p...)
	return len(p), nil
}

// send writes the held response to w.
func (b *bufWriter) send(w http.ResponseWriter) {
	w.Header().Set("Content-Length", strconv.Itoa(len(b.body)))
	w.WriteHeader(b.status)
	w.Write(b.body)
}
