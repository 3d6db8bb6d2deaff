package redistest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// SentinelConfig tunes how fast a Sentinel fails over. Zero fields take the
// defaults named on them.
type SentinelConfig struct {
	// DownAfter is how long the master must be unreachable before the
	// sentinel declares it down (down-after-milliseconds). Default 1 s:
	// much shorter, and a loaded machine makes the sentinel take a healthy
	// new master for down right after a failover.
	DownAfter time.Duration
	// FailoverTimeout is the sentinel's failover-timeout. Default 3 s.
	FailoverTimeout time.Duration
}

// Sentinel is a master, one replica of it, and one Sentinel watching the
// master under the name MasterName with a quorum of 1.
type Sentinel struct {
	// Master and Replica are the data servers as started; after a failover
	// Replica is the master.
	Master, Replica *Server
	// Sentinel is the sentinel process.
	Sentinel *Server
	// MasterName is the name the sentinel monitors the master under.
	MasterName string
}

// StartSentinel starts a master, a replica that has finished its first
// sync, and a Sentinel that knows both, each on a free loopback port with a
// fresh directory, and stops them by PID when the test ends. Without a
// redis-server binary the test is skipped, or failed when CI is set.
func StartSentinel(t testing.TB, cfg SentinelConfig) *Sentinel {
	t.Helper()
	if cfg.DownAfter <= 0 {
		cfg.DownAfter = time.Second
	}
	if cfg.FailoverTimeout <= 0 {
		cfg.FailoverTimeout = 3 * time.Second
	}
	bin := Require(t)
	ss := &Sentinel{MasterName: "idemkey"}
	var err error
	if ss.Master, err = start(bin, "", 0, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ss.Master.Close)
	ss.Replica = StartReplica(t, ss.Master)
	s := &Server{bin: bin, sentinel: fmt.Sprintf(
		"sentinel monitor %[1]s 127.0.0.1 %[2]d 1\n"+
			"sentinel down-after-milliseconds %[1]s %[3]d\n"+
			"sentinel failover-timeout %[1]s %[4]d\n"+
			"sentinel parallel-syncs %[1]s 1\n",
		ss.MasterName, ss.Master.Port, cfg.DownAfter.Milliseconds(), cfg.FailoverTimeout.Milliseconds())}
	if err := startSentinel(s); err != nil {
		t.Fatal(err)
	}
	ss.Sentinel = s
	t.Cleanup(s.Close)
	if err := waitFor(15*time.Second, func() bool {
		r, err := Do(s.Addr, "SENTINEL", "REPLICAS", ss.MasterName)
		return err == nil && strings.Contains(r, strconv.Itoa(ss.Replica.Port))
	}); err != nil {
		t.Fatalf("redistest: sentinel %s never found the replica:\n%s", s.Addr, s.LogTail())
	}
	return ss
}

func startSentinel(s *Server) error {
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return err
	}
	s.Dir, s.ownDir = dir, true
	for attempt := 0; attempt < 5; attempt++ {
		var port int
		if port, err = FreePort(); err != nil {
			break
		}
		if err = s.run(port); err == nil {
			return nil
		}
	}
	os.RemoveAll(dir)
	return err
}

// StartReplica starts a replica of master on a free loopback port, waits
// until its first sync is done, and stops it by PID when the test ends.
func StartReplica(t testing.TB, master *Server) *Server {
	t.Helper()
	r, err := start(Require(t), "", 0, []string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	if err := waitFor(10*time.Second, func() bool {
		f, err := Info(r.Addr, "replication")
		return err == nil && f["master_link_status"] == "up"
	}); err != nil {
		t.Fatalf("redistest: replica %s never synced with %s:\n%s", r.Addr, master.Addr, r.LogTail())
	}
	return r
}

// SentinelAddrs returns the sentinel's address, to seed a FailoverClient.
func (ss *Sentinel) SentinelAddrs() []string { return []string{ss.Sentinel.Addr} }

// CurrentMaster asks the sentinel which address it holds as the master.
func (ss *Sentinel) CurrentMaster() (string, error) {
	r, err := Do(ss.Sentinel.Addr, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", ss.MasterName)
	if err != nil {
		return "", err
	}
	host, port, ok := strings.Cut(r, "\n")
	if !ok {
		return "", fmt.Errorf("redistest: sentinel answered %q", r)
	}
	return host + ":" + port, nil
}

func waitFor(d time.Duration, ok func() bool) error {
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: condition not met within %v", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}
