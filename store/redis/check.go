package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// ErrEvictionPolicy reports a server whose maxmemory-policy is not
// noeviction. Under any other policy Redis may evict a claim while its
// handler runs, and a retry would then run the handler a second time.
var ErrEvictionPolicy = errors.New("idemkey: redis: maxmemory-policy is not noeviction")

// ErrServerVersion reports a server older than Redis 7.0, which cannot run
// the claim (SET with both NX and GET): every claim would fail.
var ErrServerVersion = errors.New("idemkey: redis: server older than Redis 7.0")

// Report is what Check found on the server, or on every node of a cluster.
type Report struct {
	// Nodes holds one entry per server checked: the one server of a
	// standalone or Sentinel client, every master and replica of a
	// cluster.
	Nodes []NodeReport
	// EvictionSafe is true when every node's maxmemory-policy is noeviction.
	EvictionSafe bool
	// Persistent is true when every node writes an append-only file or RDB
	// snapshots. When false, a restart of a node without persistence
	// forgets its claims and records: requests in flight lose their claim
	// and kept responses are gone, so retries run the handler again.
	Persistent bool
	// Warnings says in words what is unsafe, one line per problem; empty
	// when nothing is.
	Warnings []string
}

// NodeReport is what Check found on one server.
type NodeReport struct {
	// Addr is the node's address as the client knows it; "" for a
	// Sentinel client (whose master moves) and unknown client types.
	Addr string
	// MaxmemoryPolicy is the node's maxmemory-policy, for example
	// "noeviction".
	MaxmemoryPolicy string
	// AOF is true when the append-only file is on.
	AOF bool
	// RDBSave is the node's "save" setting, for example "3600 1 300 100";
	// "" when snapshots are off, and "unknown" when the server refuses
	// CONFIG GET (as managed services often do).
	RDBSave string
	// Version is the node's redis_version, for example "7.0.15"; "" when
	// INFO does not say.
	Version string
}

// Persistent reports whether the node writes an AOF or RDB snapshots. A
// node whose RDB setting is unknown and whose AOF is off counts as not
// persistent.
func (n NodeReport) Persistent() bool {
	return n.AOF || (n.RDBSave != "" && n.RDBSave != "unknown")
}

// Check reads each server's version, maxmemory-policy and persistence
// settings with INFO and CONFIG GET save, and checks that the client's
// Redis user may run every command the store sends, on the keys it sends
// them to: it claims, extends, releases, claims again and completes a probe
// key of its own, named as the store names keys (WithKeyPrefix included;
// one on each master of a cluster), and reads back what the scripts wrote.
// The probe deletes its key when done. New runs the same probe (not
// the settings); call Check once at start too, before serving, to learn
// of a server that may evict claims.
//
// It returns an error wrapping ErrServerVersion when a node is older than
// Redis 7.0; one wrapping ErrPermission, naming the command, when the user
// may not run a command the store sends (or INFO); one wrapping
// ErrEvictionPolicy when a node's policy is not noeviction (unless
// WithEvictionWarning made that a warning); and one wrapping
// store.ErrUnavailable when a node cannot be asked. A server out of memory
// cannot take the probe's writes: the permissions are then reported as
// unchecked in Report.Warnings, not refused. Persistence is reported,
// never refused: running without it is a choice (see the package
// documentation). So is a user that may not PUBLISH or SUBSCRIBE on the
// wake channel (Wait's, see the package documentation): its waiters are
// not woken, which Report.Warnings says. Each question has the call
// budget of WithCallTimeout, and all of them together the start budget of
// WithStartTimeout when ctx has no deadline; errors name the server.
func (s *Store) Check(ctx context.Context) (Report, error) {
	ctx, cancel := s.startContext(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		rep   Report
		first error
	)
	one := func(ctx context.Context, c goredis.UniversalClient, addr string) error {
		n, err := s.checkNode(ctx, c, addr)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			if first == nil {
				first = err
			}
			return nil
		}
		rep.Nodes = append(rep.Nodes, n)
		return nil
	}
	// Ask the client what it is by its methods, not its type, so that a
	// wrapper that embeds a go-redis client is checked as that client: a
	// cluster node by node, not the one node a command would reach.
	switch c := s.client.(type) {
	case shardWalker:
		if err := c.ForEachShard(ctx, func(ctx context.Context, node *goredis.Client) error {
			return one(ctx, node, node.Options().Addr)
		}); err != nil {
			return Report{}, unavailable("check "+serverName(s.client), err)
		}
	case clientOptions:
		addr := c.Options().Addr
		if addr == "FailoverClient" { // go-redis's name for a Sentinel client
			addr = ""
		}
		one(ctx, s.client, addr)
	default:
		one(ctx, s.client, "")
	}
	if first != nil {
		return Report{}, first
	}
	if len(rep.Nodes) == 0 {
		return Report{}, unavailable("check "+serverName(s.client), errors.New("no nodes to check"))
	}
	slices.SortFunc(rep.Nodes, func(a, b NodeReport) int { return strings.Compare(a.Addr, b.Addr) })
	for _, n := range rep.Nodes {
		if tooOld(n.Version) {
			return rep, fmt.Errorf("%w: %s is %s", ErrServerVersion, nodeName(n.Addr), n.Version)
		}
	}
	warn, err := s.checkAccess(ctx)
	if err != nil {
		return rep, err
	}
	if warn != "" {
		rep.Warnings = append(rep.Warnings, warn)
	}
	rep.Warnings = append(rep.Warnings, s.checkWake(ctx)...)
	rep.EvictionSafe, rep.Persistent = true, true
	var evicting []string
	for _, n := range rep.Nodes {
		if n.MaxmemoryPolicy != "noeviction" {
			rep.EvictionSafe = false
			evicting = append(evicting, fmt.Sprintf("%s %s", nodeName(n.Addr), n.MaxmemoryPolicy))
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s: maxmemory-policy is %s, not noeviction: claims may be evicted and handlers run twice", nodeName(n.Addr), n.MaxmemoryPolicy))
		}
		if !n.Persistent() {
			rep.Persistent = false
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s: persistence is off (no AOF, no RDB snapshots): a restart forgets every claim and record", nodeName(n.Addr)))
		}
	}
	if !rep.EvictionSafe {
		if !s.evictWarn {
			return rep, fmt.Errorf("%w (%s)", ErrEvictionPolicy, strings.Join(evicting, ", "))
		}
		slog.Default().Warn("idemkey: redis: maxmemory-policy is not noeviction: claims may be evicted and handlers run twice", "nodes", strings.Join(evicting, ", "))
	}
	return rep, nil
}

// checkWake checks that the client's user may PUBLISH and SUBSCRIBE on the
// store's wake channel, and returns a warning for each it may not. Without
// them the store keeps and releases as before (the scripts' PUBLISH is
// refused quietly), but Wait is not woken: a repeat that waits (the
// middleware's WithWait) claims again at its next recheck, within a
// second, without PUBLISH, and polls every 10 to 250 ms without
// SUBSCRIBE. A Ring's waiters always poll, so nothing is checked there.
func (s *Store) checkWake(ctx context.Context) []string {
	if s.hub.off {
		return nil
	}
	var warns []string
	bctx := s.clock.budget(ctx, s.timeout)
	if err := s.exec(bctx, nil, goredis.NewIntCmd(bctx, "publish", s.hub.channel, "")); err != nil {
		warns = append(warns, fmt.Sprintf("PUBLISH on %s failed (%v): repeats that wait for a first request (WithWait) are not woken by its keep or release, and claim again within a second", s.hub.channel, redisError(err)))
	}
	bctx = s.clock.budget(ctx, s.timeout)
	ps := s.client.Subscribe(bctx, s.hub.channel)
	_, err := ps.Receive(bctx)
	ps.Close()
	if err != nil {
		warns = append(warns, fmt.Sprintf("SUBSCRIBE to %s failed (%v): repeats that wait for a first request (WithWait) poll the store every 10 to 250 ms instead of being woken", s.hub.channel, redisError(err)))
	}
	return warns
}

// tooOld reports whether version names a Redis before 7.0. A version it
// cannot read is not refused: the claims will say.
func tooOld(version string) bool {
	major, _, _ := strings.Cut(version, ".")
	n, err := strconv.Atoi(major)
	return err == nil && n < 7
}

// shardWalker is a cluster client: it can visit the master of every shard.
type shardWalker interface {
	ForEachShard(ctx context.Context, fn func(ctx context.Context, node *goredis.Client) error) error
}

func nodeName(addr string) string {
	if addr == "" {
		return "server"
	}
	return addr
}

// checkNode asks one server for its settings.
func (s *Store) checkNode(ctx context.Context, c goredis.UniversalClient, addr string) (NodeReport, error) {
	n := NodeReport{Addr: addr}
	info, err := s.bounded(ctx, func(ctx context.Context) (any, error) {
		return c.Info(ctx, "server", "memory", "persistence").Result()
	})
	if err != nil {
		if denied(err) {
			return n, fmt.Errorf("%w: INFO (Check reads each server's settings with it) on %s: %w", ErrPermission, nodeName(addr), redisError(err))
		}
		return n, unavailable("check "+nodeName(addr), err)
	}
	fields := parseInfo(info.(string))
	n.MaxmemoryPolicy = fields["maxmemory_policy"]
	if n.MaxmemoryPolicy == "" {
		return n, unavailable("check "+nodeName(addr), errors.New("INFO has no maxmemory_policy"))
	}
	n.AOF = fields["aof_enabled"] == "1"
	n.Version = fields["redis_version"]
	save, err := s.bounded(ctx, func(ctx context.Context) (any, error) {
		return c.ConfigGet(ctx, "save").Result()
	})
	switch {
	case err != nil:
		n.RDBSave = "unknown"
	default:
		n.RDBSave = strings.TrimSpace(save.(map[string]string)["save"])
	}
	return n, nil
}

// bounded runs f within the call budget, returning on time whether or not
// go-redis honours the context's deadline.
func (s *Store) bounded(ctx context.Context, f func(context.Context) (any, error)) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if s.ctxTimeouts {
		return f(ctx)
	}
	return bounded(ctx, f)
}

func parseInfo(s string) map[string]string {
	m := make(map[string]string)
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m
}
