package postgres

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkey/idemkey/internal/sqlcore"
)

// Defaults of the options.
const (
	// DefaultTable is the table's name when WithTable is not given.
	DefaultTable = "idemkey_records"
	// DefaultCallTimeout is the time budget of Claim, ClaimTx, Complete,
	// Release and Extend when WithCallTimeout is not given.
	DefaultCallTimeout = sqlcore.DefaultCallTimeout
	// DefaultCommitTimeout is the time budget of a request transaction's
	// Commit and Rollback when WithCommitTimeout is not given.
	DefaultCommitTimeout = sqlcore.DefaultCommitTimeout
	// DefaultSweepInterval is how often a Store deletes expired rows when
	// WithSweepInterval is not given.
	DefaultSweepInterval = sqlcore.DefaultSweepInterval
	// DefaultSweepBatch is how many expired rows one sweeping statement
	// deletes at most when WithSweepBatch is not given.
	DefaultSweepBatch = sqlcore.DefaultSweepBatch
	// DefaultStartTimeout bounds New, NewDB, Migrate and MigrateDB when
	// their context has no deadline (10 s): a server that accepts the
	// connection and never answers fails start-up instead of hanging it.
	DefaultStartTimeout = sqlcore.DefaultStartTimeout
)

// Option configures a Store (New) or names what Migrate creates. Options
// are applied in order; a later option of the same kind overrides an
// earlier one, and every invalid value (and every nil option) is reported
// in the error New returns.
type Option func(*config) error

type config struct {
	sqlcore.Config
	table     pgx.Identifier
	txOptions pgx.TxOptions
}

func defaultConfig() config {
	return config{
		Config:    sqlcore.Defaults(),
		table:     pgx.Identifier{DefaultTable},
		txOptions: pgx.TxOptions{IsoLevel: pgx.ReadCommitted},
	}
}

// WithTable sets the table the store keeps its rows in: a name, or a
// schema-qualified "schema.name", each part as PostgreSQL would fold it
// unquoted (letters, digits and underscores, not starting with a digit,
// at most 63 bytes; upper-case letters are refused rather than folded).
// Default DefaultTable ("idemkey_records", in the connection's search
// path). New checks that the table exists and has the schema's columns;
// Migrate and Schema make it.
func WithTable(name string) Option {
	return func(c *config) error {
		id, err := parseTable(name)
		if err != nil {
			return err
		}
		c.table = id
		return nil
	}
}

func parseTable(name string) (pgx.Identifier, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("table name %q: want name or schema.name", name)
	}
	for _, p := range parts {
		if !sqlcore.PlainIdentifier(p, 63) {
			return nil, fmt.Errorf("table name %q: each part must be 1 to 63 lower-case letters, digits or underscores, not starting with a digit", name)
		}
	}
	return pgx.Identifier(parts), nil
}

// WithCallTimeout sets the time budget of every Claim, ClaimTx (the claim,
// and the wait for a free pool connection before it), Complete, Release and
// Extend: the call returns an error wrapping store.ErrUnavailable once d has
// passed, even when the server hangs. pgx then closes the connection the
// call was using. The caller's context still applies when its deadline is
// sooner. Default DefaultCallTimeout (300 ms); d must be positive.
func WithCallTimeout(d time.Duration) Option {
	return func(c *config) error {
		return c.SetCallTimeout(d)
	}
}

// WithCommitTimeout sets the time budget of a request transaction's Commit
// (keeping the record and COMMIT, one round trip) and Rollback: past it the
// call returns an error wrapping store.ErrUnavailable and the connection is
// closed, which ends the transaction on the server. A Commit that ran out
// of time may still have committed: the middleware answers 503 and a retry
// finds the record or runs again. The caller's context still applies when
// its deadline is sooner. Default DefaultCommitTimeout (1 s); d must be
// positive.
func WithCommitTimeout(d time.Duration) Option {
	return func(c *config) error {
		return c.SetCommitTimeout(d)
	}
}

// WithTxOptions sets how a request's transaction begins: its isolation
// level, and whether it is deferrable. Default pgx.TxOptions{IsoLevel:
// pgx.ReadCommitted}. The zero IsoLevel begins with the server's
// default_transaction_isolation. The transaction writes the record, so a
// read-only AccessMode is refused; BeginQuery and CommitQuery are refused
// too, as the store writes its own BEGIN and COMMIT.
//
// Under RepeatableRead and Serializable the commit fails with a
// serialization error (the middleware answers 503, nothing is kept, and a
// retry runs again) when the claim's row changed after the transaction's
// first statement: when the claim was taken over, as it should, and when
// something extended the claim meanwhile (Store.Extend).
func WithTxOptions(o pgx.TxOptions) Option {
	return func(c *config) error {
		switch o.IsoLevel {
		case "", pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable, pgx.ReadUncommitted:
		default:
			return fmt.Errorf("isolation level %q is not one PostgreSQL knows", o.IsoLevel)
		}
		switch o.AccessMode {
		case "", pgx.ReadWrite:
		default:
			return errors.New("a request transaction writes the record: access mode must be read write")
		}
		switch o.DeferrableMode {
		case "", pgx.Deferrable, pgx.NotDeferrable:
		default:
			return fmt.Errorf("deferrable mode %q is not one PostgreSQL knows", o.DeferrableMode)
		}
		if o.BeginQuery != "" || o.CommitQuery != "" {
			return errors.New("BeginQuery and CommitQuery are not supported: the store writes its own BEGIN and COMMIT")
		}
		c.txOptions = o
		return nil
	}
}

// WithSweepInterval sets how often the Store deletes expired rows in the
// background (see Store.Sweep), starting one interval after New; Close
// stops it. Every instance of a service may sweep: batches skip rows
// another instance is deleting. Default DefaultSweepInterval (1 minute);
// 0 turns the background sweeper off (call Sweep yourself, for example
// from a scheduled job); negative is an error.
func WithSweepInterval(d time.Duration) Option {
	return func(c *config) error {
		return c.SetSweepInterval(d)
	}
}

// WithSweepBatch sets how many expired rows one sweeping statement deletes
// at most: each batch is a statement, and a transaction, of its own, so
// that a sweep never holds many row locks or a long transaction. Default
// DefaultSweepBatch (1000); n must be positive.
func WithSweepBatch(n int) Option {
	return func(c *config) error {
		return c.SetSweepBatch(n)
	}
}

// WithClientErrorWrites sets what becomes of a handler's writes when it
// answers a 4xx that is kept (400, 404, 422 and the like; not the
// transient 408, 409, 425 and 429, which roll back like a 5xx). Clients
// read a 4xx as "nothing happened", so by default (false) the writes are
// undone: the request's transaction rolls back, and the answer is then
// kept in a statement of its own, fenced as the claim was (no
// subtransaction is opened for it; a request that took the key in between
// wins, and the 4xx is not kept: its client gets 503). true commits them
// with the answer, for handlers that record something on purpose when
// they refuse (an audit row, a counter of failed attempts). 2xx and 3xx
// answers always commit their writes.
func WithClientErrorWrites(commit bool) Option {
	return func(c *config) error {
		c.ClientErrorWrites = commit
		return nil
	}
}
