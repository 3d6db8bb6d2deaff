package mysql

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkey/idemkey/internal/sqlcore"
)

// DefaultTable names the store's table when WithTable is not given.
const DefaultTable = "idemkey_records"

// The time budgets, and the sweeper's settings, when their option is not
// given: DefaultCallTimeout (300 ms) bounds each Claim, ClaimTx (its wait
// for a free pool connection too), Complete, Release, Extend and Begin;
// DefaultCommitTimeout (1 s) each request transaction's Commit and
// Rollback; DefaultStartTimeout (10 s) New and Migrate when their context
// has no deadline (a server that takes the connection and never answers
// fails start-up, rather than hang it). The sweeper runs every
// DefaultSweepInterval (1 minute), DefaultSweepBatch (1000) rows to a
// transaction at most.
const (
	DefaultCallTimeout, DefaultCommitTimeout, DefaultStartTimeout = sqlcore.DefaultCallTimeout, sqlcore.DefaultCommitTimeout, sqlcore.DefaultStartTimeout
	DefaultSweepInterval, DefaultSweepBatch                       = sqlcore.DefaultSweepInterval, sqlcore.DefaultSweepBatch
)

// An Option configures New, or names the table Migrate makes. They apply
// in order, a later one overriding an earlier one of its kind; New (and
// Migrate) report every invalid value, and every nil Option, in one
// error.
type Option func(*config) error

type config struct {
	sqlcore.Config
	schema, table string // schema "" is the connection's database
	txOptions     *sql.TxOptions
}

func defaultConfig() config {
	return config{Config: sqlcore.Defaults(), table: DefaultTable}
}

// WithTable sets the table the store keeps its rows in: a name, or a
// database-qualified "database.name", each part 1 to 64 lower-case
// letters, digits or underscores, not starting with a digit. Default
// DefaultTable ("idemkey_records", in the connection's database). New
// checks that the table exists and has the schema's columns; Migrate and
// Schema make it.
func WithTable(name string) Option {
	return func(c *config) error {
		schema, table, err := parseTable(name)
		if err != nil {
			return err
		}
		c.schema, c.table = schema, table
		return nil
	}
}

func parseTable(name string) (schema, table string, err error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", "", fmt.Errorf("table name %q: want name or database.name", name)
	}
	for _, p := range parts {
		if !sqlcore.PlainIdentifier(p, 64) {
			return "", "", fmt.Errorf("table name %q: each part must be 1 to 64 lower-case letters, digits or underscores, not starting with a digit", name)
		}
	}
	if len(parts) == 2 {
		return parts[0], parts[1], nil
	}
	return "", parts[0], nil
}

// WithCallTimeout sets the time budget of every Claim, ClaimTx (the claim,
// and the wait for a free pool connection before it), Complete, Release,
// Extend and Begin: the call returns an error wrapping store.ErrUnavailable
// once d has passed, even when the server hangs (the driver then closes the
// connection the call was using). The caller's context still applies when
// its deadline is sooner. Default DefaultCallTimeout (300 ms); d must be
// positive.
func WithCallTimeout(d time.Duration) Option {
	return func(c *config) error { return c.SetCallTimeout(d) }
}

// WithCommitTimeout sets the time budget of a request transaction's Commit
// (keeping the record and COMMIT) and Rollback: past it the call returns
// an error wrapping store.ErrUnavailable and the connection is closed and
// its session killed, which ends the transaction on the server. A Commit
// that ran out of time may still have committed: the middleware answers
// 503 and a retry finds the record or runs again. The caller's context
// still applies when its deadline is sooner. Default DefaultCommitTimeout
// (1 s); d must be positive.
func WithCommitTimeout(d time.Duration) Option {
	return func(c *config) error { return c.SetCommitTimeout(d) }
}

// WithTxOptions sets how a request's transaction begins: its isolation
// level. Default nil: the server's (transaction_isolation; REPEATABLE READ
// unless configured otherwise), which costs no statement of its own; an
// explicit level costs the driver one more round trip per transaction (SET
// TRANSACTION ISOLATION LEVEL before START TRANSACTION). The levels are
// sql.LevelDefault, LevelReadUncommitted, LevelReadCommitted,
// LevelRepeatableRead and LevelSerializable. The transaction writes the
// record, so ReadOnly is refused. The options are copied.
func WithTxOptions(o *sql.TxOptions) Option {
	return func(c *config) error {
		if o == nil {
			c.txOptions = nil
			return nil
		}
		switch o.Isolation {
		case sql.LevelDefault, sql.LevelReadUncommitted, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable:
		default:
			return fmt.Errorf("isolation level %v is not one MySQL has", o.Isolation)
		}
		if o.ReadOnly {
			return errors.New("a request transaction writes the record: it cannot be read-only")
		}
		if o.Isolation == sql.LevelDefault {
			c.txOptions = nil
			return nil
		}
		cp := *o
		c.txOptions = &cp
		return nil
	}
}

// WithSweepInterval sets the period of the background sweeper, which
// deletes rows past their life (Store.Sweep) from one period after New
// until Close. Sweepers of several instances do not get in each other's
// way: each batch skips rows locked by another transaction. 0 turns it
// off, for services that call Sweep on a schedule of their own; a
// negative d is refused. Default DefaultSweepInterval (1 minute).
func WithSweepInterval(d time.Duration) Option {
	return func(c *config) error { return c.SetSweepInterval(d) }
}

// WithSweepBatch bounds the rows one sweeping transaction deletes (n, at
// least 1; default DefaultSweepBatch, 1000): a sweep is a series of such
// short transactions, never one that locks many rows for long.
func WithSweepBatch(n int) Option {
	return func(c *config) error { return c.SetSweepBatch(n) }
}

// WithClientErrorWrites decides whether a kept 4xx answer (400, 404, 422,
// ...; the transient 408, 409, 425 and 429 roll back as a 5xx does) also
// commits what the handler wrote. By default (false) it does not, as a
// client takes a 4xx to mean that nothing happened: the writes are rolled
// back and the answer kept. true keeps them with the answer, for handlers
// that write on purpose when they refuse (an audit row, a count of failed
// attempts). 2xx and 3xx answers commit their writes either way.
func WithClientErrorWrites(commit bool) Option {
	return func(c *config) error {
		c.ClientErrorWrites = commit
		return nil
	}
}
