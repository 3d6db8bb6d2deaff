// Package store defines what the idempotency middleware needs from the place
// it keeps claims and responses, and the record it keeps there.
//
// A key moves through two states. A claim marks it in flight: it holds an
// owner token, the request's fingerprint and a short life (the route's
// deadline plus a margin), so that a request that never finishes lets go of
// the key. Completing the claim turns it into a record that holds the
// response for the retention window. Every change after the claim is a
// compare-and-set on the owner token: a request whose claim lapsed and was
// taken by another can no longer touch the key.
//
// Every implementation must pass the conformance suite in package storetest.
package store

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Store keeps claims and completed records. Implementations are safe for
// concurrent use. A key is the name KeyName returns; implementations treat it
// as opaque.
//
// A store that does I/O bounds every call by its own time budget (well under
// a second), whatever its client's retries do, and honours ctx: the
// middleware calls Complete and Release with a context that the client's
// hang-up does not cancel, so the store's budget is what ends them. Backend
// failures wrap ErrUnavailable.
//
// Complete and Release may be sent twice (a client library resends a command
// whose reply was lost): each recognises its own earlier write and answers
// as that write did, so a resent call never reports a lost claim that was in
// fact kept or released.
//
// Capabilities that only some stores have are interfaces of their own,
// found with a type assertion: Extender (lengthen a live claim), TxStore
// (run the handler in the transaction that keeps the record), Waiter (wake
// a waiting repeat) and LazyClaimer (take the fingerprint only to write a
// claim).
type Store interface {
	// Claim atomically claims key for c.Token when nobody holds it, and
	// otherwise reports what holds it. It is a single round trip to the
	// backend. A claim that finds the caller's own token (a retried call
	// whose first reply was lost) reports Mine, which the caller treats as
	// Claimed. A store that is full refuses new claims with an error
	// wrapping ErrFull; it never drops a claim or a record inside its life
	// to make room.
	Claim(ctx context.Context, key string, c Claim) (Result, error)

	// Complete replaces the claim held by token with rec and keeps it for
	// retention. It returns nil without writing when key already holds a
	// record kept under token (a resent Complete), and ErrNotOwner, writing
	// nothing, when key is neither in flight under token nor kept under it
	// (the claim lapsed, was released, or another request holds it now).
	Complete(ctx context.Context, key, token string, rec *Record, retention time.Duration) error

	// Release deletes the claim held by token, so that the next request with
	// the key runs. It returns nil when key holds nothing (a resent Release,
	// or a claim that lapsed: either way the key is free), and ErrNotOwner,
	// deleting nothing, when key is held by another token or holds a kept
	// record.
	Release(ctx context.Context, key, token string) error
}

// Extender is a Store that can lengthen a live claim. The middleware uses it,
// when the store has it, to keep holding the key of a handler that runs, or
// whose response streams, longer than its claim's life.
type Extender interface {
	// Extend sets the remaining life of the claim held by token to ttl. It
	// returns ErrNotOwner when key is not in flight under token.
	Extend(ctx context.Context, key, token string, ttl time.Duration) error
}

// TxStore is a Store that runs a claimed request's handler inside a
// transaction of its backend and keeps the record in that transaction: the
// handler's own writes and the record commit together or not at all, so a
// crash between them cannot make a retry run the handler again.
type TxStore interface {
	Store
	// ClaimTx claims key as Claim does. When the answer is Claimed or Mine
	// it also returns the transaction the handler runs in, already begun;
	// otherwise tx is nil. A claim whose transaction could not be begun is
	// released and reported as an error wrapping ErrUnavailable.
	//
	// A store may take over at once a claim whose owner's transaction is
	// provably gone (its process or connection died), since the owner's
	// writes died with it; a live owner's claim never before its life ends.
	ClaimTx(ctx context.Context, key string, c Claim) (Result, Tx, error)

	// Begin opens a transaction with no claim, for a covered request that
	// carries no key (a route where the key is optional), so that a
	// handler's code is the same with a key and without one. Its Commit
	// commits the handler's writes and keeps nothing (rec says only which
	// status answered); its Rollback rolls them back. Failures wrap
	// ErrUnavailable.
	Begin(ctx context.Context) (Tx, error)
}

// Waiter is a Store that can wait for a key's first request to end
// without polling: the middleware's bounded wait (WithWait) uses it, when
// the store has it, to answer a repeat the moment the first request's
// record is kept or its claim released, on any instance.
type Waiter interface {
	// Wait returns true when the request that held key for c's
	// fingerprint has ended, or the wait's time (ctx) is up; the caller
	// then claims again to learn what became of the key. It returns
	// false, at once, when the key is not held in a way it can wait on
	// (the caller then polls), and an error wrapping ErrUnavailable when
	// the backend fails.
	Wait(ctx context.Context, key string, c Claim) (bool, error)
}

// LazyClaimer is a Store that can take a claim's fingerprint at the moment
// it needs it, which is only to write the claim on a free key: a repeat
// that finds the key completed or in flight is answered without it, and
// the middleware then tells a byte-identical repeat by the record's
// RawDigest without ever building the request's canonical form. A store
// in the process (store/memory) has it; a store whose claim is one command
// sent to a server with the fingerprint in it (a native SET NX GET, an
// INSERT) needs the fingerprint before it knows whether the key is free,
// and has no use for it.
type LazyClaimer interface {
	// ClaimLazy is Claim, with c.Fingerprint unset: the store asks fp for
	// it, at most once, when it writes the claim, and uses what fp
	// returns wherever Claim would use c.Fingerprint.
	ClaimLazy(ctx context.Context, key string, c Claim, fp Fingerprinter) (Result, error)
}

// A Fingerprinter gives a request's fingerprint (Claim.Fingerprint) when
// asked, computing it the first time.
type Fingerprinter interface {
	Fingerprint() [32]byte
}

// Inspector is a Store that operators' tools (cmd/idemctl) can look into:
// what one key holds, deleting what was seen, and counts of what the store
// holds. The middleware never uses it. The memory, Redis, PostgreSQL and
// MySQL stores have it.
type Inspector interface {
	// Inspect returns what key (a name KeyName made) holds, and whether it
	// holds anything. An entry this version cannot read in full is
	// returned with found true and an error that says why (the store's
	// ErrUnreadable), with what could be read of it: it can still be
	// deleted. Any other error comes with found false.
	Inspect(ctx context.Context, key string) (e Entry, found bool, err error)
	// Delete deletes key's entry only while it is still the one seen (as
	// Inspect returned it): a key that changed since, or holds nothing, is
	// left alone. It reports whether it deleted the entry. Once a record
	// is deleted, a retry with its key runs the handler again; once a
	// claim in flight is deleted, a retry runs the handler while the first
	// request may still be running.
	Delete(ctx context.Context, key string, seen Entry) (bool, error)
	// Stats counts what the store holds. It may read every entry: it is
	// for operators, not for every request or every metrics scrape.
	Stats(ctx context.Context) (Stats, error)
}

// Entry is what one key holds, as Inspector.Inspect reads it.
type Entry struct {
	// State is InFlight for a claim and Completed for a kept record; zero
	// for an entry that cannot be read.
	State State
	// Fingerprint is that of the request that claimed the key or produced
	// the record.
	Fingerprint [32]byte
	// CreatedAt is when the key was claimed.
	CreatedAt time.Time
	// TTL is the entry's remaining life when it was read, on the store's
	// clock: until a claim lapses or a record's retention ends. It is zero
	// when NoExpiry, and how long ago the life ended (negative) when
	// Expired.
	TTL time.Duration
	// Expired: the entry's life is over but the store has not removed it
	// yet (store/postgres keeps such rows until its sweeper deletes them).
	// The store treats its key as free.
	Expired bool
	// NoExpiry: the entry never expires (a Redis key whose expiry was
	// removed by hand; idemkey never writes one).
	NoExpiry bool
	// Record is the kept response when State is Completed.
	Record *Record
	// Size is the entry's size in the store, in bytes, as the store
	// measures it: the stored value (Redis), the row without its index
	// entries (PostgreSQL), what it counts against its bound (memory).
	Size int
	// Memory is what the server reports the entry costs it, in bytes, its
	// own overhead included (Redis: MEMORY USAGE); 0 when it does not say.
	Memory int64
	// Transactional: a claim in flight held by a request's transaction
	// (a TxStore's ClaimTx). A claim the transaction has not committed
	// has no committed row: only that it is held, and since when
	// (CreatedAt: when the transaction began), can be seen; its
	// Fingerprint and TTL are zero, and Delete cannot free it (end the
	// transaction instead). OwnerGone: the claim was committed with a lock
	// its owner no longer holds (an earlier store/postgres), so the key is
	// taken over when its life ends.
	Transactional, OwnerGone bool
	// Fence is what Delete compares to delete only this entry: opaque, set
	// by Inspect. It may hold the claim's owner token: never show it.
	Fence string `json:"-"`
}

// Stats is what a store holds, as Inspector.Stats counts it.
type Stats struct {
	// Records counts the kept records, InFlight the claims of requests in
	// flight, both inside their life.
	Records, InFlight int64
	// Expired counts entries whose life is over that the store has not
	// removed yet (they count as gone); Unreadable those this version
	// cannot read (written by a later version, or not by idemkey).
	Expired, Unreadable int64
	// Bytes is what the entries take, as the store measures it: what the
	// memory store counts against its bound, the Redis keys' memory
	// (estimated from a sample unless every key was measured), the
	// PostgreSQL table's and its indexes' size on disk.
	Bytes int64
	// Detail holds what only this store reports, as a type of its
	// package: *redis.Memory, *postgres.TableStats, *mysql.TableStats;
	// nil for memory.
	Detail any
}

// Tx is the transaction a claimed request's handler runs in. Exactly one of
// Commit and Rollback is called, once.
type Tx interface {
	// NewContext returns a copy of ctx that carries the transaction, for
	// the handler; the store's package says how a handler gets it back.
	NewContext(ctx context.Context) context.Context
	// Commit keeps rec in the transaction, fenced by the claim's owner
	// token, and commits. It returns ErrNotOwner when the claim is no
	// longer this request's (it lapsed and another request took the key):
	// then the transaction is rolled back and nothing is kept. Any other
	// error means the commit failed or its outcome is unknown.
	Commit(ctx context.Context, rec *Record, retention time.Duration) error
	// Rollback rolls the transaction back and releases the claim, so that
	// a retry runs the handler again.
	Rollback(ctx context.Context) error
}

// Claim is what a request asks the store for.
type Claim struct {
	// Token is a fresh random value that identifies this request as the
	// owner of the claim.
	Token string
	// Fingerprint is the canonical digest of the request.
	Fingerprint [32]byte
	// TTL is the life of the claim: the route's deadline plus a margin.
	TTL time.Duration
}

// State is the outcome of a claim.
type State uint8

// The outcomes of Store.Claim.
const (
	// Claimed: the key was free and now belongs to the caller.
	Claimed State = iota + 1
	// Mine: the key is in flight under the caller's own token. A backend
	// that resends a claim after a lost reply produces this; treat it as
	// Claimed.
	Mine
	// InFlight: another request holds the key and has not finished.
	InFlight
	// Completed: the key holds a kept response.
	Completed
)

var stateNames = [...]string{"invalid", "claimed", "mine", "in flight", "completed"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return stateNames[0]
}

// Result is the answer to a claim.
type Result struct {
	State State
	// Fingerprint is the fingerprint stored with the key: the claim's
	// (Claimed, Mine, InFlight) or the record's (Completed).
	Fingerprint [32]byte
	// TTL is the remaining life of the claim when State is InFlight.
	TTL time.Duration
	// ClaimedAt is when the holder claimed the key, on the store's clock,
	// when State is InFlight: how long the first request has been running.
	ClaimedAt time.Time
	// Record is the kept response when State is Completed.
	Record *Record
}

// Record is a kept response.
type Record struct {
	// Status is the HTTP status code of the response.
	Status int
	// Header holds the response headers that may be replayed.
	Header http.Header
	// Body is the response body; empty when BodyOmitted.
	Body []byte
	// BodyOmitted reports that the body was larger than the capture limit
	// and was not kept: a replay sends the status and headers only.
	BodyOmitted bool
	// Fingerprint is the canonical digest of the request that produced the
	// response.
	Fingerprint [32]byte
	// RawDigest is a digest of that request as its bytes were sent, kept
	// beside Fingerprint so that a repeat with the same bytes is known
	// without building the canonical form; zero when the record was kept
	// without one (a store or an earlier version that does not keep it),
	// and then the repeat is compared by Fingerprint alone. A store keeps
	// it as it keeps Fingerprint: 32 opaque bytes.
	RawDigest [32]byte
	// CreatedAt is when the key was claimed, CompletedAt when the response
	// was kept.
	CreatedAt, CompletedAt time.Time
}

// Errors a Store returns. Match them with errors.Is.
var (
	// ErrNotOwner: the caller's token does not hold the key.
	ErrNotOwner = errors.New("idemkey: store: claim not held by this token")
	// ErrUnavailable: the backend could not be reached or refused the
	// operation. Stores wrap their backend's error with it.
	ErrUnavailable = errors.New("idemkey: store: unavailable")
	// ErrUnreachable: the backend could not be reached at all (a refused
	// or timed-out dial, an unknown host), as opposed to one that is
	// busy (a full pool) or that refused the operation. It wraps
	// ErrUnavailable; only this error lets a middleware built with
	// WithFailOpen run a handler without a claim.
	ErrUnreachable = fmt.Errorf("%w: not reachable", ErrUnavailable)
	// ErrFull: the store is at capacity and refuses new claims rather than
	// drop a claim or a record inside its life.
	ErrFull = errors.New("idemkey: store: full")
)

// KeyPrefix starts every name KeyName returns.
const KeyPrefix = "idem:v1:"

// KeyName returns the store key for an idempotency key in a scope:
// "idem:v1:{<64 hex>}", where the hex is a SHA-256 over the length-prefixed
// scope and key. Raw scopes and keys never appear in store key names, two
// different (scope, key) pairs never share a name, and the braces are a
// Redis Cluster hash tag that keeps everything about one record in one slot.
func KeyName(scope, key string) string {
	var b [KeyNameLen]byte
	return string(AppendKeyName(b[:0], scope, key))
}

// KeyNameLen is the length of every name KeyName returns.
const KeyNameLen = len(KeyPrefix) + 2 + 2*sha256.Size

// AppendKeyName appends KeyName(scope, key) to dst and returns the
// extended buffer, so that a caller can build the name in a buffer of its
// own (the middleware makes it with the request's owner token, in one
// allocation).
func AppendKeyName(dst []byte, scope, key string) []byte {
	d := digest(scope, key)
	dst = append(dst, KeyPrefix...)
	dst = append(dst, '{')
	dst = hex.AppendEncode(dst, d[:])
	return append(dst, '}')
}

// digest returns the SHA-256 over the length-prefixed scope and key that
// KeyName encodes. Logs and operators' tools name a record by its hex
// (DigestOf).
func digest(scope, key string) [sha256.Size]byte {
	var buf [128]byte
	b := buf[:0]
	b = binary.BigEndian.AppendUint32(b, uint32(len(scope)))
	b = append(b, scope...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(key)))
	b = append(b, key...)
	return sha256.Sum256(b)
}

// DigestOf returns the hex digest inside a name made by KeyName, or "" when
// name is not one.
func DigestOf(name string) string {
	const n = len(KeyPrefix) + 2 + 2*sha256.Size
	if len(name) != n || name[:len(KeyPrefix)] != KeyPrefix {
		return ""
	}
	return name[len(KeyPrefix)+1 : n-1]
}
