// Command idemctl inspects the idempotency records a service keeps in Redis
// (package store/redis), PostgreSQL (package store/postgres) or MySQL and
// MariaDB (package store/mysql): it shows
// what one key holds, deletes it, and counts what the store holds.
//
//	idemctl [--redis URL [--cluster] [--redis-prefix P] | --database-url URL [--table NAME]] [--json] [--timeout D] <command> [flags]
//
//	idemctl show   --scope alice --key k1      # the record of alice's key k1
//	idemctl show   --digest <64 hex>           # the record a log line names
//	idemctl delete --scope alice --key k1      # asks first; --yes does not
//	idemctl stats                              # records, claims, memory or table size
//
// A key is named by the scope and the key the client sent (--scope and
// --key; the scope of routes without a signed-in caller is "anonymous"), or
// by its digest (--digest), the hex that the middleware's events and logs
// carry as key_digest. The store key is computed with store.KeyName, as the
// middleware computes it: "idem:v1:{<digest>}".
//
// show prints the state (in_flight: a request holds the key and is still
// running; completed: a response is kept), the request fingerprint, the
// kept status, the age, the remaining TTL, the body size and headers, and
// the value's size and memory usage. --body prints the kept body as well.
//
// delete removes the key after showing it and asking for confirmation on
// standard input (--yes skips the question). It deletes only the value it
// showed: if the key changed in between, nothing is deleted. Once a
// completed key is deleted, a retry with it runs the handler again; once an
// in-flight key is deleted, a retry runs the handler while the first
// request may still be running. Instances with a local replay cache
// (middleware.WithLocalCache) go on replaying a deleted record until their
// entries lapse.
//
// With PostgreSQL, show prints the row's size in the table instead of
// memory, says when a row has expired but is not swept yet (the store
// treats its key as free), and a key held by a request's transaction,
// whose claim is not committed: only that it is held, and since when,
// can be seen (end the transaction to free it; delete cannot). delete
// deletes the row only while it is the row shown (same owner, state and
// expiry).
//
// stats scans the keys (SCAN MATCH idem:v1:* COUNT --count) on every master,
// counts records, in-flight claims and values it cannot read, measures the
// memory of up to --sample keys with MEMORY USAGE (all of them when there
// are no more, otherwise an estimate from the mean), and reports each
// master's INFO memory: used memory, maxmemory and maxmemory-policy, which
// must be noeviction. With PostgreSQL it counts the table's rows (a scan of
// the whole table): records, claims in flight (and how many in a request's
// transaction), expired rows not swept yet; and reports the table's size
// and its indexes', the dead row versions awaiting vacuum, and when the
// table was last vacuumed. With MySQL or MariaDB it counts the same
// (claims in a request's transaction are not rows yet, and are not
// counted) and reports InnoDB's sizes of the table: data, indexes, free
// space, bytes per row, and the oldest expiry.
//
// show on Redis, when the key is not found, looks for it behind another
// key prefix (SCAN MATCH *idem:v1:{<digest>}) and names the keys found and
// the --redis-prefix that shows them: a service whose store has
// redis.WithKeyPrefix keeps its keys there.
//
// Flags:
//
//	--redis URL   the server, as redis://[user:password@]host:port/db or
//	              rediss:// for TLS; default $REDIS_URL, else
//	              redis://127.0.0.1:6379/0
//	--cluster     the URL names a Redis Cluster node; further nodes may be
//	              added as ?addr=host:port parameters
//	--redis-prefix P
//	              the key prefix the service gives redis.WithKeyPrefix, for
//	              example "billing:": show and delete name the key
//	              "billing:idem:v1:{<digest>}", stats scans billing:idem:v1:*;
//	              default none
//	--database-url URL
//	              a PostgreSQL store instead, as postgres://user@host:port/db,
//	              or a MySQL or MariaDB one, as mysql://user[:password]@host:port/db;
//	              default $DATABASE_URL when neither --redis nor $REDIS_URL
//	              is set (both variables set is a usage error)
//	--table NAME  the database store's table, name (or schema.name on
//	              PostgreSQL);
//	              default idemkey_records
//	--json        print JSON instead of text
//	--timeout D   how long the whole command may take; default 30s
//
// These flags may come before the command or after it, among the
// command's own flags: idemctl --redis URL show --key k1 ... and idemctl
// show --key k1 --redis URL ... are the same. Given on both sides, the one
// after the command wins.
//
// Exit status: 0 on success, 1 when the key is not found, the deletion is
// declined or the command fails, 2 for a usage error.
package main

import (
	"context"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
