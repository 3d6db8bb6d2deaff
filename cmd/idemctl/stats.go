package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/redis"
)

// summary is what stats prints.
type summary struct {
	// Keys counts the keys under store.KeyPrefix; Records, InFlight and
	// Unreadable split them by what they hold.
	Keys       int64 `json:"keys"`
	Records    int64 `json:"records"`
	InFlight   int64 `json:"in_flight"`
	Unreadable int64 `json:"unreadable"`
	// Sampled counts the keys measured with MEMORY USAGE, SampledBytes
	// their total. BytesPerKey is the mean; EstimatedBytes is the mean
	// times Keys, exact when Exact (every key was measured).
	Sampled        int64   `json:"sampled"`
	SampledBytes   int64   `json:"sampled_bytes"`
	BytesPerKey    float64 `json:"bytes_per_key"`
	EstimatedBytes int64   `json:"estimated_bytes"`
	Exact          bool    `json:"exact"`
	// Nodes holds each master's INFO memory.
	Nodes []node `json:"nodes"`
}

// node is one master's memory, from INFO memory and DBSIZE.
type node struct {
	Addr string `json:"addr"`
	// DBSize counts every key of the node's database, idemkey's or not.
	DBSize          int64  `json:"dbsize"`
	UsedMemory      int64  `json:"used_memory"`
	UsedMemoryHuman string `json:"used_memory_human"`
	// Maxmemory is 0 when the server has no limit.
	Maxmemory       int64  `json:"maxmemory"`
	MaxmemoryPolicy string `json:"maxmemory_policy"`
}

func stats(ctx context.Context, e *env, args []string) error {
	fs := commandFlags(e, "stats", "[--count N] [--sample N]")
	count := fs.Int64("count", 1000, "keys asked for per SCAN call (its COUNT)")
	sample := fs.Int64("sample", 10000, "measure the memory of up to this many keys per master with MEMORY USAGE; 0 measures none")
	ctx, err := parseFlags(ctx, e, fs, args)
	if err != nil {
		return err
	}
	if *count <= 0 || *sample < 0 {
		return fmt.Errorf("%w: --count must be positive and --sample not negative", errUsage)
	}
	if e.pg != nil {
		return statsPostgres(ctx, e)
	}

	var (
		mu  sync.Mutex
		sum summary
	)
	scanNode := func(ctx context.Context, c *goredis.Client) error {
		s, n, err := scan(ctx, c, e.prefix+store.KeyPrefix+"*", *count, *sample)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Options().Addr, err)
		}
		mu.Lock()
		defer mu.Unlock()
		sum.Keys += s.Keys
		sum.Records += s.Records
		sum.InFlight += s.InFlight
		sum.Unreadable += s.Unreadable
		sum.Sampled += s.Sampled
		sum.SampledBytes += s.SampledBytes
		sum.Nodes = append(sum.Nodes, n)
		return nil
	}
	switch c := e.rdb.(type) {
	case *goredis.ClusterClient:
		err = c.ForEachMaster(ctx, scanNode)
	case *goredis.Client:
		err = scanNode(ctx, c)
	default:
		err = fmt.Errorf("unsupported client %T", e.rdb)
	}
	if err != nil {
		return err
	}
	if sum.Sampled > 0 {
		sum.BytesPerKey = float64(sum.SampledBytes) / float64(sum.Sampled)
	}
	sum.Exact = sum.Sampled == sum.Keys
	if sum.Exact {
		sum.EstimatedBytes = sum.SampledBytes
	} else {
		sum.EstimatedBytes = int64(sum.BytesPerKey * float64(sum.Keys))
	}
	if e.json {
		return e.printJSON(sum)
	}
	e.printSummary(&sum)
	return nil
}

// scan counts one node's keys that match pattern and measures up to sample
// of them.
func scan(ctx context.Context, c *goredis.Client, pattern string, count, sample int64) (summary, node, error) {
	var s summary
	n := node{Addr: c.Options().Addr}
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, pattern, count).Result()
		if err != nil {
			return s, n, err
		}
		if len(keys) > 0 {
			heads := make([]*goredis.StringCmd, len(keys))
			mems := make([]*goredis.IntCmd, len(keys))
			// Each command's error is read below; a refused MEMORY USAGE
			// only leaves its key unmeasured.
			c.Pipelined(ctx, func(p goredis.Pipeliner) error {
				for i, k := range keys {
					heads[i] = p.GetRange(ctx, k, 0, 0)
					if s.Sampled+int64(i) < sample {
						mems[i] = p.MemoryUsage(ctx, k, 0)
					}
				}
				return nil
			})
			for i := range keys {
				head, err := heads[i].Result()
				if err != nil {
					return s, n, err
				}
				if head == "" { // expired since SCAN saw it
					continue
				}
				s.Keys++
				switch st, err := redis.StateOf(head); {
				case err != nil:
					s.Unreadable++
				case st == store.InFlight:
					s.InFlight++
				default:
					s.Records++
				}
				if mems[i] != nil {
					if b, err := mems[i].Result(); err == nil {
						s.Sampled++
						s.SampledBytes += b
					}
				}
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}

	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return s, n, err
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
		return s, n, err
	}
	return s, n, nil
}

func (e *env) printSummary(s *summary) {
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "keys\t%d\n", s.Keys)
	fmt.Fprintf(tw, "records\t%d\n", s.Records)
	fmt.Fprintf(tw, "in flight\t%d\n", s.InFlight)
	if s.Unreadable > 0 {
		fmt.Fprintf(tw, "unreadable\t%d\t(written by another version, or not by idemkey)\n", s.Unreadable)
	}
	switch {
	case s.Sampled == 0:
		fmt.Fprintf(tw, "memory\tnot measured\n")
	case s.Exact:
		fmt.Fprintf(tw, "memory\t%d bytes, %.0f per key (every key measured)\n", s.EstimatedBytes, s.BytesPerKey)
	default:
		fmt.Fprintf(tw, "memory\t~%d bytes, %.0f per key (estimated from %d keys)\n", s.EstimatedBytes, s.BytesPerKey, s.Sampled)
	}
	tw.Flush()
	for _, n := range s.Nodes {
		limit := "no maxmemory"
		if n.Maxmemory > 0 {
			limit = fmt.Sprintf("maxmemory %d (%.0f%% used)", n.Maxmemory, 100*float64(n.UsedMemory)/float64(n.Maxmemory))
		}
		warn := ""
		if n.MaxmemoryPolicy != "noeviction" {
			warn = "  WARNING: not noeviction, Redis may evict claims and records"
		}
		if n.Maxmemory == 0 {
			warn += "  WARNING: no maxmemory, Redis grows until the kernel kills it and every record is lost at once (docs/operations.md, Sizing)"
		}
		fmt.Fprintf(e.stdout, "node %s: %d keys in all, used_memory %s, %s, maxmemory-policy %s%s\n",
			n.Addr, n.DBSize, n.UsedMemoryHuman, limit, n.MaxmemoryPolicy, warn)
	}
}
