package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
)

// ErrPermission reports a Redis user that may not run every command the
// store sends, on every key it sends it to: SET (the claim), GET and PTTL,
// EVAL and EVALSHA, the commands the scripts call (GETRANGE, SET, PEXPIRE,
// SETRANGE, DEL), and WAIT in the WithWaitReplicas mode, on keys named as
// the store names them (the prefix of WithKeyPrefix, then "idem:v1:").
// Such a user would claim keys and run handlers, but keep nothing: every
// retry would run its handler again. New and Check return it wrapped with
// the server, the command and the server's answer.
var ErrPermission = errors.New("idemkey: redis: the Redis user may not run every command the store sends")

// How long Check's probe keys live at most: the claim (extended once to
// twice its life), should the probe stop half way, and the record it ends
// with.
const (
	probeClaim     = 10 * time.Second
	probeRetention = time.Second
)

// checkAccess runs, on a probe key of its own, every command the store
// sends, in the order and the form the store sends them, and reports a
// refusal as ErrPermission. Asking the server what the user may do (ACL
// DRYRUN, ACL GETUSER) needs rights a service's user seldom has, and
// misses what only running shows: the commands a script calls are checked
// when the script runs, and a script's refused redis.pcall answers no
// error at all. So the probe runs the commands, and reads back what the
// scripts wrote. It sends no ACL command: it works the same for a user
// that may not run any, and on servers without ACLs.
//
// In a cluster one probe key is placed on each master, when the client can
// say which master holds a key (MasterForKey) and list the masters
// (ForEachMaster). It returns "" when the check passed, and a warning when
// it could not be made to the end because the server is out of memory.
func (s *Store) checkAccess(ctx context.Context) (string, error) {
	p := *s
	p.wait = 0 // the claim's WAIT is checked by itself, below
	keys, err := s.probeKeys(ctx)
	if err != nil {
		return "", unavailable("check "+serverName(s.client), err)
	}
	for _, k := range keys {
		warn, err := p.probe(ctx, k.key)
		if err != nil {
			return "", fmt.Errorf("%s: %w", k.server, err)
		}
		if warn != "" {
			return k.server + ": " + warn, nil
		}
	}
	if s.wait > 0 {
		bctx := s.clock.budget(ctx, s.timeout)
		if err := s.exec(bctx, nil, goredis.NewIntCmd(bctx, "wait", 0, 0)); err != nil {
			return "", fmt.Errorf("%s: %w", serverName(s.client), refused("WAIT", err))
		}
	}
	return "", nil
}

// probe runs the store's commands on key (a store key; the prefix is added
// as for any other), and deletes the key when it is done. A probe that
// stops half way releases its claim if it can; otherwise the claim lapses
// within 20 seconds.
func (s *Store) probe(ctx context.Context, key string) (warn string, err error) {
	name := s.name(key)
	token := probeToken()
	// EVAL first, which also caches the scripts, so that the calls below
	// send EVALSHA: the store sends both.
	for _, sc := range []script{releaseScript, extendScript, completeScript} {
		bctx := s.clock.budget(ctx, s.timeout)
		args := []any{ownerPrefix(token)}
		if sc == completeScript {
			args = append(args, "x", 1) // no claim of token's: writes nothing
		} else if sc == extendScript {
			args = append(args, 1, "x")
		}
		if err := s.exec(bctx, nil, evalCmd(bctx, "eval", sc.src, name, args)); err != nil && err != goredis.Nil {
			return "", refused("EVAL", err)
		}
	}
	claim := store.Claim{Token: token, TTL: probeClaim}
	switch res, err := s.Claim(ctx, key, claim); {
	case err != nil && goredis.HasErrorPrefix(err, "ERR syntax error"):
		// Before 7.0, SET takes NX or GET, not both.
		return "", fmt.Errorf("%w: SET ... NX GET (the claim) is refused as a syntax error: %w", ErrServerVersion, redisError(err))
	case err != nil:
		return outOfMemory("SET ... NX GET (the claim)", err)
	case res.State != store.Claimed:
		return "", unavailable("check", fmt.Errorf("the probe key %s is held already (%v)", name, res.State))
	}
	defer func() {
		if err != nil || warn != "" {
			s.Release(context.WithoutCancel(ctx), key, token)
		}
	}()
	for _, cmd := range []string{"get", "pttl"} { // a claim at maxmemory, a version 1 claim
		bctx := s.clock.budget(ctx, s.timeout)
		if err := s.exec(bctx, nil, goredis.NewCmd(bctx, cmd, name)); err != nil {
			return "", refused(strings.ToUpper(cmd), err)
		}
	}
	before, err := s.probeValue(ctx, name)
	if err != nil {
		return "", err
	}
	if err := s.Extend(ctx, key, token, 2*probeClaim); err != nil {
		return outOfMemory("EVALSHA of the extend script (GETRANGE, PEXPIRE, SETRANGE)", err)
	}
	after, err := s.probeValue(ctx, name)
	if err != nil {
		return "", err
	}
	if !after.expires.After(before.expires) {
		// The script's SETRANGE goes through redis.pcall, which answers a
		// refusal with no error.
		return "", fmt.Errorf("%w: SETRANGE in the extend script was refused (the claim's expiry did not move)", ErrPermission)
	}
	if err := s.Release(ctx, key, token); err != nil {
		return outOfMemory("EVALSHA of the release script (GETRANGE, DEL)", err)
	}
	if _, err := s.Claim(ctx, key, claim); err != nil {
		return outOfMemory("SET ... NX GET (the claim)", err)
	}
	rec := &store.Record{Status: 204, CreatedAt: s.now(), CompletedAt: s.now()}
	switch err := s.Complete(ctx, key, token, rec, probeRetention); {
	case errors.Is(err, errHeldInstead):
		// The script's SET (allowed: the claim is one) was refused for
		// want of memory.
		return "could not check every command the store sends: the server refused to store a record (out of memory?)", nil
	case err != nil:
		return outOfMemory("EVALSHA of the complete script (GETRANGE, SET)", err)
	}
	// Done: delete the record, with the script idemctl deletes keys with,
	// so that the probe leaves nothing behind. Should that fail, the
	// record lapses within probeRetention.
	if val, err := encodeRecord(rec, token); err == nil {
		s.run(ctx, deleteScript, name, val, s.hub.arg)
	}
	return "", nil
}

// probeValue reads the probe claim on name.
func (s *Store) probeValue(ctx context.Context, name string) (inFlight, error) {
	bctx := s.clock.budget(ctx, s.timeout)
	cmd := goredis.NewStringCmd(bctx, "get", name)
	if err := s.exec(bctx, nil, cmd); err != nil {
		return inFlight{}, refused("GET", err)
	}
	f, err := decodeInFlight(cmd.Val())
	if err != nil {
		return inFlight{}, unavailable("check", fmt.Errorf("the probe key %s: %w", name, err))
	}
	return f, nil
}

// probeKey is a key Check probes, and the server it lives on.
type probeKey struct{ key, server string }

// probeKeys returns the store keys Check probes: one on each master of a
// cluster client that can say where a key lives, else one. A probe key is
// named as store.KeyName names keys, with a random digest, so that every
// key pattern that covers the store's keys covers it.
func (s *Store) probeKeys(ctx context.Context) ([]probeKey, error) {
	walker, ok1 := s.client.(masterWalker)
	pinner, ok2 := s.client.(nodePinner)
	if !ok1 || !ok2 {
		return []probeKey{{newProbeKey(), serverName(s.client)}}, nil
	}
	var mu sync.Mutex // ForEachMaster calls fn for every master at once
	masters := make(map[string]bool)
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := walker.ForEachMaster(ctx, func(ctx context.Context, node *goredis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		masters[node.Options().Addr] = true
		return nil
	}); err != nil {
		return nil, err
	}
	var keys []probeKey
	// Each try lands on a given one of n masters with chance 1/n: 64
	// tries per master miss one with odds under 1 in 10^27.
	for i := 0; i < 64*len(masters) && len(masters) > 0; i++ {
		key := newProbeKey()
		node, err := pinner.MasterForKey(ctx, s.name(key))
		if err != nil {
			return nil, err
		}
		if addr := node.Options().Addr; masters[addr] {
			delete(masters, addr)
			keys = append(keys, probeKey{key, addr})
		}
	}
	if len(keys) == 0 {
		keys = append(keys, probeKey{newProbeKey(), serverName(s.client)})
	}
	return keys, nil
}

// masterWalker is a cluster client that can visit the master of every
// shard.
type masterWalker interface {
	ForEachMaster(ctx context.Context, fn func(ctx context.Context, node *goredis.Client) error) error
}

func newProbeKey() string {
	var b [32]byte
	rand.Read(b[:])
	return store.KeyPrefix + "{" + hex.EncodeToString(b[:]) + "}"
}

func probeToken() string {
	var b [16]byte
	rand.Read(b[:])
	return "check-" + hex.EncodeToString(b[:])
}

// refused wraps the error of a probe's command: ErrPermission when the
// server refused it to this user (or does not know it, as when a managed
// service renamed it), store.ErrUnavailable otherwise.
func refused(what string, err error) error {
	if denied(err) {
		return fmt.Errorf("%w: %s: %w", ErrPermission, what, redisError(err))
	}
	return unavailable("check: "+what, err)
}

// outOfMemory is refused for the store's own calls, except that a server
// out of memory makes the probe stop with a warning rather than an error:
// at maxmemory the server still serves replays, and Check does not refuse
// it for that.
func outOfMemory(what string, err error) (string, error) {
	if goredis.HasErrorPrefix(err, "OOM") {
		return "could not check every command the store sends: the server is out of memory", nil
	}
	return "", refused(what, err)
}

// denied reports whether err is the server's refusal of a command or a key
// to this user: NOPERM, a script's command refused ("The user executing
// the script can't ..."), or an unknown (renamed, disabled) command.
func denied(err error) bool {
	var rerr goredis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := strings.TrimPrefix(rerr.Error(), "ERR ")
	return strings.HasPrefix(msg, "NOPERM") ||
		strings.HasPrefix(msg, "The user executing the script can't") ||
		strings.HasPrefix(msg, "unknown command")
}

// redisError returns the server's answer inside err, or err.
func redisError(err error) error {
	var rerr goredis.Error
	if errors.As(err, &rerr) {
		return rerr
	}
	return err
}
