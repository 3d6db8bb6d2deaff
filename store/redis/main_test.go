package redis_test

import (
	"os"
	"sync"
	"testing"

	"github.com/idemkey/idemkey/internal/redistest"
)

// One Redis Cluster serves every cluster test of the package. It starts on
// first use (so a run that selects no cluster test does not pay for it) and
// stops in TestMain.
var (
	clusterOnce sync.Once
	cluster     *redistest.Cluster
	clusterErr  error
)

func sharedCluster(t testing.TB) *redistest.Cluster {
	t.Helper()
	clusterOnce.Do(func() { cluster, clusterErr = redistest.StartCluster(3) })
	if clusterErr != nil {
		redistest.Unavailable(t, clusterErr)
	}
	return cluster
}

func TestMain(m *testing.M) {
	code := m.Run()
	if cluster != nil {
		cluster.Close()
	}
	os.Exit(code)
}
