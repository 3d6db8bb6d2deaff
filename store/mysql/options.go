package mysql

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Defaults of the options.
const (
	// DefaultTable is the table's name when WithTable is not given.
	DefaultTable = "idemkey_records"
	// DefaultCallTimeout is the time budget of Claim, ClaimTx (the wait
	// for a free connection included), Complete, Release, Extend and
	// Begin when WithCallTimeout is not given.
	DefaultCallTimeout = 300 * time.Millisecond
	// DefaultCommitTimeout is the time budget of a request transaction's
	// Commit and Rollback when WithCommitTimeout is not given.
	DefaultCommitTimeout = time.Second
	// DefaultSweepInterval is how often a Store deletes expired rows when
	// WithSweepInterval is not given.
	DefaultSweepInterval = time.Minute
	// DefaultStartTimeout bounds New and Migrate when their context has
	// no deadline: a server that accepts the connection and never
	// answers fails start-up after it, rather than hang it.
	DefaultStartTimeout = 10 * time.Second
	// DefaultSweepBatch is how many expired rows one sweeping transaction
	// deletes at most when WithSweepBatch is not given.
	DefaultSweepBatch = 1000
)

// Option configures a Store (New) or names what Migrate creates. Options
// are applied in order; a later option of the same kind overrides an
// earlier one, and every invalid value (and every nil option) is reported
// in the error New returns.
type Option func(*config) error

type config struct {
	schema, table string // schema "" is the connection's database
	callTimeout   time.Duration
	commitTimeout time.Duration
	txOptions     *sql.TxOptions
	sweepInterval time.Duration
	sweepBatch    int
	// clientErrorWrites: a kept 4xx commits the handler's writes.
	clientErrorWrites bool
}

func defaultConfig() config {
	return config{
		table:         DefaultTable,
		callTimeout:   DefaultCallTimeout,
		commitTimeout: DefaultCommitTimeout,
		sweepInterval: DefaultSweepInterval,
		sweepBatch:    DefaultSweepBatch,
	}
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
		if !plainIdentifier(p) {
			return "", "", fmt.Errorf("table name %q: each part must be 1 to 64 lower-case letters, digits or underscores, not starting with a digit", name)
		}
	}
	if len(parts) == 2 {
		return parts[0], parts[1], nil
	}
	return "", parts[0], nil
}

func plainIdentifier(s string) bool {
	if s == "" || len(s) > 64 || ('0' <= s[0] && s[0] <= '9') {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// WithCallTimeout sets the time budget of every Claim, ClaimTx (the claim,
// and the wait for a free pool connection before it), Complete, Release,
// Extend and Begin: the call returns an error wrapping store.ErrUnavailable
// once d has passed, even when the server hangs (the driver then closes the
// connection the call was using). The caller's context still applies when
// its deadline is sooner. Default DefaultCallTimeout (300 ms); d must be
// positive.
func WithCallTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("call timeout %v, want > 0", d)
		}
		c.callTimeout = d
		return nil
	}
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
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("commit timeout %v, want > 0", d)
		}
		c.commitTimeout = d
		return nil
	}
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

// WithSweepInterval sets how often the Store deletes expired rows in the
// background (see Store.Sweep), starting one interval after New; Close
// stops it. Every instance of a service may sweep: batches skip rows
// another transaction holds. Default DefaultSweepInterval (1 minute); 0
// turns the background sweeper off (call Sweep yourself, for example from
// a scheduled job); negative is an error.
func WithSweepInterval(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("sweep interval %v, want >= 0", d)
		}
		c.sweepInterval = d
		return nil
	}
}

// WithSweepBatch sets how many expired rows one sweeping transaction
// deletes at most, so that a sweep never holds many row locks or a long
// transaction. Default DefaultSweepBatch (1000); n must be positive.
func WithSweepBatch(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("sweep batch %d, want >= 1", n)
		}
		c.sweepBatch = n
		return nil
	}
}

// WithClientErrorWrites sets what becomes of a handler's writes when it
// answers a 4xx that is kept (400, 404, 422 and the like; not the
// transient 408, 409, 425 and 429, which roll back like a 5xx). Clients
// read a 4xx as "nothing happened", so by default (false) the writes are
// undone: the request's transaction rolls back to a savepoint taken before
// the handler ran, then keeps the answer and commits. true commits them
// with the answer, for handlers that record something on purpose when
// they refuse (an audit row, a counter of failed attempts), and spares the
// savepoint's round trip on every claim. 2xx and 3xx answers always commit
// their writes.
func WithClientErrorWrites(commit bool) Option {
	return func(c *config) error {
		c.clientErrorWrites = commit
		return nil
	}
}
