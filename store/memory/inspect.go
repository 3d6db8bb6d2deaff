package memory

import (
	"context"
	"strconv"
	"time"

	"github.com/idemkey/idemkey/store"
)

var _ store.Inspector = (*Store)(nil)

// Inspect implements store.Inspector. It returns the context's error when
// ctx is already done. A record's Body is shared and read-only, as in a
// claim's answer.
func (s *Store) Inspect(ctx context.Context, key string) (store.Entry, bool, error) {
	if err := ctx.Err(); err != nil {
		return store.Entry{}, false, err
	}
	c := s.c
	d := digestOf(key)
	sh := c.shard(d)
	sh.mu.Lock()
	now := c.clock()
	e, ok := sh.live(c, d, now)
	sh.mu.Unlock()
	if !ok {
		return store.Entry{}, false, nil
	}
	ent := store.Entry{
		State:       store.InFlight,
		Fingerprint: e.fp,
		CreatedAt:   c.base.Add(time.Duration(e.claimed)),
		TTL:         time.Duration(e.expires - now),
		Size:        int(e.cost()),
		Fence:       fence(&e),
	}
	if e.data != nil {
		ent.State = store.Completed
		ent.Record = decode(e.data, e.fp)
	}
	return ent, true, nil
}

// fence identifies e for Delete: its kind, when it was claimed and when it
// lapses (which Extend moves), and a claim's owner.
func fence(e *entry) string {
	b := make([]byte, 0, 48+len(e.token))
	if e.data != nil {
		b = append(b, 'r')
	} else {
		b = append(b, 'c')
	}
	b = strconv.AppendInt(b, e.claimed, 10)
	b = append(b, ':')
	b = strconv.AppendInt(b, e.expires, 10)
	b = append(b, ':')
	return string(append(b, e.token...))
}

// Delete implements store.Inspector: it deletes key's entry while it is
// the one seen. It returns the context's error when ctx is already done.
func (s *Store) Delete(ctx context.Context, key string, seen store.Entry) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	c := s.c
	d := digestOf(key)
	sh := c.shard(d)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.live(c, d, c.clock())
	if !ok || seen.Fence == "" || fence(&e) != seen.Fence {
		return false, nil
	}
	sh.remove(c, d, e)
	return true, nil
}

// Stats implements store.Inspector: it counts the entries in one pass over
// the store, locking each shard in turn, so the counts are a moment apart
// from shard to shard. Bytes is what the store counts against WithMaxBytes:
// for each entry 300 bytes (its slot in a map, as measured), plus a claim's
// owner token, or a record's encoded size (its body, its header names and
// values, its token, and a few bytes of status and times, rounded up to
// the size of its allocation). Expired counts the entries past their life
// that the janitor has not removed yet; they count against the bounds
// until it does. It returns the context's error when ctx is already done.
func (s *Store) Stats(ctx context.Context) (store.Stats, error) {
	if err := ctx.Err(); err != nil {
		return store.Stats{}, err
	}
	c := s.c
	var st store.Stats
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		now := c.clock()
		for _, e := range sh.m {
			switch {
			case now >= e.expires:
				st.Expired++
			case e.data != nil:
				st.Records++
			default:
				st.InFlight++
			}
		}
		sh.mu.Unlock()
	}
	st.Bytes = c.bytes.Load()
	return st, nil
}
