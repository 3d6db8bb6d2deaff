package redis

import (
	"context"
	_ "embed"

	goredis "github.com/redis/go-redis/v9"
)

// The scripts that change a key after its claim, the one a waiter marks a
// claim with (Wait), and the one operators' tools delete a key with
// (Delete). Each touches KEYS[1] alone and runs
// with EVALSHA, falling back to EVAL when the server does not have it
// cached (a restart, a failover, a new cluster node), so nothing is loaded
// ahead. The claim itself is a plain SET ... NX GET.
var (
	//go:embed complete.lua
	completeSource string
	//go:embed release.lua
	releaseSource string
	//go:embed extend.lua
	extendSource string
	//go:embed delete.lua
	deleteSource string
	//go:embed mark.lua
	markSource string

	completeScript = newScript(completeSource)
	releaseScript  = newScript(releaseSource)
	extendScript   = newScript(extendSource)
	deleteScript   = newScript(deleteSource)
	markScript     = newScript(markSource)
)

// script is a Lua script and its SHA-1, as EVALSHA names it.
type script struct{ src, sha string }

func newScript(src string) script { return script{src: src, sha: goredis.NewScript(src).Hash()} }

// run runs sc on key with args, within the call budget: EVALSHA, and EVAL
// when the server does not have the script cached.
func (s *Store) run(ctx context.Context, sc script, key string, args ...any) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // send nothing for a caller who has gone
	}
	ctx = s.clock.budget(ctx, s.timeout)
	cmd := evalCmd(ctx, "evalsha", sc.sha, key, args)
	err := s.exec(ctx, nil, cmd)
	if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd = evalCmd(ctx, "eval", sc.src, key, args)
		err = s.exec(ctx, nil, cmd)
	}
	if err != nil {
		return nil, err
	}
	return cmd.Val(), nil
}

// evalCmd returns the command that runs a script (name is "eval" or
// "evalsha") on key, which go-redis routes by key in a cluster.
func evalCmd(ctx context.Context, name, script, key string, args []any) *goredis.Cmd {
	a := make([]any, 0, 4+len(args))
	a = append(a, name, script, 1, key)
	a = append(a, args...)
	cmd := goredis.NewCmd(ctx, a...)
	cmd.SetFirstKeyPos(3)
	return cmd
}
