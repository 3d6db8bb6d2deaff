// Package redis is the idempotency store for a fleet of service instances
// that share one Redis: standalone Redis 7, Sentinel or Cluster, through a
// go-redis v9 UniversalClient.
//
// Each idempotency key is one Redis string under the name store.KeyName
// gives it, "idem:v1:{<64 hex>}", behind the prefix of WithKeyPrefix when
// services share one Redis database ("billing:idem:v1:{<64 hex>}"). The
// braces are a Cluster hash tag, so everything about a key lives in one
// slot, whatever the prefix (which may not hold braces). Every change is
// one command on that one key:
//
//   - claim: SET key claim PX life NX GET (Redis 7.0 or later, which Check
//     verifies), which claims
//     a free key with the caller's token and the claim's life, or answers
//     with what holds it: the caller's own claim (Mine, after go-redis
//     resent a claim whose reply was lost), another request's claim, which
//     carries its remaining life (InFlight), or the kept record (Completed).
//     A plain command costs Redis about half the CPU of a script doing the
//     same, and a replay is as cheap as a GET. The reply is read as the
//     protocol's bytes (go-redis's RawCmd), so that a won claim's nil is
//     not put through go-redis's retry classifier as the error redis.Nil:
//     a first run costs 21 allocations fewer (47 to 26 in
//     BenchmarkFirstRun), a replay 2 more, and a copy of the record (17 to
//     19 in BenchmarkReplay). A reply that is an error (MOVED, ASK,
//     LOADING, READONLY, OOM) means the SET did not run: it is sent again
//     as an ordinary command, which go-redis follows, retries and reports;
//   - complete: a Lua script that replaces the caller's claim with the
//     record, kept for the retention window; the record keeps the caller's
//     token, so a complete that go-redis resends after a lost reply finds
//     its own record and counts as kept;
//   - release: a script that deletes the caller's claim; a key that holds
//     nothing counts as released (a resent release, or a claim that lapsed);
//   - extend: a script that sets the remaining life of the caller's claim.
//
// The complete and release scripts also PUBLISH the key's name on the
// store's wake channel, "idem:v1:settled" behind the key prefix, when they
// kept or released a claim that a waiting repeat marked (see "Waiting for
// the first request"), and Delete's script (idemctl delete) whenever it
// deleted a key: inside the script, no round trip of its own.
//
// The scripts check the caller's owner token and run with EVALSHA, falling
// back to EVAL when the server has not cached them.
//
// New applies its options in order (a later option overrides an earlier
// one of the same kind) and returns one error that names every invalid
// value and nil option; no option panics.
//
// A first run costs two round trips (claim, complete); a replay, an in-flight
// answer and a reused key cost one.
//
// # Constructing a Store
//
// The client belongs to the caller: New does not copy or close it. New
// talks to the server (see New): a server that cannot be reached, or a
// user that may not run every command the store sends, makes it fail,
// within WithStartTimeout (default 5 s) when its context (NewContext) has
// no deadline, with an error that names the server. Always set
// ContextTimeoutEnabled, so that go-redis stops reading a socket at the
// deadline of each call's time budget (WithCallTimeout, default 300 ms), and
// size the pool to the number of requests served at once:
//
//	// Standalone.
//	rdb := goredis.NewClient(&goredis.Options{
//		Addr:                  "127.0.0.1:6379",
//		ContextTimeoutEnabled: true,
//		PoolSize:              128,
//	})
//	st, err := redis.New(rdb)
//
//	// Sentinel: the client follows the master through a failover.
//	rdb := goredis.NewFailoverClient(&goredis.FailoverOptions{
//		MasterName:            "mymaster",
//		SentinelAddrs:         []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"},
//		ContextTimeoutEnabled: true,
//		PoolSize:              128,
//	})
//	st, err := redis.New(rdb, redis.WithWaitReplicas(1, 50*time.Millisecond))
//
//	// Cluster: each key's commands run on the master of its slot.
//	rdb := goredis.NewClusterClient(&goredis.ClusterOptions{
//		Addrs:                 []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"},
//		ContextTimeoutEnabled: true,
//		PoolSize:              128,
//	})
//	st, err := redis.New(rdb)
//
//	// At start, refuse a server that may evict claims.
//	rep, err := st.Check(ctx)
//
// New asks the client whether ContextTimeoutEnabled is set, through the
// Options method of the go-redis clients; an instrumentation wrapper that
// embeds a go-redis client answers the same way. A wrapper that keeps the
// client out of reach cannot answer, and the store then bounds each call
// itself as described next: give WithContextTimeouts(true) when the client
// under such a wrapper has ContextTimeoutEnabled set.
//
// Without ContextTimeoutEnabled, go-redis ignores context deadlines on its
// sockets and waits for its own ReadTimeout (and retries after it). The store
// still answers within its budget: it then runs each command on a goroutine
// of its own and returns at the deadline. But the abandoned command holds
// its connection until go-redis gives up, and may still reach the server: a
// claim reported as failed can land late and hold its key, answering 409,
// until its life ends.
//
// # Automatic pipelining
//
// WithAutoPipeline sends the store's commands through the client's
// automatic pipeliner (go-redis's AsyncAutoPipeline): the commands of
// requests served at once go out in one write and come back in one read,
// instead of a round trip each, which saves the service and Redis most of
// the system calls. Measured on loopback with 16 and 64 concurrent callers
// (BenchmarkReplay, BenchmarkFirstRun, BenchmarkInFlight), it takes the
// CPU the store costs the service down by 40 to 60 percent, and Redis's CPU
// down by 30 percent on a first run and by two thirds on a replay or an
// in-flight answer. With few
// callers at once there is nothing to batch and the hand-off to the
// pipeliner's goroutine costs more than it saves: with two, the service
// spends about a third more CPU per call, and waits longer. It is off by
// default, for that and because it changes the following:
//
//   - The pipeliner does not withdraw a command it has sent. The store
//     still returns within its budget, but a claim it reported failed (503)
//     may run later, when the server answers again, and then hold its key
//     (409 to repeats) until its life ends. Without the option that happens
//     too when the server froze after reading the command; but go-redis
//     closes the connection at the deadline, so a server that had not read
//     it yet (CLIENT PAUSE, a full socket) drops it.
//   - Commands reach the client's hooks as pipelines (ProcessPipelineHook),
//     not one by one, and a wrapper's own command methods are bypassed:
//     New asks the client (through a wrapper, its AsyncAutoPipeline) for
//     the pipeliner and sends to it.
//   - The pipeliner is one per client, shared with every other user of it,
//     and configured by the client's Options.AutoPipelineOptions (or by
//     whoever asked for it first). Closing it makes every store call fail
//     until the client gives a new one: close the client instead.
//   - go-redis marks automatic pipelining experimental.
//
// What holds either way: every call's time budget, through retries and a
// hung server; Mine after a lost claim reply and a resent complete or
// release that finds its own write (the pipeliner resends a batch whose
// connection failed, up to the client's MaxRetries); fencing by owner token;
// Cluster slots (the pipeliner routes each command to its slot's master);
// Sentinel failover; and the WAIT mode, whose claims and their WAIT still
// run on a connection pinned to the key's master (its other calls are
// pipelined).
//
// # Waiting for the first request
//
// The Store is a store.Waiter: with the middleware's WithWait, a repeat
// that finds the first request in flight is woken when its record is kept
// or its claim released, on any instance, instead of polling every 10 to
// 250 ms. Measured through the middleware on loopback (bench/README.md),
// a woken repeat answered 0.14 ms (mean; p90 0.20 ms) after the keep
// returned with the first request in the same process and 0.59 ms (p90
// 0.39 ms) with it in another process, against 86 and 95 ms (p90 168 and
// 206 ms) when polling.
//
// Each Store holds one subscription to the wake channel (SUBSCRIBE, on a
// connection of the client's pub/sub pool), made on its first Wait and
// closed after a minute with nobody waiting, and fans its messages out to
// the waiters of each key in process. A wait costs one script after
// registering (EVALSHA of mark.lua): it reads the key, so that a keep
// between the repeat's claim and its subscription is not missed, and
// marks a claim still in flight with one byte at the end of its value
// (SETRANGE, which keeps its life). The complete and release scripts
// publish only a claim so marked: a keep or release nobody waits for
// costs no PUBLISH, which Redis would send on to every replica (a keep
// then reaches a replica as MULTI, SET, PUBLISH, EXEC) and, in a Cluster,
// over the cluster bus to every node. Measured on a three-master Cluster
// (BenchmarkKeepCluster), a first run's keep cost the bus 2.0 messages
// before the mark and none after. Instances of a release before the mark
// publish every keep and release, so that this one's waiters are woken by
// theirs; their waiters do not mark, and are woken by this one's keeps
// only at their recheck, within a second; and they read a marked claim as
// ErrUnreadable (503 to a repeat while another waits). Roll the release
// out to every instance.
//
// The channel is a classic one, PUBLISH and SUBSCRIBE, on every topology.
// In a Cluster, Redis 7 broadcasts a classic PUBLISH to every node, so a
// Store's one subscription, on any node, hears the keys of every slot. A
// sharded channel (SPUBLISH) would stay in the key's shard, but a script
// may only touch its key's slot, so it would need a channel per key or
// per slot and a subscription on each slot's master, moved by every
// reshard: a connection per master per Store at best. With the mark, the
// broadcast is paid only for keys a repeat waits on, which are rare. A
// reshard moves a claim with its mark (one key, one slot), and the
// subscription, on any node, hears the key's new master; a failover may
// lose a mark the replica had not received, and then the waiter claims
// again at its recheck.
//
// The subscription reconnects after a restart or a failover, and wakes
// every waiter when it is made again, since messages published while it
// was down are lost; waiters then claim again to see where the key stands.
// A claim that lapses (its owner died) publishes nothing: each wait ends
// at the claim's expiry, as the claim carries it, at the latest, and at
// its context's end. While the subscription is down, or the user may not
// SUBSCRIBE, Wait answers false and the middleware polls as before; a user
// that may not PUBLISH still keeps and releases (the scripts' PUBLISH is
// refused quietly), but its waiters are not woken, and each ends at its
// claim's expiry or its wait's end.
//
// # Errors
//
// Every backend failure of Claim, Complete, Release and Extend (a timeout, a
// refused connection, OOM, READONLY, LOADING, MASTERDOWN, CLUSTERDOWN) is
// returned wrapping both store.ErrUnavailable and the cause, so the
// middleware answers 503 and does not run the handler. Only a server that
// could not be reached at all wraps store.ErrUnreachable as well (the one
// failure under which the middleware's WithFailOpen runs a handler): a
// dial refused or timed out, a host that does not resolve, or a call whose
// budget ran out while the client's dials failed, with none made since
// (go-redis dials on goroutines of its own and tells the call only that
// its time ran out; New adds a hook to the client that notes its dials,
// and to each node a cluster client makes from then on). A full pool
// ("connection pool timeout"), OOM, READONLY, LOADING, NOPERM, and a
// server that was reached but did not answer in time are not unreachable.
// go-redis resends a command whose connection failed, up to MaxRetries:
// a call whose last tries could not dial may have reached the server on an
// earlier try, on a connection lost after the command was written. A failed call may
// still have happened: a claim that reached a stalled server runs when the
// server resumes. The middleware releases a claim whose call failed, and a
// claim it could not release holds its key (409 to repeats) until its life
// ends; the handler never ran for it. A claim held by
// another token is store.ErrNotOwner. A stored value this version cannot
// read (written by a later format version, or damaged) is ErrUnreadable,
// which does not wrap store.ErrUnavailable: the server answered, and a retry
// finds the same value until it expires. The middleware answers it, like any
// store error, with 503 and does not run the handler: the value may hold a
// response. Roll a new format out to every instance before relying on it:
// while instances of an earlier release run beside this one, they answer
// 503 for keys this one claimed or kept (format version 2), and this one
// reads theirs (version 1; an in-flight answer about such a claim costs a
// second round trip, PTTL). The same holds for a record that keeps its
// request's raw digest (store.Record.RawDigest, a flag of version 2):
// releases before it answer 503 for it, and a record kept without one is
// written as they wrote it.
//
// # Server settings
//
// Run the server with maxmemory-policy noeviction. Under any other policy
// Redis evicts keys when memory runs short, claims included: a request whose
// claim was evicted keeps running while a retry claims the key again and runs
// the handler a second time. Under noeviction a full server refuses new
// claims with OOM (503) and still serves replays of kept records and
// in-flight answers: it refuses every SET, so the claim then reads the key
// with GET, a second round trip while the server is full. A running
// handler's claim is still extended (its life needs no memory), and a
// record the full server refuses to store leaves its claim held for the
// retention instead: repeats answer 409, and nothing runs twice. Check
// refuses any other policy, or warns with WithEvictionWarning.
//
// With ACLs, the store's Redis user needs every command the store sends,
// on keys under the store's names: SET, GET, PTTL, EVAL and EVALSHA, and
// the commands the scripts call, GETRANGE, SET, PEXPIRE, SETRANGE, DEL and
// PUBLISH; SUBSCRIBE and PING, and the wake channel (&idem:*), for Wait;
// WAIT as well with WithWaitReplicas; INFO for Check; and what the client
// itself needs (a Cluster client reads the slot map with CLUSTER SLOTS or
// CLUSTER SHARDS). For example:
//
//	ACL SETUSER idemkey on >secret ~idem:* &idem:* +set +get +pttl +eval +evalsha +getrange +pexpire +setrange +del +publish +subscribe +ping +info
//
// (~billing:idem:* &billing:idem:* with WithKeyPrefix("billing:")). A user that may claim
// but not run the scripts would run every request's handler and keep
// nothing, so every retry would run it again: New (and Check) runs each
// command on a probe key of its own, on every master, and refuses such a
// user with ErrPermission, naming the server and the command. The probe
// sends no ACL command (ACL DRYRUN, ACL GETUSER), which a service's user
// is seldom allowed and which cannot see what a script's redis.pcall is
// refused; it works the same where ACL commands are refused or missing.
//
// Persistence decides what a restart forgets. Without it (no AOF, no RDB
// snapshots) a restarted server has no claims and no records: retries of
// requests that already ran run again. With appendonly yes and appendfsync
// everysec a crash loses about the last second. Check reports whether each
// node persists; it does not refuse a server that does not.
//
// Under Sentinel, claims fail (503) from the master's failure until the
// sentinels have promoted a replica and the client has found it: about
// down-after-milliseconds plus the election and promotion, a few seconds.
//
// Replication is asynchronous: a master that fails right after a claim may
// not have passed it on, and the promoted replica lets a retry claim the key
// while the first request still runs. WithWaitReplicas closes that window for
// claims, at the cost of one more round trip per first run and of refusing
// claims (503) while too few replicas are up. Records are not waited for: a
// record lost in a failover leaves the key free, or in flight until the
// claim's life ends, and a retry runs the handler again.
//
// # Tests in testing/synctest bubbles
//
// A Store may be used inside testing/synctest bubbles. A Store made inside
// a bubble belongs to that bubble, as its go-redis client does: use it
// there only. A Store made outside every bubble may be used in any number
// of them, one after the other or at once; each call made in a bubble then
// has its time budget on the bubble's clock.
//
// # When complete fails
//
// If the store fails while the record is being kept (the server went away
// after the handler ran), the client still gets its response, and Complete
// returns an error wrapping store.ErrUnavailable. The record may or may not
// have been written. When it was not, the claim stays until its life (the
// route's deadline plus a margin) ends: a retry within that window gets 409
// with Retry-After; a retry after it runs the handler again. A shorter route
// deadline shortens that window.
package redis
