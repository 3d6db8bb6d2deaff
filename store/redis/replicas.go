package redis

import (
	"context"
	"errors"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
)

// WithWaitReplicas: the connection pinned to a key's master and the WAIT
// sent on it after a claim.

// ErrNotReplicated reports that fewer replicas than WithWaitReplicas asks
// for acknowledged a claim in time. Claim returns it wrapped together with
// store.ErrUnavailable, after releasing the claim.
var ErrNotReplicated = errors.New("idemkey: redis: claim not acknowledged by enough replicas")

// Clients that can give a connection of their own to the master of a key.
type (
	connPinner interface{ Conn() *goredis.Conn }
	nodePinner interface {
		MasterForKey(ctx context.Context, key string) (*goredis.Client, error)
	}
)

func canPin(client goredis.UniversalClient) bool {
	switch client.(type) {
	case connPinner, nodePinner:
		return true
	}
	return false
}

// pin returns a connection of its own to the master that holds key, so
// that WAIT follows the claim on the connection that wrote it.
func (s *Store) pin(ctx context.Context, key string) (*goredis.Conn, error) {
	switch c := s.client.(type) {
	case connPinner:
		return c.Conn(), nil
	case nodePinner:
		ctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		return node.Conn(), nil
	}
	return nil, fmt.Errorf("cannot pin a connection on %T", s.client)
}

// waitReplicas sends WAIT after a claim on conn and releases the claim
// when too few replicas acknowledge it. key is the Redis key name, the
// prefix of WithKeyPrefix included.
func (s *Store) waitReplicas(ctx context.Context, conn *goredis.Conn, key, token string) error {
	wctx, cancel := context.WithTimeout(ctx, s.timeout+s.waitTimeout)
	defer cancel()
	wait := func(ctx context.Context) (any, error) {
		return conn.Wait(ctx, s.wait, s.waitTimeout).Result()
	}
	var v any
	var err error
	if s.ctxTimeouts {
		v, err = wait(wctx)
	} else {
		v, err = bounded(wctx, wait)
	}
	n, _ := v.(int64)
	if err == nil && n >= int64(s.wait) {
		return nil
	}
	if err == nil {
		err = fmt.Errorf("%w: %d of %d replicas within %v", ErrNotReplicated, n, s.wait, s.waitTimeout)
	}
	// The claim is not safe to act on: let the next request have the key.
	// Release through the pool, not conn, which may be broken. If the
	// release fails too, the claim lapses at the end of its life.
	if rerr := s.release(context.WithoutCancel(ctx), key, token); rerr != nil && !errors.Is(rerr, store.ErrNotOwner) {
		err = errors.Join(err, rerr)
	}
	return unavailable("claim", err)
}
