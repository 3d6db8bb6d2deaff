package redis

import (
	"fmt"
	"time"

	"github.com/idemkey/idemkey/store"
)

// Value is a stored value decoded for inspection by operators' tools: a
// claim of a request in flight, or a kept record.
type Value struct {
	// State is store.InFlight for a claim and store.Completed for a record.
	State store.State
	// Fingerprint is the fingerprint of the request that claimed the key
	// or produced the record.
	Fingerprint [32]byte
	// CreatedAt is when the key was claimed.
	CreatedAt time.Time
	// Record is the kept response when State is store.Completed; nil for
	// a claim.
	Record *store.Record
	// Size is the length of the stored value, in bytes: what Redis holds
	// as the string's payload, without its own overhead per key.
	Size int
}

// DecodeValue reads a value as GET returns it for a key the store keeps
// (the name store.KeyName gives it). It returns an error wrapping
// ErrUnreadable for a value this version cannot read. The claim's owner
// token is not reported.
func DecodeValue(v string) (Value, error) {
	st, err := StateOf(v)
	if err != nil {
		return Value{}, err
	}
	if st == store.InFlight {
		f, err := decodeInFlight(v)
		if err != nil {
			return Value{}, err
		}
		return Value{State: st, Fingerprint: f.fingerprint, CreatedAt: f.created, Size: len(v)}, nil
	}
	rec, _, err := decodeRecord(v)
	if err != nil {
		return Value{}, err
	}
	return Value{State: st, Fingerprint: rec.Fingerprint, CreatedAt: rec.CreatedAt, Record: rec, Size: len(v)}, nil
}

// StateOf tells a claim (store.InFlight) from a record (store.Completed) by
// the first byte of a stored value alone, so that a tool counting keys can
// read one byte of each (GETRANGE key 0 0) rather than the whole value. It
// returns an error wrapping ErrUnreadable for an empty prefix or a format
// version this one does not know.
func StateOf(prefix string) (store.State, error) {
	if len(prefix) == 0 {
		return 0, fmt.Errorf("%w: empty value", ErrUnreadable)
	}
	switch prefix[0] {
	case tagInFlightV1, tagInFlightV2:
		return store.InFlight, nil
	case tagRecordV1, tagRecordV2:
		return store.Completed, nil
	}
	return 0, unreadable(prefix)
}
