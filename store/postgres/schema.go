package postgres

import (
	"context"
	"crypto/rand"
	"database/sql"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkey/idemkey/internal/sqlcore"
)

// SchemaSQL is the table the store needs, as schema.sql in this package
// holds it, under DefaultTable: a migration tool can apply it as it is.
//
//go:embed schema.sql
var SchemaSQL string

// indexSuffix names the table's index: "<table>_expires_at".
const indexSuffix = "_expires_at"

// columns are the table's columns, in the order the store reads them; New
// checks that the table has them all.
const columns = "key, token, fingerprint, raw_digest, created_at, expires_at, status, header, body, body_omitted, completed_at"

// Schema returns SchemaSQL for the table named as WithTable takes it
// ("name" or "schema.name"), with its index named "<name>_expires_at" in
// the table's schema. The statements use IF NOT EXISTS: applying them to a
// database that has the table changes nothing.
func Schema(table string) (string, error) {
	id, err := parseTable(table)
	if err != nil {
		return "", fmt.Errorf("idemkey: postgres: %w", err)
	}
	return schemaFor(id), nil
}

func schemaFor(id pgx.Identifier) string {
	if len(id) == 1 && id[0] == DefaultTable {
		return SchemaSQL
	}
	index := pgx.Identifier{id[len(id)-1] + indexSuffix}.Sanitize()
	s := strings.ReplaceAll(SchemaSQL, DefaultTable+indexSuffix, index)
	s = strings.ReplaceAll(s, DefaultTable+claimSuffix+"(", claimFunc(id).Sanitize()+"(")
	s = strings.ReplaceAll(s, "('"+DefaultTable+"')", "('"+id.Sanitize()+"')")
	return strings.ReplaceAll(s, " "+DefaultTable+" ", " "+id.Sanitize()+" ")
}

// claimSuffix names the table's claim function: "<table>_claim".
const claimSuffix = "_claim"

// claimFunc is the claim function of the table id, in the table's schema.
func claimFunc(id pgx.Identifier) pgx.Identifier {
	f := append(pgx.Identifier(nil), id...)
	f[len(f)-1] += claimSuffix
	return f
}

// claimSignature is the claim function's argument list, as
// to_regprocedure takes it.
const claimSignature = "(text, text, bytea, bigint, bigint, bigint, text)"

// hasClaimFunc reports whether the table's claim function exists as this
// version makes it (returning the raw digest).
func hasClaimFunc(ctx context.Context, q db, table pgx.Identifier) (bool, error) {
	var ok bool
	err := q.queryRow(ctx, "SELECT EXISTS (SELECT FROM pg_proc WHERE oid = to_regprocedure($1) AND 'r_raw_digest' = ANY (proargnames))",
		claimFunc(table).Sanitize()+claimSignature).Scan(&ok)
	return ok, err
}

// migrateLock is the transaction-level advisory lock Migrate holds, so that
// instances starting together do not race to create the table (two
// concurrent CREATE TABLE IF NOT EXISTS can both try, and one fails).
const migrateLock = 0x6964656d6b6579 // "idemkey"

// Migrate creates the store's table, index and claim function in the
// database when they do not exist, or brings those of an earlier version
// up to date, in one transaction under an advisory lock (instances that
// start together wait for each other), for services that have no
// migration tool. It is bounded by ctx, or by DefaultStartTimeout when ctx
// has no deadline; its errors name the server and database.
// Of the options only WithTable matters; the others are accepted so that
// the same list can be passed to New. Services with a migration tool apply
// SchemaSQL (or what Schema returns) as a migration instead; see the
// package documentation.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts ...Option) error {
	if pool == nil {
		return errors.New("idemkey: postgres: nil pool")
	}
	return migrate(ctx, pgxDB{q: pool, pool: pool}, opts)
}

// MigrateDB is Migrate through database/sql: it creates the store's
// table, index and claim function when they do not exist, for a Store
// made with NewDB.
func MigrateDB(ctx context.Context, db *sql.DB, opts ...Option) error {
	if db == nil {
		return errors.New("idemkey: postgres: nil DB")
	}
	return migrate(ctx, sqlDB{q: db, db: db}, opts)
}

func migrate(ctx context.Context, d db, opts []Option) error {
	cfg, err := newConfig(opts)
	if err != nil {
		return err
	}
	caller := ctx
	ctx, cancel := sqlcore.StartContext(ctx)
	defer cancel()
	where, err := d.locate(ctx)
	if err != nil {
		return startErr(caller, ctx, where, fmt.Errorf("idemkey: postgres: connecting: %w", err))
	}
	err = d.inTx(ctx, func(tx db) error {
		if _, err := tx.exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLock)); err != nil {
			return err
		}
		// No arguments: the simple protocol, which runs every statement.
		_, err := tx.exec(ctx, schemaFor(cfg.table))
		return err
	})
	if err != nil {
		return startErr(caller, ctx, where, fmt.Errorf("idemkey: postgres: creating table %s: %w", cfg.table.Sanitize(), err))
	}
	return nil
}

// checkTable fails unless the table exists with every column the store
// uses, and its claim function with it.
func checkTable(ctx context.Context, q db, table pgx.Identifier) error {
	name := table.Sanitize()
	// What to apply: SchemaSQL for the default table, Schema's for
	// another.
	apply := "postgres.SchemaSQL"
	if len(table) != 1 || table[0] != DefaultTable {
		apply = fmt.Sprintf("postgres.Schema(%q)", strings.Join(table, "."))
	}
	err := q.queryRow(ctx, "SELECT "+columns+" FROM "+name+" LIMIT 0").Scan()
	switch {
	case err == nil || noRows(err):
	case sqlState(err) == "42P01": // undefined_table
		return fmt.Errorf("idemkey: postgres: table %s does not exist: create it with postgres.Migrate, or apply %s with your migration tool", name, apply)
	case sqlState(err) == "42703": // undefined_column
		return fmt.Errorf("idemkey: postgres: table %s was made by an earlier version, or is not the store's table (%w): bring it up to date with postgres.Migrate, or apply %s again", name, err, apply)
	default:
		return fmt.Errorf("idemkey: postgres: checking table %s: %w", name, err)
	}
	ok, err := hasClaimFunc(ctx, q, table)
	if err != nil {
		return fmt.Errorf("idemkey: postgres: checking table %s: %w", name, err)
	}
	if !ok {
		return fmt.Errorf("idemkey: postgres: table %s has no claim function %s as this version makes it: bring it up to date with postgres.Migrate, or apply %s again", name, claimFunc(table).Sanitize(), apply)
	}
	return nil
}

// ErrReadOnly is what New returns for a server on which the store cannot
// write: a hot standby (in recovery), or one whose transactions are
// read-only for the store's user or database
// (default_transaction_read_only). Every claim writes, so on such a
// server every request would be answered 503 without running.
var ErrReadOnly = errors.New("idemkey: postgres: the server is read-only")

// checkWritable fails with ErrReadOnly when the server cannot take the
// store's writes, saying why.
func checkWritable(ctx context.Context, q db) error {
	var recovery, readOnly bool
	if err := q.queryRow(ctx, "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'").Scan(&recovery, &readOnly); err != nil {
		return fmt.Errorf("idemkey: postgres: checking that the server takes writes: %w", err)
	}
	switch {
	case recovery:
		return fmt.Errorf("%w: it is a hot standby (pg_is_in_recovery() is true); connect the store to the primary", ErrReadOnly)
	case readOnly:
		return fmt.Errorf("%w: its transactions are read-only for this connection (default_transaction_read_only is on, for the user, the database or the connection); turn it off for the store's connections (ALTER ROLE ... SET default_transaction_read_only = off)", ErrReadOnly)
	}
	return nil
}

// ErrLocksNotReal is what New returns for a server whose advisory locks
// only look like PostgreSQL's: a lock taken is not held (CockroachDB
// answers pg_try_advisory_lock true whatever holds it). The store's claim
// is such a lock, so it would let every request run.
var ErrLocksNotReal = errors.New("idemkey: postgres: this server's advisory locks are not real (a lock taken is not listed as held in pg_locks): the store cannot claim keys on it")

// checkLocksSQL takes a transaction-scoped advisory lock and reports
// whether the server lists it as held by this session; NULL when another
// session holds that lock (draw another).
const checkLocksSQL = `SELECT CASE WHEN pg_try_advisory_xact_lock($1::bigint) THEN EXISTS (
    SELECT FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.granted AND l.objsubid = 1
      AND l.classid = (($1::bigint >> 32) & 4294967295)::oid AND l.objid = ($1::bigint & 4294967295)::oid) END`

// checkLocks fails with ErrLocksNotReal unless a transaction-scoped
// advisory lock the store takes is really held: listed in pg_locks for
// the session that took it, until its transaction ends. It runs one
// statement, in a transaction of its own, so that it holds nothing after;
// the lock is drawn at random, so that instances starting together do not
// meet on it.
func checkLocks(ctx context.Context, q db) error {
	for range 5 {
		var real *bool
		err := q.inTx(ctx, func(tx db) error {
			return tx.queryRow(ctx, checkLocksSQL, randomLock()).Scan(&real)
		})
		if err != nil {
			return fmt.Errorf("idemkey: postgres: checking the server's advisory locks: %w", err)
		}
		if real == nil {
			continue // another session holds the lock drawn
		}
		if !*real {
			return ErrLocksNotReal
		}
		return nil
	}
	return errors.New("idemkey: postgres: checking the server's advisory locks: every lock drawn was held by another session")
}

// randomLock draws an advisory lock id.
func randomLock() int64 {
	var b [8]byte
	rand.Read(b[:])
	return int64(binary.BigEndian.Uint64(b[:]))
}
