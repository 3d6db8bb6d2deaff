package main

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// trips is a pgx tracer (pgx.ConnConfig.Tracer) that counts the round
// trips pgx makes: each query (Exec, Query, QueryRow), each batch (one
// pipeline) and each prepare is one. A pooler or proxy between pgx and the
// server does not change the count.
type trips struct{ n atomic.Int64 }

// Count returns the round trips counted so far.
func (c *trips) Count() int64 { return c.n.Load() }

func (c *trips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *trips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *trips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *trips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *trips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (c *trips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *trips) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

var (
	_ pgx.QueryTracer   = (*trips)(nil)
	_ pgx.BatchTracer   = (*trips)(nil)
	_ pgx.PrepareTracer = (*trips)(nil)
)
