package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
	"github.com/idemkey/idemkey/store/postgres"
	"github.com/idemkey/idemkey/store/redis"
)

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1 // not found, declined, or failed
	exitUsage = 2
)

// defaultURL is the server when neither --redis nor REDIS_URL names one.
const defaultURL = "redis://127.0.0.1:6379/0"

// env holds what every command needs: the store, a Redis or a PostgreSQL
// one, looked into through store.Inspector, opened by parseFlags once the
// command's flags are read.
type env struct {
	flags  globals
	st     store.Inspector
	prefix string                  // --redis-prefix: what the service gave redis.WithKeyPrefix
	rdb    goredis.UniversalClient // the Redis store's client; nil for a database
	table  string                  // the PostgreSQL store's table, quoted; "" for Redis
	// scanCount and scanSample are stats's --count and --sample, for
	// redis.WithScan.
	scanCount, scanSample int64
	json                  bool
	stdin                 io.Reader
	stdout                io.Writer
	stderr                io.Writer
	closers               []func() // run after the command, last first
}

// globals are the flags that choose the store and shape the output. They
// are accepted before the command and after it, among its own flags
// (idemctl --redis URL show ... and idemctl show --redis URL ... alike).
type globals struct {
	url, dbURL, table string
	prefix            string
	cluster, json     bool
	timeout           time.Duration
}

func defaultGlobals() globals {
	return globals{table: postgres.DefaultTable, timeout: 30 * time.Second}
}

// register adds the global flags to fs, each with its current value as
// its default, so that a value given before the command stays unless the
// command's flags give another.
func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.url, "redis", g.url, "Redis URL; default $REDIS_URL, else "+defaultURL)
	fs.BoolVar(&g.cluster, "cluster", g.cluster, "the URL names a Redis Cluster node")
	fs.StringVar(&g.prefix, "redis-prefix", g.prefix, "the key prefix the service gives redis.WithKeyPrefix; default none")
	fs.StringVar(&g.dbURL, "database-url", g.dbURL, "PostgreSQL URL of a store/postgres table (or mysql:// URL of a store/mysql one); default $DATABASE_URL when --redis and $REDIS_URL are not set")
	fs.StringVar(&g.table, "table", g.table, "the database store's table (name, or schema.name on PostgreSQL)")
	fs.BoolVar(&g.json, "json", g.json, "print JSON")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "how long the whole command may take")
}

// errUsage marks an error the user can fix by calling idemctl differently.
var errUsage = errors.New("usage")

// errNotDone marks an outcome that is not a failure of idemctl but still
// exits 1: the key is not there, or the deletion was declined.
var errNotDone = errors.New("not done")

const usage = `usage: idemctl [--redis URL [--cluster] [--redis-prefix P] | --database-url URL [--table NAME]] [--json] [--timeout D] <command> [flags]

commands:
  show   --scope S --key K | --digest HEX [--body]   show what a key holds
  delete --scope S --key K | --digest HEX [--yes]    delete a key, after asking
  stats  [--count N] [--sample N]                    count records and claims, report memory (Redis),
                                                     the table's size and vacuum state (PostgreSQL)
                                                     or the table's size (MySQL, MariaDB)

The flags before the command may also come after it.
Run "idemctl <command> --help" for a command's flags.
`

// run is idemctl with its arguments (without the program name) and its
// standard streams; it returns the exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("idemctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage+"\nflags:\n")
		fs.PrintDefaults()
	}
	e := &env{flags: defaultGlobals(), stdin: stdin, stdout: stdout, stderr: stderr}
	e.flags.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	var f func(context.Context, *env, []string) error
	switch cmd {
	case "show":
		f = show
	case "delete":
		f = del
	case "stats":
		f = stats
	default:
		fmt.Fprintf(stderr, "idemctl: unknown command %q\n%s", cmd, usage)
		return exitUsage
	}
	defer e.close()

	switch err := f(ctx, e, rest); {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "idemctl %s: %v\n", cmd, err)
		return exitUsage
	case errors.Is(err, errNotDone):
		return exitFail
	default:
		fmt.Fprintf(stderr, "idemctl %s: %v\n", cmd, err)
		return exitFail
	}
}

// connect builds the client for url: a standalone server, or a Cluster. A
// command is one person's request: it retries a failed command once and
// dials at most twice, rather than go-redis's defaults (3 retries, 5 dials).
func connect(url string, cluster bool) (goredis.UniversalClient, error) {
	if cluster {
		o, err := goredis.ParseClusterURL(url)
		if err != nil {
			return nil, fmt.Errorf("--redis: %w", err)
		}
		o.ContextTimeoutEnabled, o.MaxRetries, o.DialerRetries = true, 1, 2
		return goredis.NewClusterClient(o), nil
	}
	o, err := goredis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("--redis: %w", err)
	}
	o.ContextTimeoutEnabled, o.MaxRetries, o.DialerRetries = true, 1, 2
	return goredis.NewClient(o), nil
}

// open applies --timeout to ctx and connects to the store the global
// flags name.
func (e *env) open(ctx context.Context) (context.Context, error) {
	g := &e.flags
	e.json = g.json
	if g.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.timeout)
		e.closers = append(e.closers, cancel)
	}
	pgURL, err := chooseStore(g.url, g.dbURL, g.cluster)
	if err != nil {
		return ctx, err
	}
	if pgURL != "" && g.prefix != "" {
		return ctx, fmt.Errorf("%w: --redis-prefix is for a Redis store, not a database", errUsage)
	}
	if isMySQL(pgURL) {
		st, closeDB, err := connectMySQL(ctx, pgURL, g.table)
		if err != nil {
			return ctx, err
		}
		e.closers = append(e.closers, closeDB)
		e.st, e.table = st, st.Table()
		return ctx, nil
	}
	if pgURL != "" {
		st, closeDB, err := connectPostgres(ctx, pgURL, g.table)
		if err != nil {
			return ctx, err
		}
		e.closers = append(e.closers, closeDB)
		e.st, e.table = st, st.Table()
		return ctx, nil
	}
	if err := redis.ValidateKeyPrefix(g.prefix); err != nil {
		return ctx, fmt.Errorf("%w: --redis-prefix: %w", errUsage, err)
	}
	e.prefix = g.prefix
	url := g.url
	if url == "" {
		url = os.Getenv("REDIS_URL")
	}
	if url == "" {
		url = defaultURL
	}
	rdb, err := connect(url, g.cluster)
	if err != nil {
		return ctx, fmt.Errorf("%w: %w", errUsage, err)
	}
	e.closers = append(e.closers, func() { rdb.Close() })
	e.rdb = rdb
	opts := []redis.Option{redis.WithKeyPrefix(g.prefix)}
	if e.scanCount > 0 {
		opts = append(opts, redis.WithScan(e.scanCount, e.scanSample))
	}
	st, err := redis.New(rdb, opts...)
	if err != nil {
		return ctx, err
	}
	e.st = st
	return ctx, nil
}

// close undoes what open did.
func (e *env) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
	e.closers = nil
}

// commandFlags makes the flag set of a command, with the global flags
// (see globals).
func commandFlags(e *env, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("idemctl "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	e.flags.register(fs)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "usage: idemctl %s %s\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses a command's flags, refuses stray arguments, runs the
// command's own checks of its flags, and then opens the store (see
// env.open): it returns the context the command runs in.
func parseFlags(ctx context.Context, e *env, fs *flag.FlagSet, args []string, checks ...func() error) (context.Context, error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ctx, err
		}
		return ctx, fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return ctx, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	for _, check := range checks {
		if err := check(); err != nil {
			return ctx, err
		}
	}
	return e.open(ctx)
}

// keyFlags adds --scope, --key and --digest to fs; the returned function
// gives the store key they name.
func keyFlags(fs *flag.FlagSet) func() (string, error) {
	sc := fs.String("scope", "", `the caller's scope (its user id; "anonymous" on open routes)`)
	key := fs.String("key", "", "the Idempotency-Key the client sent")
	digest := fs.String("digest", "", "the key digest from the logs (64 hex digits), instead of --scope and --key")
	return func() (string, error) {
		switch {
		case *digest != "" && (*sc != "" || *key != ""):
			return "", fmt.Errorf("%w: give --digest, or --scope and --key, not both", errUsage)
		case *digest != "":
			return keyOfDigest(*digest)
		case *sc == "" || *key == "":
			return "", fmt.Errorf("%w: give --scope and --key (the scope of open routes is \"anonymous\"), or --digest", errUsage)
		}
		return store.KeyName(*sc, *key), nil
	}
}

// keyOfDigest returns the store key whose digest is d.
func keyOfDigest(d string) (string, error) {
	d = strings.ToLower(strings.TrimSpace(d))
	if b, err := hex.DecodeString(d); err != nil || len(b) != 32 {
		return "", fmt.Errorf("%w: --digest must be 64 hex digits", errUsage)
	}
	name := store.KeyPrefix + "{" + d + "}"
	if store.DigestOf(name) != d {
		return "", fmt.Errorf("%w: --digest %q does not make a store key", errUsage, d)
	}
	return name, nil
}

// printJSON writes v as indented JSON.
func (e *env) printJSON(v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
