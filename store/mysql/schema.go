package mysql

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/idemkey/idemkey/internal/sqlcore"
)

// SchemaSQL is the table the store needs, as schema.sql in this package
// holds it, under DefaultTable: one CREATE TABLE IF NOT EXISTS statement
// that a migration tool can apply as it is.
//
//go:embed schema.sql
var SchemaSQL string

// indexSuffix names the table's index: "<table>_expires_us".
const indexSuffix = "_expires_us"

// columns are the table's columns; New checks that the table has them all.
const columns = "k, token, fingerprint, raw_digest, created_us, expires_us, status, header, body, body_omitted, completed_us"

// Schema returns SchemaSQL for the table named as WithTable takes it
// ("name" or "database.name"), with its index named "<name>_expires_us".
// The statement uses IF NOT EXISTS: applying it to a database that has the
// table changes nothing.
func Schema(table string) (string, error) {
	schema, name, err := parseTable(table)
	if err != nil {
		return "", fmt.Errorf("idemkey: mysql: %w", err)
	}
	return schemaFor(schema, name), nil
}

func schemaFor(schema, table string) string {
	if schema == "" && table == DefaultTable {
		return SchemaSQL
	}
	s := strings.ReplaceAll(SchemaSQL, DefaultTable+indexSuffix, "`"+table+indexSuffix+"`")
	return strings.ReplaceAll(s, " "+DefaultTable+" (", " "+newStatements(schema, table).t+" (")
}

// Migrate creates the store's table in the database when it does not
// exist, for services that have no migration tool, and brings a table an
// earlier version made up to date in place (it adds the raw_digest
// column; New refuses such a table, naming the ALTER TABLE a migration
// tool would apply). Of the options only
// WithTable matters; the others are accepted so that the same list can be
// passed to New. Services with a migration tool apply SchemaSQL (or what
// Schema returns) as a migration instead; see the package documentation.
// (CREATE TABLE commits implicitly: run it outside a transaction.) When
// ctx has no deadline, Migrate is bounded by DefaultStartTimeout (10 s).
func Migrate(ctx context.Context, db *sql.DB, opts ...Option) error {
	if db == nil {
		return errors.New("idemkey: mysql: nil *sql.DB")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return err
	}
	budget := sqlcore.Budget(ctx)
	ctx, cancel := sqlcore.StartContext(ctx)
	defer cancel()
	srv, err := reach(ctx, db, budget)
	if err != nil {
		return err
	}
	t := newStatements(cfg.schema, cfg.table).t
	if _, err := db.ExecContext(ctx, schemaFor(cfg.schema, cfg.table)); err != nil {
		return srv.wrap(ctx, fmt.Errorf("idemkey: mysql: creating table %s: %w", t, err))
	}
	// A table an earlier version made has no raw_digest column: it is
	// added in place (and only then: an up-to-date table is only read).
	schema := "DATABASE()"
	if cfg.schema != "" {
		schema = "'" + cfg.schema + "'"
	}
	var has bool
	err = db.QueryRowContext(ctx, "SELECT COUNT(*) > 0 FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "+schema+
		" AND TABLE_NAME = '"+cfg.table+"' AND COLUMN_NAME = 'raw_digest'").Scan(&has)
	if err == nil && !has {
		_, err = db.ExecContext(ctx, addRawDigest(t))
	}
	if err != nil {
		return srv.wrap(ctx, fmt.Errorf("idemkey: mysql: bringing table %s up to date: %w", t, err))
	}
	return nil
}

// addRawDigest is the change that brings a table an earlier version made
// up to date.
func addRawDigest(table string) string {
	return "ALTER TABLE " + table + " ADD COLUMN raw_digest BINARY(32) NULL AFTER fingerprint"
}

// server is what start-up learns of the server first, for its checks and
// its messages.
type server struct {
	address  string // "host:port" as the server names itself
	database string // the connection's, "" when it has none
	version  string
	budget   string // the start-up budget, as sqlcore.Budget says it
}

// reach asks the server who it is, within ctx. The *sql.DB does not say
// where it connects, so a server that never answers is named by what ctx
// allowed; one that answers names itself in every later error (wrap).
func reach(ctx context.Context, db *sql.DB, budget string) (server, error) {
	srv := server{budget: budget}
	var database sql.NullString
	var host string
	var port int64
	err := db.QueryRowContext(ctx, "SELECT DATABASE(), VERSION(), @@hostname, @@port").Scan(&database, &srv.version, &host, &port)
	if err != nil {
		if ctx.Err() != nil {
			return srv, fmt.Errorf("idemkey: mysql: the server (the DSN's address) did not answer within the start-up budget, %s: %w", budget, err)
		}
		return srv, fmt.Errorf("idemkey: mysql: reaching the server (the DSN's address): %w", err)
	}
	srv.address = net.JoinHostPort(host, strconv.FormatInt(port, 10))
	srv.database = database.String
	return srv, nil
}

// wrap names the server and its database in err, and says when the
// start-up budget ran out.
func (srv server) wrap(ctx context.Context, err error) error {
	where := srv.address
	if srv.database != "" {
		where += ", database " + srv.database
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%w (server %s; the start-up budget ran out: %s)", err, where, srv.budget)
	}
	return fmt.Errorf("%w (server %s)", err, where)
}

// ErrReadOnly is what New returns for a server, or a session, that takes
// no writes (read_only or super_read_only for the store's user,
// transaction_read_only / tx_read_only, innodb_read_only): every request
// would answer 503 without running.
var ErrReadOnly = errors.New("idemkey: mysql: the server takes no writes from this connection (read_only, super_read_only, transaction_read_only or tx_read_only, innodb_read_only): the store keeps its records there; point the DSN at the primary, or turn the setting off")

// checkWrites fails with ErrReadOnly when a write to the table is refused
// because the server or session is read-only: it sends an UPDATE that
// matches no row (no key is empty), which the server refuses before it
// looks for rows.
func checkWrites(ctx context.Context, db *sql.DB, q statements) error {
	_, err := db.ExecContext(ctx, "UPDATE "+q.t+" SET k = k WHERE k = X''")
	switch {
	case err == nil:
		return nil
	case isNumber(err, errReadOnlyOption) || isNumber(err, errReadOnlyTx) || isNumber(err, errReadOnlyInnoDB):
		return fmt.Errorf("%w: %w", ErrReadOnly, err)
	}
	return fmt.Errorf("idemkey: mysql: checking that table %s takes writes: %w", q.t, err)
}

// checkTable fails unless the table exists with every column the store
// uses.
func checkTable(ctx context.Context, db *sql.DB, table string) error {
	rows, err := db.QueryContext(ctx, "SELECT "+columns+" FROM "+table+" LIMIT 0")
	if err == nil {
		rows.Close()
		err = rows.Err()
	}
	switch {
	case err == nil:
		return nil
	case isNumber(err, errNoSuchTable):
		return fmt.Errorf("idemkey: mysql: table %s does not exist: create it with mysql.Migrate, or apply mysql.SchemaSQL (or mysql.Schema) with your migration tool", table)
	case isNumber(err, errBadField) && strings.Contains(err.Error(), "raw_digest"):
		return fmt.Errorf("idemkey: mysql: table %s was made by an earlier version of the store (it has no raw_digest column): run mysql.Migrate, which adds it in place, or apply %s with your migration tool", table, addRawDigest(table))
	case isNumber(err, errBadField):
		return fmt.Errorf("idemkey: mysql: table %s is not the store's table (%v): compare it with mysql.SchemaSQL", table, err)
	}
	return fmt.Errorf("idemkey: mysql: checking table %s: %w", table, err)
}

// ErrGalera is what New returns for a node of a Galera cluster (MariaDB
// Galera Cluster, Percona XtraDB Cluster): its named locks are the node's
// own, not the cluster's, and its writes are certified at commit, so two
// requests on two nodes could both hold a key.
var ErrGalera = errors.New("idemkey: mysql: the server is a node of a Galera cluster (wsrep_on is ON): named locks are local to a node, so the store cannot claim keys on it; use a server without Galera (or MySQL Group Replication in single-primary mode, every instance writing to the primary)")

// checkGalera fails with ErrGalera on a Galera node.
func checkGalera(ctx context.Context, db *sql.DB) error {
	var v sql.NullString
	err := db.QueryRowContext(ctx, "SELECT @@wsrep_on").Scan(&v)
	on, err := galeraOn(v, err)
	if err != nil {
		return fmt.Errorf("idemkey: mysql: checking for Galera: %w", err)
	}
	if on {
		return ErrGalera
	}
	return nil
}

// galeraOn reads the answer to SELECT @@wsrep_on: the server is a Galera
// node when the variable exists and is on. A server without it (MySQL
// answers "unknown system variable") is not one; MariaDB has it, off,
// unless it runs Galera.
func galeraOn(v sql.NullString, err error) (bool, error) {
	if isNumber(err, errUnknownVariable) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if !v.Valid {
		return false, nil
	}
	switch strings.ToUpper(strings.TrimSpace(v.String)) {
	case "1", "ON", "TRUE", "YES":
		return true, nil
	}
	return false, nil
}

// ErrLocksNotReal is what New returns for a server whose named locks only
// look like MySQL's: a lock one session takes is not seen as held by that
// session from another (a server that answers GET_LOCK 1 whatever holds
// the lock, or a proxy that sends one client connection's statements to
// several servers). The store's claim is such a lock, so it would let
// every request run.
var ErrLocksNotReal = errors.New("idemkey: mysql: this server's named locks are not real (a lock one session takes is not seen held by it from another session): the store cannot claim keys on it")

// checkLocks fails with ErrLocksNotReal unless a named lock one session
// takes is seen from another session as held by the first. It needs two
// connections at once. The lock's name is drawn at random, so that
// instances starting together do not meet on it.
func checkLocks(ctx context.Context, db *sql.DB) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var b [16]byte
	rand.Read(b[:])
	name := "'idemkey:check:" + hex.EncodeToString(b[:]) + "'"
	a, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("idemkey: mysql: checking the server's named locks: %w", err)
	}
	defer a.Close()
	var got sql.NullInt64
	var idA int64
	if err := a.QueryRowContext(ctx, "SELECT GET_LOCK("+name+", 0), CONNECTION_ID()").Scan(&got, &idA); err != nil {
		return fmt.Errorf("idemkey: mysql: checking the server's named locks: %w", err)
	}
	defer func() {
		// A connection that may still hold the lock is not pooled.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if _, err := a.ExecContext(rctx, "DO RELEASE_LOCK("+name+")"); err != nil {
			a.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("idemkey: mysql: checking the server's named locks: a fresh lock could not be taken (GET_LOCK answered %v)", got)
	}
	other, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("idemkey: mysql: checking the server's named locks (it needs two connections at once): %w", err)
	}
	defer other.Close()
	var holder sql.NullInt64
	var idB int64
	if err := other.QueryRowContext(ctx, "SELECT IS_USED_LOCK("+name+"), CONNECTION_ID()").Scan(&holder, &idB); err != nil {
		return fmt.Errorf("idemkey: mysql: checking the server's named locks: %w", err)
	}
	if idA == idB || !holder.Valid || holder.Int64 != idA {
		return ErrLocksNotReal
	}
	return nil
}
