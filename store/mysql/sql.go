package mysql

import (
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/idemkey/idemkey/store"
)

// The statements are written with their values in them, as literals: byte
// strings as hexadecimal (X'…', which no sql_mode or character set
// reads differently) and integers in decimal. A statement without
// arguments goes to the server as one text query, one round trip, whatever
// the DSN says (the driver sends a statement with arguments as a prepare
// and an execute, two, unless interpolateParams is set). Only a large
// response body is sent as an argument.
//
// Times are microseconds since the Unix epoch on the server's clock
// (nowUS: the same value everywhere in a statement), so that instances
// whose clocks disagree still agree on when a claim lapses, and neither
// the driver's parseTime nor any time zone matters. A row whose expires_us
// is past is gone as far as every statement is concerned, whether or not
// the sweeper has deleted it yet.
const nowUS = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"

// bodyLiteralMax is the largest response body written into a statement as
// a literal (twice its size in hexadecimal); a larger one is sent as an
// argument, in binary.
const bodyLiteralMax = 64 << 10

// hexLit is b as a byte-string literal.
func hexLit(b []byte) string {
	out := make([]byte, 0, 3+2*len(b))
	out = append(out, "X'"...)
	out = hex.AppendEncode(out, b)
	return string(append(out, '\''))
}

// strLit is s as a byte-string literal.
func strLit(s string) string { return hexLit([]byte(s)) }

func intLit(n int64) string { return strconv.FormatInt(n, 10) }

// statements writes the store's statements for one table.
type statements struct {
	t string // the table, quoted
	// mariadb: the server is MariaDB, whose statements can set a
	// variable for themselves (SET STATEMENT … FOR), where MySQL takes an
	// optimizer hint (SET_VAR).
	mariadb bool
}

// noWait returns stmt (an UPDATE or DELETE of a plain call) bounded so
// that it does not wait for a row another transaction holds (a request's
// transaction that took over a lapsed claim): it fails at once with a lock
// wait timeout (1205) on MariaDB, after one second on MySQL (the least
// innodb_lock_wait_timeout it takes), and the call then reads the row's
// committed state to answer. It runs in READ COMMITTED or REPEATABLE READ
// alike.
func (q statements) noWait(stmt string) string {
	if q.mariadb {
		return "SET STATEMENT innodb_lock_wait_timeout = 0 FOR " + stmt
	}
	verb, rest, _ := strings.Cut(stmt, " ")
	return verb + " /*+ SET_VAR(innodb_lock_wait_timeout = 1) */ " + rest
}

func newStatements(schema, table string) statements {
	t := "`" + table + "`"
	if schema != "" {
		t = "`" + schema + "`." + t
	}
	return statements{t: t}
}

// The kinds of answer of the claim's first statement (claim).
const (
	gotBoth    = 1 // both locks taken: the caller owns the key
	gotRow     = 0 // a live row holds the key: its columns say what
	heldOther  = 2 // the key's lock is held, for another request
	heldSame   = 3 // the fingerprint's lock is held: this request is in flight
	heldByThis = 4 // this connection holds a lock already (never expected)
	// changed: at READ UNCOMMITTED, the row read was not the committed
	// one, which is gone or lapsed: read again (readClaim).
	changed = 5
)

// claim reads the key's row and, when it is not live, tries the claim's
// two named locks, in this order: the key's with the request's
// fingerprint (fl), then the key's (kl). Whoever holds the key's lock owns
// the key, and holds the first one too until it lets go of both. So a
// request that finds the first lock taken is a repeat of a request that
// holds the key (heldSame), and one that gets the first but not the second
// finds the key held for another request (heldOther), and lets go of the
// first in the same statement. GET_LOCK(…, 0) never waits.
//
// The statement's clock reading is taken when it starts, and the row read
// a moment later may be a claim made in between: the remaining life of a
// claim is counted from its creation at the earliest, never longer than
// its life.
//
// Columns: token, fingerprint, raw_digest, created_us, remaining life (µs), status,
// header, body, body_omitted, completed_us (of the live row, else NULL),
// the kind of answer, whether a row (live or not) is there, the
// connection's id, the session's isolation level (at READ UNCOMMITTED the
// row read may not be committed: see committed), and the statement's
// clock reading.
func (q statements) claim(key, kl, fl string) string {
	kq, fq := "'"+kl+"'", "'"+fl+"'"
	return "SELECT " + rowColumns + ",\n" +
		"  CASE WHEN r.expires_us > n.now_us THEN 0\n" +
		"       WHEN IS_USED_LOCK(" + kq + ") <=> CONNECTION_ID() OR IS_USED_LOCK(" + fq + ") <=> CONNECTION_ID() THEN 4\n" +
		"       WHEN NOT (GET_LOCK(" + fq + ", 0) <=> 1) THEN 3\n" +
		"       WHEN NOT (GET_LOCK(" + kq + ", 0) <=> 1) THEN IF(RELEASE_LOCK(" + fq + ") IS NULL, 2, 2)\n" +
		"       ELSE 1 END,\n" +
		"  r.k IS NOT NULL, CONNECTION_ID(), " + q.isolation() + ", n.now_us\n" +
		"FROM (SELECT " + nowUS + " AS now_us) n LEFT JOIN " + q.t + " r ON r.k = " + strLit(key)
}

// rowColumns are the columns of the key's row r that the claim reads, at
// the time n.now_us.
const rowColumns = "r.token, r.fingerprint, r.raw_digest, r.created_us, r.expires_us - IF(r.status IS NULL, GREATEST(n.now_us, r.created_us), n.now_us), r.status, r.header, r.body, r.body_omitted, r.completed_us"

// isolation is the session's isolation level, as the server names it
// ("READ-UNCOMMITTED", ...): MariaDB's variable is tx_isolation (which
// its later versions keep as an alias), MySQL 8's transaction_isolation.
func (q statements) isolation() string {
	if q.mariadb {
		return "@@tx_isolation"
	}
	return "@@transaction_isolation"
}

// readUncommitted is the level at which a read sees rows other
// transactions have not committed.
const readUncommitted = "READ-UNCOMMITTED"

// committed reads the key's row as its last commit left it, with the
// claim's columns and whether it is live: a locking read, which sees
// the committed row whatever the session's isolation level, and does not
// wait (NOWAIT) when a transaction holds the row: it fails with
// errLockWaitTimeout (MariaDB) or errLockNowait (MySQL).
func (q statements) committed(key string) string {
	lock := " FOR SHARE NOWAIT"
	if q.mariadb {
		lock = " LOCK IN SHARE MODE NOWAIT"
	}
	return "SELECT " + rowColumns + ", r.expires_us > n.now_us FROM (SELECT " + nowUS + " AS now_us) n JOIN " + q.t +
		" r ON r.k = " + strLit(key) + lock
}

// insert claims a key that has no row, with a life of lifeUS.
func (q statements) insert(key, token string, fp [32]byte, lifeUS int64) string {
	return "INSERT INTO " + q.t + " (k, token, fingerprint, created_us, expires_us) VALUES (" +
		strLit(key) + ", " + strLit(token) + ", " + hexLit(fp[:]) + ", " + nowUS + ", " + nowUS + " + " + intLit(lifeUS) + ")"
}

// hold writes a claim in flight for token with a life of lifeUS, over
// whatever row the key has (the caller holds the key's named locks): the
// key stays held for a request whose transaction the server rolled back
// by itself.
func (q statements) hold(key, token string, fp [32]byte, lifeUS int64) string {
	return q.insert(key, token, fp, lifeUS) + " ON DUPLICATE KEY UPDATE token = VALUES(token), fingerprint = VALUES(fingerprint)," +
		" raw_digest = NULL, created_us = VALUES(created_us), expires_us = VALUES(expires_us), status = NULL, header = NULL," +
		" body = NULL, body_omitted = NULL, completed_us = NULL"
}

// mine reports whether the claim of token is in flight on the key as the
// statement sees it: inside the request's transaction, its own row, not
// yet committed.
func (q statements) mine(key, token string) string {
	return "SELECT EXISTS (SELECT 1 FROM " + q.t + " WHERE k = " + strLit(key) + " AND token = " + strLit(token) + " AND status IS NULL)"
}

// takeover claims a key whose row's life is over. It changes the token
// (always: the claim's token is fresh, or its created_us moves), so one
// row is affected exactly when it took the key, with or without the DSN's
// clientFoundRows.
func (q statements) takeover(key, token string, fp [32]byte, lifeUS int64) string {
	return "UPDATE " + q.t + " SET token = " + strLit(token) + ", fingerprint = " + hexLit(fp[:]) +
		", created_us = " + nowUS + ", expires_us = " + nowUS + " + " + intLit(lifeUS) +
		", raw_digest = NULL, status = NULL, header = NULL, body = NULL, body_omitted = NULL, completed_us = NULL" +
		" WHERE k = " + strLit(key) + " AND expires_us <= " + nowUS
}

// recordColumns are the columns of a kept record, as recordValues gives
// their values.
var recordColumns = []string{"fingerprint", "raw_digest", "status", "header", "body", "body_omitted", "created_us", "completed_us"}

// recordValues returns the values of rec's columns (recordColumns), as
// literals but for a large body, which is the one argument ("?").
func recordValues(rec *store.Record, header []byte) ([]string, []any) {
	orNull := func(b []byte) string {
		if len(b) == 0 {
			return "NULL"
		}
		return hexLit(b)
	}
	raw := "NULL"
	if rec.RawDigest != ([32]byte{}) {
		raw = hexLit(rec.RawDigest[:])
	}
	body, omitted := hexLit(rec.Body), "0"
	var args []any
	if len(rec.Body) > bodyLiteralMax {
		body, args = "?", []any{rec.Body}
	}
	if rec.BodyOmitted {
		omitted = "1"
	}
	return []string{hexLit(rec.Fingerprint[:]), raw, intLit(int64(rec.Status)), orNull(header), body, omitted,
		intLit(rec.CreatedAt.UnixMicro()), intLit(rec.CompletedAt.UnixMicro())}, args
}

// keep writes rec in place of the claim held by token. The fence is the
// claim's: with claimLifeUS > 0, that its life (from created_us, on the
// server's clock) is not over, for a keep inside the request's
// transaction; with 0, that its row is live (a plain Complete); with -1,
// none but the token (a claim the handler committed itself). status goes
// from NULL to a number, so one row is affected exactly when it kept the
// record, with or without clientFoundRows. A large body is the statement's
// one argument.
func (q statements) keep(key, token string, rec *store.Record, header []byte, retentionUS, claimLifeUS int64) (string, []any) {
	vals, args := recordValues(rec, header)
	var b strings.Builder
	b.WriteString("UPDATE " + q.t + " SET ")
	for i, c := range recordColumns {
		b.WriteString(c + " = " + vals[i] + ", ")
	}
	b.WriteString("expires_us = " + nowUS + " + " + intLit(retentionUS) +
		" WHERE k = " + strLit(key) + " AND token = " + strLit(token) + " AND status IS NULL")
	switch {
	case claimLifeUS > 0:
		b.WriteString(" AND created_us + " + intLit(claimLifeUS) + " > " + nowUS)
	case claimLifeUS == 0:
		b.WriteString(" AND expires_us > " + nowUS)
	}
	return b.String(), args
}

// keepAlone writes rec as the key's row, over whatever row it has, in a
// transaction of its own after the request's rolled back (a kept 4xx
// whose writes are undone): fenced by the claim's named lock (kl), which
// this session must hold (so no other request holds the key, and the row
// is the one the claim found, or its own claim committed by the
// handler), and by the claim's life, which ends at deadlineUS on the
// server's clock. It affects no row when fenced, one or two otherwise.
func (q statements) keepAlone(key, kl, token string, rec *store.Record, header []byte, retentionUS, deadlineUS int64) (string, []any) {
	vals, args := recordValues(rec, header)
	var b strings.Builder
	b.WriteString("INSERT INTO " + q.t + " (k, token, " + strings.Join(recordColumns, ", ") + ", expires_us) SELECT " +
		strLit(key) + ", " + strLit(token) + ", " + strings.Join(vals, ", ") + ", " + nowUS + " + " + intLit(retentionUS) +
		" FROM DUAL WHERE IS_USED_LOCK('" + kl + "') <=> CONNECTION_ID() AND " + nowUS + " < " + intLit(deadlineUS) +
		" ON DUPLICATE KEY UPDATE token = VALUES(token)")
	for _, c := range append(recordColumns, "expires_us") {
		b.WriteString(", " + c + " = VALUES(" + c + ")")
	}
	return b.String(), args
}

// state reads what key's row is to a token: whether the token holds it,
// whether it is a kept record, and whether it is live. No row: no answer.
func (q statements) state(key, token string) string {
	return "SELECT token = " + strLit(token) + ", status IS NOT NULL, expires_us > " + nowUS +
		" FROM " + q.t + " WHERE k = " + strLit(key)
}

// release deletes the claim held by token.
func (q statements) release(key, token string) string {
	return "DELETE FROM " + q.t + " WHERE k = " + strLit(key) + " AND token = " + strLit(token) + " AND status IS NULL"
}

// extend sets the remaining life of the live claim held by token.
func (q statements) extend(key, token string, ttlUS int64) string {
	return "UPDATE " + q.t + " SET expires_us = " + nowUS + " + " + intLit(ttlUS) +
		" WHERE k = " + strLit(key) + " AND token = " + strLit(token) + " AND status IS NULL AND expires_us > " + nowUS
}

// heldRelease reports whether the claim held by token is committed and in
// flight (after the request's transaction rolled back: whether the
// handler committed it before, with its writes), and lets go of every
// named lock of the connection, the key's (kl) first (letGoOfLocks), in
// one statement: the key is free when Rollback returns.
func (q statements) heldRelease(key, kl, token string) string {
	return "SELECT EXISTS (SELECT 1 FROM " + q.t + " WHERE k = " + strLit(key) + " AND token = " + strLit(token) +
		" AND status IS NULL), " + letGoOfLocks(kl)
}

// letGoOfLocks is an expression that lets go of every named lock the
// connection holds, the key's lock kl first (none for ""): a session that
// holds the key's lock holds its fingerprint's too, until it has let go of
// the key's. A claim that takes the fingerprint's lock and not the key's
// reads the key as held for another request (heldOther), which a repeat of
// the owner's own request would otherwise be told for a moment while the
// owner let go: RELEASE_ALL_LOCKS alone lets go in an order of the
// server's, which depends on the locks' names (on MariaDB 10.11, the
// fingerprint's first for about half the keys).
func letGoOfLocks(kl string) string {
	if kl == "" {
		return "RELEASE_ALL_LOCKS()"
	}
	return "IF(RELEASE_LOCK('" + kl + "') IS NULL, RELEASE_ALL_LOCKS(), RELEASE_ALL_LOCKS())"
}

// releaseLocks lets go of every named lock the connection holds, the key's
// lock kl first (letGoOfLocks), and turns autocommit back on (a request's
// transaction runs with it off, see noAutocommit), in one statement. No
// transaction is open when it runs: turning autocommit on would commit one.
func releaseLocks(kl string) string {
	return "SET autocommit = IF(" + letGoOfLocks(kl) + " IS NULL, 1, 1)"
}

// noAutocommit is sent before a request's transaction begins. When the
// server rolls that transaction back by itself (a deadlock's victim), the
// handler's statements after it then open a transaction of their own,
// which ends with the session, rather than each committing on its own
// with the claim gone: a session killed by the watchdog, or closed by a
// statement past its context, would otherwise free the key with those
// writes in. releaseLocks turns autocommit back on.
const noAutocommit = "SET autocommit = 0"

// sweepSelect locks up to n lapsed rows, oldest first, skipping rows
// another transaction holds (a takeover in a request's transaction,
// another sweeper).
func (q statements) sweepSelect(n int) string {
	return "SELECT k FROM " + q.t + " WHERE expires_us <= " + nowUS +
		" ORDER BY expires_us LIMIT " + strconv.Itoa(n) + " FOR UPDATE SKIP LOCKED"
}

// sweepDelete deletes the lapsed rows of keys.
func (q statements) sweepDelete(keys [][]byte) string {
	var b strings.Builder
	b.WriteString("DELETE FROM " + q.t + " WHERE k IN (")
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(hexLit(k))
	}
	b.WriteString(") AND expires_us <= " + nowUS)
	return b.String()
}

// micros returns d in whole microseconds, rounded up.
func microsOf(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}
