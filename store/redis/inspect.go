package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
)

var _ store.Inspector = (*Store)(nil)

// Inspect implements store.Inspector. It runs under the caller's context
// (an operator's tool bounds the whole command), not the call budget. It
// reads the key's value, its
// remaining life and its memory usage in one round trip; MEMORY USAGE may
// be refused (a managed server that renames it), and then Memory is 0. A
// value this version cannot read is returned with found true and an error
// wrapping ErrUnreadable. The claim's owner token is not reported.
func (s *Store) Inspect(ctx context.Context, key string) (store.Entry, bool, error) {
	name := s.name(key)
	var (
		get  *goredis.StringCmd
		pttl *goredis.DurationCmd
		mem  *goredis.IntCmd
	)
	// The pipeline's own error is the first command's; each command's is
	// read below.
	s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		get = p.Get(ctx, name)
		pttl = p.PTTL(ctx, name)
		mem = p.MemoryUsage(ctx, name, 0)
		return nil
	})
	v, err := get.Result()
	switch {
	case errors.Is(err, goredis.Nil):
		return store.Entry{}, false, nil
	case err != nil:
		return store.Entry{}, false, unavailable("inspect", err)
	}
	ttl, err := pttl.Result()
	if err != nil {
		return store.Entry{}, false, unavailable("inspect", err)
	}
	e, derr := decodeValue(v)
	e.Fence = v
	switch {
	case ttl < 0: // -1: no expiry; -2 (gone since GET) reads as none too
		e.NoExpiry = true
	default:
		e.TTL = ttl
	}
	if n, err := mem.Result(); err == nil {
		e.Memory = n
	}
	return e, true, derr
}

// decodeValue reads a value as GET returns it for a key the store keeps:
// its state, fingerprint, creation time, record and size. It returns an
// error wrapping ErrUnreadable for a value this version cannot read, with
// the Size alone.
func decodeValue(v string) (store.Entry, error) {
	e := store.Entry{Size: len(v)}
	st, err := stateOf(v)
	if err != nil {
		return e, err
	}
	if st == store.InFlight {
		f, err := decodeInFlight(v)
		if err != nil {
			return e, err
		}
		e.State, e.Fingerprint, e.CreatedAt = st, f.fingerprint, f.created
		return e, nil
	}
	rec, _, err := decodeRecord(v)
	if err != nil {
		return e, err
	}
	e.State, e.Fingerprint, e.CreatedAt, e.Record = st, rec.Fingerprint, rec.CreatedAt, rec
	return e, nil
}

// stateOf tells a claim (store.InFlight) from a record (store.Completed) by
// the first byte of a stored value alone, so that Stats reads one byte of
// each key (GETRANGE key 0 0) rather than the whole value. It returns an
// error wrapping ErrUnreadable for an empty prefix or a format version this
// one does not know.
func stateOf(prefix string) (store.State, error) {
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

// Delete implements store.Inspector: one script deletes the key while it
// still holds the value Inspect read.
func (s *Store) Delete(ctx context.Context, key string, seen store.Entry) (bool, error) {
	if seen.Fence == "" {
		return false, nil
	}
	reply, err := s.run(ctx, deleteScript, s.name(key), seen.Fence, s.hub.arg)
	if err != nil {
		return false, unavailable("delete", err)
	}
	return reply == int64(1), nil
}

// Memory is the Detail of a Redis store's Stats: the memory its keys take
// and each master's.
type Memory struct {
	// Sampled counts the keys measured with MEMORY USAGE (see WithScan),
	// SampledBytes their total. Exact: every key was measured, so
	// Stats.Bytes is their total; otherwise it is their mean times the
	// keys counted.
	Sampled, SampledBytes int64
	Exact                 bool
	// Nodes holds each master's memory, in the order they were scanned.
	Nodes []NodeMemory
}

// NodeMemory is one master's memory, from INFO memory and DBSIZE.
type NodeMemory struct {
	Addr string
	// DBSize counts every key of the node's database, idemkey's or not.
	DBSize          int64
	UsedMemory      int64
	UsedMemoryHuman string
	// Maxmemory is 0 when the server has no limit.
	Maxmemory       int64
	MaxmemoryPolicy string
	// InfoRefused: the server refused INFO memory (a managed server may),
	// so UsedMemory, Maxmemory and MaxmemoryPolicy are not known.
	InfoRefused bool
}

// Stats implements store.Inspector. It scans the store's keys on every
// master (SCAN MATCH with the key prefix, COUNT as WithScan says), reads the
// first byte of each to tell records from claims from values it cannot
// read, measures up to WithScan's sample of them with MEMORY USAGE, and
// reads each master's INFO memory and DBSIZE into the *Memory of
// Stats.Detail. Keys never expire while they are live, so Expired is 0. The
// client must be a *redis.Client (standalone or Sentinel) or a
// *redis.ClusterClient.
func (s *Store) Stats(ctx context.Context) (store.Stats, error) {
	var (
		mu  sync.Mutex
		st  store.Stats
		mem Memory
	)
	pattern := s.prefix + store.KeyPrefix + "*"
	scanNode := func(ctx context.Context, c *goredis.Client) error {
		ns, sampled, sampledBytes, node, err := s.scan(ctx, c, pattern)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Options().Addr, err)
		}
		mu.Lock()
		defer mu.Unlock()
		st.Records += ns.Records
		st.InFlight += ns.InFlight
		st.Unreadable += ns.Unreadable
		mem.Sampled += sampled
		mem.SampledBytes += sampledBytes
		mem.Nodes = append(mem.Nodes, node)
		return nil
	}
	var err error
	switch c := s.client.(type) {
	case *goredis.ClusterClient:
		err = c.ForEachMaster(ctx, scanNode)
	case *goredis.Client:
		err = scanNode(ctx, c)
	default:
		err = fmt.Errorf("a %T cannot be scanned node by node", s.client)
	}
	if err != nil {
		return store.Stats{}, unavailable("stats", err)
	}
	keys := st.Records + st.InFlight + st.Unreadable
	mem.Exact = mem.Sampled == keys
	switch {
	case mem.Exact:
		st.Bytes = mem.SampledBytes
	case mem.Sampled > 0:
		st.Bytes = int64(float64(mem.SampledBytes) / float64(mem.Sampled) * float64(keys))
	}
	st.Detail = &mem
	return st, nil
}

// scan counts one node's keys that match pattern and measures up to the
// sample of them.
func (s *Store) scan(ctx context.Context, c *goredis.Client, pattern string) (st store.Stats, sampled, sampledBytes int64, n NodeMemory, err error) {
	n.Addr = c.Options().Addr
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, pattern, s.scanCount).Result()
		if err != nil {
			return st, sampled, sampledBytes, n, err
		}
		if len(keys) > 0 {
			heads := make([]*goredis.StringCmd, len(keys))
			mems := make([]*goredis.IntCmd, len(keys))
			// Each command's error is read below; a refused MEMORY USAGE
			// only leaves its key unmeasured.
			c.Pipelined(ctx, func(p goredis.Pipeliner) error {
				for i, k := range keys {
					heads[i] = p.GetRange(ctx, k, 0, 0)
					if sampled+int64(i) < s.scanSample {
						mems[i] = p.MemoryUsage(ctx, k, 0)
					}
				}
				return nil
			})
			for i := range keys {
				head, err := heads[i].Result()
				if err != nil {
					return st, sampled, sampledBytes, n, err
				}
				if head == "" { // expired since SCAN saw it
					continue
				}
				switch state, err := stateOf(head); {
				case err != nil:
					st.Unreadable++
				case state == store.InFlight:
					st.InFlight++
				default:
					st.Records++
				}
				if mems[i] != nil {
					if b, err := mems[i].Result(); err == nil {
						sampled++
						sampledBytes += b
					}
				}
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}

	info, err := c.Info(ctx, "memory").Result()
	var refused goredis.Error
	switch {
	case errors.As(err, &refused) && !errors.Is(err, goredis.Nil):
		n.InfoRefused, info = true, ""
	case err != nil:
		return st, sampled, sampledBytes, n, err
	}
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "used_memory":
			n.UsedMemory, _ = strconv.ParseInt(v, 10, 64)
		case "used_memory_human":
			n.UsedMemoryHuman = v
		case "maxmemory":
			n.Maxmemory, _ = strconv.ParseInt(v, 10, 64)
		case "maxmemory_policy":
			n.MaxmemoryPolicy = v
		}
	}
	if n.DBSize, err = c.DBSize(ctx).Result(); err != nil {
		return st, sampled, sampledBytes, n, err
	}
	return st, sampled, sampledBytes, n, nil
}
