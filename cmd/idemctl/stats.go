package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/mysql"
	"github.com/idemkey/idemkey/store/postgres"
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
	// InfoRefused: the server refused INFO memory, so the memory figures
	// are not known.
	InfoRefused bool `json:"info_refused,omitempty"`
}

func stats(ctx context.Context, e *env, args []string) error {
	fs := commandFlags(e, "stats", "[--count N] [--sample N]")
	fs.Int64Var(&e.scanCount, "count", redis.DefaultScanCount, "keys asked for per SCAN call (its COUNT; Redis)")
	fs.Int64Var(&e.scanSample, "sample", redis.DefaultScanSample, "measure the memory of up to this many keys per master with MEMORY USAGE; 0 measures none (Redis)")
	ctx, err := parseFlags(ctx, e, fs, args, func() error {
		if e.scanCount <= 0 || e.scanSample < 0 {
			return fmt.Errorf("%w: --count must be positive and --sample not negative", errUsage)
		}
		return nil
	})
	if err != nil {
		return err
	}
	st, err := e.st.Stats(ctx)
	if err != nil {
		return err
	}
	switch d := st.Detail.(type) {
	case *postgres.TableStats:
		return e.printTableStats(st, d)
	case *mysql.TableStats:
		return e.printMySQLStats(st, d)
	case *redis.Memory:
		sum := redisSummary(st, d)
		if e.json {
			return e.printJSON(sum)
		}
		e.printSummary(&sum)
		return nil
	}
	return fmt.Errorf("a store of type %T cannot be counted", e.st)
}

// redisSummary is what stats prints of what a Redis store's Stats counted.
func redisSummary(st store.Stats, m *redis.Memory) summary {
	s := summary{Keys: st.Records + st.InFlight + st.Unreadable, Records: st.Records, InFlight: st.InFlight,
		Unreadable: st.Unreadable, Sampled: m.Sampled, SampledBytes: m.SampledBytes,
		EstimatedBytes: st.Bytes, Exact: m.Exact}
	if m.Sampled > 0 {
		s.BytesPerKey = float64(m.SampledBytes) / float64(m.Sampled)
	}
	for _, n := range m.Nodes {
		s.Nodes = append(s.Nodes, node(n))
	}
	return s
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
		if n.InfoRefused {
			fmt.Fprintf(e.stdout, "node %s: %d keys in all; the server refused INFO memory\n", n.Addr, n.DBSize)
			continue
		}
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
