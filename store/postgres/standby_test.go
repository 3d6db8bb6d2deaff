package postgres_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/internal/pgtest"
	"github.com/idemkey/idemkey/store/postgres"
)

// TestHotStandbyIsRefused: a server in recovery (a hot standby: here a
// cluster restarted with standby.signal and no primary, which serves
// read-only queries) is refused at New with ErrReadOnly naming
// pg_is_in_recovery, instead of a Store that answers every request 503.
func TestHotStandbyIsRefused(t *testing.T) {
	srv := pgtest.Start(t)
	pool := newPool(t, srv.URL, 4)
	ctx := context.Background()
	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	srv.Kill()
	if err := os.WriteFile(filepath.Join(srv.Dir, "data", "standby.signal"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	standby := newPool(t, srv.URL, 4)
	_, err := postgres.New(ctx, standby, postgres.WithSweepInterval(0))
	if !errors.Is(err, postgres.ErrReadOnly) || !strings.Contains(err.Error(), "pg_is_in_recovery") {
		t.Errorf("New on a hot standby: %v, want ErrReadOnly naming pg_is_in_recovery", err)
	}
}
