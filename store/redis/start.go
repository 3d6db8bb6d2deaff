package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
)

// Start-up: what New and Check ask the server before a Store serves, and
// how long they may take.

// DefaultStartTimeout bounds New and Check, all their round trips
// together, when the caller's context has no deadline and
// WithStartTimeout is not given. Each round trip is bounded by the call
// budget (WithCallTimeout) as well.
const DefaultStartTimeout = 5 * time.Second

// startContext returns the context New and Check run under: ctx, bounded
// by the start budget when it has no deadline of its own.
func (s *Store) startContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.startTimeout)
}

// start checks, for New, that the client's user may run every command the
// store sends (see checkAccess), on every master. A server out of memory
// cannot take the probe's writes: New then logs at Warn level with
// log/slog's default logger that the check could not be made, and
// succeeds.
func (s *Store) start(ctx context.Context) error {
	ctx, cancel := s.startContext(ctx)
	defer cancel()
	warn, err := s.checkAccess(ctx)
	if err != nil {
		return fmt.Errorf("idemkey: redis: new: %w", err)
	}
	if warn != "" {
		slog.Default().Warn("idemkey: redis: new: "+warn, "server", serverName(s.client))
	}
	return nil
}

// serverName names the server or servers client talks to, for errors: the
// address of a standalone client, the seed addresses of a cluster or the
// shards of a ring; "the Sentinel master" for a failover client (whose
// master moves), and "the server" for a client that does not say.
func serverName(client goredis.UniversalClient) string {
	switch c := client.(type) {
	case clientOptions:
		if addr := c.Options().Addr; addr != "" && addr != "FailoverClient" {
			return addr
		}
		return "the Sentinel master"
	case clusterOptions:
		return "cluster " + strings.Join(c.Options().Addrs, ",")
	case ringOptions:
		return "ring " + strings.Join(slices.Sorted(maps.Values(c.Options().Addrs)), ",")
	}
	return "the server"
}

// unreachable reports whether err says the server could not be reached
// at all: the connection could not be made (refused, timed out, no route)
// or its host could not be resolved, or the call's budget ran out while
// the client's dials failed (errUnreached). A command sent on a
// connection that was made is not this, whatever became of it, nor is a
// full pool.
//
// go-redis retries a command on a new connection after its connection
// failed (up to MaxRetries): a call whose last tries could not dial may
// have reached the server on an earlier try, on a pooled connection that
// was lost after the command was written.
func unreachable(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns) || errors.Is(err, errUnreached)
}

// errUnreached joins the error of a call whose budget ran out while the
// client's dials failed: go-redis dials on goroutines of its own, retries
// a failed dial, and reports to the call only that its time ran out.
var errUnreached = errors.New("no connection to the server could be made")

// dialWatch is the hook New adds to the client (and to each node a
// cluster client makes from then on): it notes when the client's last
// dial failed and when its last dial succeeded, Unix nanoseconds, as
// go-redis reports them to its dial hooks. It changes nothing.
type dialWatch struct {
	failed, made atomic.Int64
}

func (w *dialWatch) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			w.failed.Store(time.Now().UnixNano())
		} else {
			w.made.Store(time.Now().UnixNano())
		}
		return conn, err
	}
}

func (*dialWatch) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }

func (*dialWatch) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// watchDials adds a dialWatch to client and returns it.
func watchDials(client goredis.UniversalClient) *dialWatch {
	w := new(dialWatch)
	client.AddHook(w)
	if c, ok := client.(interface{ OnNewNode(func(*goredis.Client)) }); ok {
		// A cluster client dials through its nodes' own hooks.
		c.OnNewNode(func(node *goredis.Client) { node.AddHook(w) })
	}
	return w
}

// unreached returns err, joined with errUnreached when err is the end of
// the call's time (its budget or its context's deadline) and the client's
// dials have failed since the call began (budget ago at most), with none
// made since the last failure.
func (s *Store) unreached(err error) error {
	if s.dials == nil || !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) || errors.Is(err, goredis.ErrPoolTimeout) {
		return err
	}
	failed, made := s.dials.failed.Load(), s.dials.made.Load()
	if failed <= made || time.Since(time.Unix(0, failed)) > s.timeout {
		return err
	}
	return fmt.Errorf("%w (%w)", err, errUnreached)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// unavailable wraps a backend failure so that errors.Is finds both
// store.ErrUnavailable and the cause, and store.ErrUnreachable too when
// the server could not be reached at all.
func unavailable(op string, err error) error {
	if unreachable(err) {
		return fmt.Errorf("idemkey: redis: %s: %w: %w", op, store.ErrUnreachable, err)
	}
	return fmt.Errorf("idemkey: redis: %s: %w: %w", op, store.ErrUnavailable, err)
}
