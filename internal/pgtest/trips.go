package pgtest

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// Trips is a pgx tracer (pgx.ConnConfig.Tracer) that counts the round
// trips pgx makes: each query (Exec, Query, QueryRow), each batch (one
// pipeline) and each prepare is one. A pooler or proxy between pgx and the
// server does not change the count.
type Trips struct{ n atomic.Int64 }

// Count returns the round trips counted so far.
func (c *Trips) Count() int64 { return c.n.Load() }

func (c *Trips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *Trips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *Trips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *Trips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *Trips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (c *Trips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *Trips) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

var (
	_ pgx.QueryTracer   = (*Trips)(nil)
	_ pgx.BatchTracer   = (*Trips)(nil)
	_ pgx.PrepareTracer = (*Trips)(nil)
)
