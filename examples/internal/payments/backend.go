package payments

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/memory"
	"github.com/idemkey/idemkey/store/postgres"
	idemredis "github.com/idemkey/idemkey/store/redis"
)

// RedisPoolSize is the connection pool of the Redis client when REDIS_URL
// does not set pool_size: room for 128 requests at once, where go-redis's
// default (10 per CPU) would make a burst of concurrent requests wait for
// connections.
const RedisPoolSize = 128

// PostgresPoolSize is the connection pool of the PostgreSQL store when
// DATABASE_URL does not set pool_max_conns: a payment holds a connection
// for its handler's whole run, so this is how many payments one instance
// makes at once (a request that finds none free within the store's budget
// is answered 503). Two instances at this size stay under PostgreSQL's
// default max_connections (100).
const PostgresPoolSize = 32

// StartTimeout bounds how long OpenBackend waits for Redis or PostgreSQL
// to answer at start.
const StartTimeout = 5 * time.Second

// Backend is the idempotency store the service runs on, with what the
// service needs around it.
type Backend struct {
	// Store keeps the claims and records.
	Store store.Store
	// Name says which store it is: "memory", "redis", "redis-cluster",
	// "postgres" or "mysql".
	Name string
	// book is where the payments go when they share the store's
	// database (DATABASE_URL): nil keeps them in the process's memory.
	book paymentBook
	// Ping reports whether the store answers; nil for the in-memory store,
	// which always does.
	Ping func(context.Context) error
	// Close releases the store (the janitor of the in-memory store, the
	// Redis client's connections).
	Close func() error
}

// OpenBackend opens the store cfg selects: PostgreSQL when DatabaseURL is
// set, a Redis Cluster when RedisClusterAddrs is set, a standalone Redis
// when RedisURL is set, and otherwise the embedded in-memory store. Its
// first log line names the store. A Redis store must answer within
// StartTimeout and is checked at once (see store/redis.Store.Check): a
// server whose maxmemory-policy could evict claims is an error, a server
// without persistence a warning. A PostgreSQL database must answer within
// StartTimeout; the service creates its tables there when they are
// missing.
func OpenBackend(ctx context.Context, cfg Config, logger *slog.Logger) (*Backend, error) {
	var (
		client goredis.UniversalClient
		name   string
	)
	switch {
	case strings.HasPrefix(cfg.DatabaseURL, "mysql://"):
		return openMySQL(ctx, cfg.DatabaseURL, logger)
	case cfg.DatabaseURL != "":
		return openPostgres(ctx, cfg.DatabaseURL, logger)
	case len(cfg.RedisClusterAddrs) > 0:
		name = "redis-cluster"
		logger.Info("idempotency store", "store", name, "addrs", strings.Join(cfg.RedisClusterAddrs, ","))
		client = goredis.NewClusterClient(&goredis.ClusterOptions{
			Addrs:                 cfg.RedisClusterAddrs,
			ContextTimeoutEnabled: true,
			PoolSize:              RedisPoolSize,
		})
	case cfg.RedisURL != "":
		opts, err := goredis.ParseURL(cfg.RedisURL)
		if err != nil {
			// The URL may hold a password: do not repeat it.
			return nil, errors.New("REDIS_URL is not a valid redis:// URL")
		}
		name = "redis"
		logger.Info("idempotency store", "store", name, "addr", opts.Addr, "db", opts.DB)
		opts.ContextTimeoutEnabled = true
		if opts.PoolSize == 0 {
			opts.PoolSize = RedisPoolSize
		}
		client = goredis.NewClient(opts)
	default:
		logger.Info("idempotency store", "store", "memory",
			"note", "keys live in this process only; set REDIS_URL or DATABASE_URL to share them between instances")
		st, err := memory.New()
		if err != nil {
			return nil, err
		}
		return &Backend{Store: st, Name: "memory", Close: st.Close}, nil
	}

	// go-redis logs what it meets (a refused dial, a reconnect) through a
	// process-wide logger of its own, as plain text: route it into the
	// service's structured log.
	goredis.SetLogger(redisLog{logger.With("component", "go-redis")})
	st, err := idemredis.New(client)
	if err != nil {
		client.Close()
		return nil, err
	}
	// Connect to every node before the first request, with more time than
	// a store call's budget: the first call to a node dials it (and a
	// cluster client first learns the slots), and on a busy machine that
	// alone can exceed the budget and answer 503.
	ping := pinger(client)
	wctx, cancel := context.WithTimeout(ctx, StartTimeout)
	err = ping(wctx)
	cancel()
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("the Redis server does not answer: %w", err)
	}
	// Each of Check's questions has the store's call budget (300 ms): on a
	// machine busy starting many things at once, one can miss it. Ask
	// again while the start budget lasts; a server that does not answer,
	// or refuses, still fails the start.
	cctx, cancel := context.WithTimeout(ctx, StartTimeout)
	rep, err := st.Check(cctx)
	for errors.Is(err, store.ErrUnavailable) && cctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
		rep, err = st.Check(cctx)
	}
	cancel()
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("checking the Redis server: %w", err)
	}
	// What Check found unsafe but not refused: persistence off, waiters
	// that cannot be woken, an eviction policy under WithEvictionWarning.
	for _, w := range rep.Warnings {
		logger.Warn("Redis: " + w)
	}
	return &Backend{Store: st, Name: name, Ping: ping, Close: client.Close}, nil
}

// pinger returns a function that PINGs the server, or every master of a
// cluster.
func pinger(client goredis.UniversalClient) func(context.Context) error {
	if cc, ok := client.(*goredis.ClusterClient); ok {
		return func(ctx context.Context) error {
			return cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
				return c.Ping(ctx).Err()
			})
		}
	}
	return func(ctx context.Context) error { return client.Ping(ctx).Err() }
}

// openPostgres opens the PostgreSQL store and the payments table on url.
func openPostgres(ctx context.Context, url string, logger *slog.Logger) (*Backend, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// The URL may hold a password: do not repeat it.
		return nil, errors.New("DATABASE_URL is not a valid postgres:// URL")
	}
	if !strings.Contains(url, "pool_max_conns") {
		pcfg.MaxConns = PostgresPoolSize
	}
	logger.Info("idempotency store", "store", "postgres", "host", pcfg.ConnConfig.Host, "port", pcfg.ConnConfig.Port,
		"database", pcfg.ConnConfig.Database, "pool", pcfg.MaxConns,
		"note", "payments and idempotency records commit together")
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	err = pool.Ping(wctx)
	if err == nil {
		err = postgres.Migrate(wctx, pool)
	}
	if err == nil {
		err = createPayments(wctx, pool)
	}
	var st *postgres.Store
	if err == nil {
		st, err = postgres.New(wctx, pool)
	}
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL: %w", err)
	}
	return &Backend{
		Store: st,
		Name:  "postgres",
		book:  dbPayments{pool},
		Ping:  pool.Ping,
		Close: func() error {
			st.Close()
			pool.Close()
			return nil
		},
	}, nil
}

// redisLog is go-redis's logger, writing to a slog.Logger: each line
// go-redis prints is a warning (it logs what went wrong: dials, pool
// and cluster trouble), with its request's context.
type redisLog struct{ l *slog.Logger }

func (r redisLog) Printf(ctx context.Context, format string, v ...any) {
	r.l.WarnContext(ctx, fmt.Sprintf(format, v...))
}
