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

// env holds what every command needs: a Redis client, or a PostgreSQL
// store.
type env struct {
	rdb    goredis.UniversalClient
	prefix string // --redis-prefix: what the service gave redis.WithKeyPrefix
	pg     *postgres.Store
	json   bool
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
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
  stats  [--count N] [--sample N]                    count records and claims, report memory (Redis)
                                                     or the table's size and vacuum state (PostgreSQL)

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
	url := fs.String("redis", "", "Redis URL; default $REDIS_URL, else "+defaultURL)
	cluster := fs.Bool("cluster", false, "the URL names a Redis Cluster node")
	prefix := fs.String("redis-prefix", "", "the key prefix the service gives redis.WithKeyPrefix; default none")
	dbURL := fs.String("database-url", "", "PostgreSQL URL of a store/postgres table; default $DATABASE_URL when --redis and $REDIS_URL are not set")
	table := fs.String("table", postgres.DefaultTable, "the PostgreSQL store's table (name or schema.name)")
	asJSON := fs.Bool("json", false, "print JSON")
	timeout := fs.Duration("timeout", 30*time.Second, "how long the whole command may take")
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

	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	e := &env{json: *asJSON, stdin: stdin, stdout: stdout, stderr: stderr}
	switch pgURL, err := chooseStore(*url, *dbURL, *cluster); {
	case err != nil:
		fmt.Fprintf(stderr, "idemctl: %v\n", err)
		return exitUsage
	case pgURL != "":
		st, closeDB, err := connectPostgres(ctx, pgURL, *table)
		if err != nil {
			fmt.Fprintf(stderr, "idemctl: %v\n", err)
			if errors.Is(err, errUsage) {
				return exitUsage
			}
			return exitFail
		}
		defer closeDB()
		e.pg = st
	case *prefix != "" && pgURL != "":
		fmt.Fprintln(stderr, "idemctl: --redis-prefix is for a Redis store, not PostgreSQL")
		return exitUsage
	default:
		if err := redis.ValidateKeyPrefix(*prefix); err != nil {
			fmt.Fprintf(stderr, "idemctl: --redis-prefix: %v\n", err)
			return exitUsage
		}
		e.prefix = *prefix
		if *url == "" {
			*url = os.Getenv("REDIS_URL")
		}
		if *url == "" {
			*url = defaultURL
		}
		rdb, err := connect(*url, *cluster)
		if err != nil {
			fmt.Fprintf(stderr, "idemctl: %v\n", err)
			return exitUsage
		}
		defer rdb.Close()
		e.rdb = rdb
	}

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

// commandFlags makes the flag set of a command, with --json, which it ORs
// into e.json after parsing.
func commandFlags(e *env, name, synopsis string) (*flag.FlagSet, *bool) {
	fs := flag.NewFlagSet("idemctl "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "usage: idemctl %s %s\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs, asJSON
}

// parseFlags parses a command's flags and refuses stray arguments.
func parseFlags(e *env, fs *flag.FlagSet, asJSON *bool, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	e.json = e.json || *asJSON
	return nil
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
