package sqlcore

import (
	"fmt"
	"time"

	"github.com/idemkey/idemkey/store"
)

// Kind is what a claim found holding its key.
type Kind int8

// The kinds of Found.
const (
	// Row: a committed, live row holds the key (a kept record, or a
	// plain claim in flight).
	Row Kind = iota + 1
	// HeldSame: a transaction holds the key for a request with the
	// claim's fingerprint (its own claim is not committed, so nothing
	// else of it can be read).
	HeldSame
	// HeldOther: a transaction holds the key for another request.
	HeldOther
)

// Found is what a claim found holding its key, as the store read it. For
// Row every field but HeldSince is read from the row; for HeldSame and
// HeldOther only HeldSince is, when the store can tell.
type Found struct {
	Kind Kind
	// Token is the owner token of a row in flight.
	Token string
	// Fingerprint and RawDigest are the row's; RawDigest is empty when
	// the row has none.
	Fingerprint, RawDigest []byte
	// CreatedAt is when the row's key was claimed; Remaining the life
	// left to a claim in flight.
	CreatedAt time.Time
	Remaining time.Duration
	// Kept reports a kept record, whose Status, Header (a block of
	// EncodeHeader), Body, BodyOmitted and CompletedAt follow.
	Kept        bool
	Status      int
	Header      []byte
	Body        []byte
	BodyOmitted bool
	CompletedAt time.Time
	// HeldSince is when the holding transaction began (HeldSame,
	// HeldOther); zero when it is not known.
	HeldSince time.Time
}

// Result is what f means to the middleware for claim c: InFlight (with
// the holder's fingerprint, or one that is not c's when it is only known
// to be another request's), Mine (a row in flight under c's own token, a
// claim resent after its reply was lost) or Completed. An error is a row
// that cannot be read; it wraps ErrHeaderBlock when the header block is
// the cause.
func (f *Found) Result(c store.Claim) (store.Result, error) {
	var res store.Result
	switch f.Kind {
	case HeldSame, HeldOther:
		res.State, res.Fingerprint = store.InFlight, c.Fingerprint
		if f.Kind == HeldOther {
			res.Fingerprint = Another(c.Fingerprint)
		}
		res.ClaimedAt, res.TTL = time.Now(), c.TTL
		if !f.HeldSince.IsZero() {
			res.ClaimedAt = f.HeldSince
			// The holder's clock (the server's) and this one may
			// disagree: never more than the claim's own life.
			res.TTL = min(max(c.TTL-time.Since(res.ClaimedAt), time.Second), c.TTL)
		}
		return res, nil
	case Row:
	default:
		return res, fmt.Errorf("unexpected answer %d", f.Kind)
	}
	if len(f.Fingerprint) != len(res.Fingerprint) {
		return res, fmt.Errorf("fingerprint of %d bytes", len(f.Fingerprint))
	}
	copy(res.Fingerprint[:], f.Fingerprint)
	if !f.Kept {
		res.State, res.TTL, res.ClaimedAt = store.InFlight, f.Remaining, f.CreatedAt
		if f.Token == c.Token {
			res.State = store.Mine
		}
		return res, nil
	}
	h, err := DecodeHeader(f.Header)
	if err != nil {
		return store.Result{}, err
	}
	body := f.Body
	if body == nil {
		body = []byte{}
	}
	rec := &store.Record{
		Status:      f.Status,
		Header:      h,
		Body:        body,
		BodyOmitted: f.BodyOmitted,
		Fingerprint: res.Fingerprint,
		CreatedAt:   f.CreatedAt,
		CompletedAt: f.CompletedAt,
	}
	switch len(f.RawDigest) {
	case 0:
	case len(rec.RawDigest):
		copy(rec.RawDigest[:], f.RawDigest)
	default:
		return store.Result{}, fmt.Errorf("raw digest of %d bytes", len(f.RawDigest))
	}
	res.State, res.Record = store.Completed, rec
	return res, nil
}

// Another returns a fingerprint that is not fp: what an answer InFlight
// carries for a holder known only to have another request's.
func Another(fp [32]byte) [32]byte {
	for i := range fp {
		fp[i] = ^fp[i]
	}
	return fp
}
