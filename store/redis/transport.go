package redis

import (
	"context"

	goredis "github.com/redis/go-redis/v9"
)

// The transport under every store call: sending a command within its
// budget, whether or not the client stops at a context's deadline, and
// through the automatic pipeline when WithAutoPipeline is on.

// contextTimeouts reports whether client says it stops socket reads and
// writes at a context's deadline, through the Options method of the
// go-redis clients (which a wrapper that embeds one has too). A client
// that does not say is taken not to.
func contextTimeouts(client goredis.UniversalClient) bool {
	switch c := client.(type) {
	case clientOptions:
		return c.Options().ContextTimeoutEnabled
	case clusterOptions:
		return c.Options().ContextTimeoutEnabled
	case ringOptions:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// The go-redis clients' Options methods, which tell ContextTimeoutEnabled.
type (
	clientOptions  interface{ Options() *goredis.Options }
	clusterOptions interface {
		Options() *goredis.ClusterOptions
	}
	ringOptions interface{ Options() *goredis.RingOptions }
)

// processor sends a command: the client, or a connection pinned for WAIT.
type processor interface {
	Process(ctx context.Context, cmd goredis.Cmder) error
}

// exec sends cmd, through conn when it is not nil (a connection pinned for
// WAIT), and returns its error once it is answered or ctx (a call's
// budget) is done, whichever comes first. After an error of ctx, cmd may
// still be in flight: do not read it.
func (s *Store) exec(ctx context.Context, conn *goredis.Conn, cmd goredis.Cmder) error {
	var p processor = s.client
	switch {
	case conn != nil:
		p = conn
	case s.ap != nil:
		// The pipeliner runs the command on its own context: wait for it
		// no longer than the budget.
		return s.ap.Submit(ctx, cmd).WaitContext(ctx)
	}
	if s.ctxTimeouts {
		p.Process(ctx, cmd)
		if err := cmd.Err(); err != nil {
			return s.unreached(err)
		}
		return nil
	}
	_, err := bounded(ctx, func(ctx context.Context) (any, error) {
		p.Process(ctx, cmd)
		return nil, cmd.Err()
	})
	if err != nil {
		return s.unreached(err)
	}
	return nil
}

// bounded runs f and returns its answer, or ctx's error as soon as ctx is
// done, for clients that would otherwise block on a socket past the
// deadline. An abandoned f finishes in the background.
func bounded(ctx context.Context, f func(context.Context) (any, error)) (any, error) {
	type answer struct {
		v   any
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		v, err := f(ctx)
		ch <- answer{v, err}
	}()
	select {
	case a := <-ch:
		return a.v, a.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
