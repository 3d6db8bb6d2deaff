package redistest

import (
	"strings"
	"testing"
)

func TestSlot(t *testing.T) {
	// Values from the Redis Cluster specification and CLUSTER KEYSLOT.
	for key, want := range map[string]int{
		"123456789":            12739,
		"foo":                  12182,
		"{user1000}.following": Slot("user1000"),
		"{}.following":         Slot("{}.following"),
		"idem:v1:{abc}":        Slot("abc"),
		"foo{}{bar}":           Slot("foo{}{bar}"),
		"foo{{bar}}zap":        Slot("{bar"),
		"foo{bar}{zap}":        Slot("bar"),
	} {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
}

// TestNodeForSlot checks the node a slot maps to against the ranges the
// cluster's nodes are given, at every boundary: slot 5461 of three nodes
// is the second node's first.
func TestNodeForSlot(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		c := &Cluster{Nodes: make([]*Server, n)}
		for i := range c.Nodes {
			c.Nodes[i] = &Server{Port: i}
		}
		for i := range n {
			lo, hi := slotRange(i, n)
			for _, slot := range []int{lo, hi} {
				if got := c.NodeForSlot(slot); got.Port != i {
					t.Errorf("%d nodes: slot %d on node %d, want %d (range %d-%d)", n, slot, got.Port, i, lo, hi)
				}
			}
		}
		if _, hi := slotRange(n-1, n); hi != 16383 {
			t.Errorf("%d nodes: the last range ends at %d", n, hi)
		}
	}
}

func TestServer(t *testing.T) {
	s := StartServer(t, "--maxmemory", "7mb")
	if got, err := Do(s.Addr, "CONFIG", "GET", "maxmemory"); err != nil || got != "maxmemory\n7340032" {
		t.Fatalf("extra argument not applied: %q, %v", got, err)
	}
	if got, err := Do(s.Addr, "CONFIG", "GET", "save"); err != nil || got != "save\n" {
		t.Errorf("snapshots not off: %q, %v", got, err)
	}
	if _, err := Do(s.Addr, "SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	if got, _ := Do(s.Addr, "GET", "k"); got != "v" {
		t.Errorf("GET k = %q", got)
	}
	if _, err := Do(s.Addr, "NOSUCHCOMMAND"); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Errorf("error reply not returned as error: %v", err)
	}
	f, err := Info(s.Addr, "server")
	if err != nil || f["tcp_port"] != strings.Split(s.Addr, ":")[1] {
		t.Errorf("INFO server: %v %v", f["tcp_port"], err)
	}
	pid := s.PID()
	if pid == 0 {
		t.Fatal("no PID for a running server")
	}
	s.Kill()
	if s.PID() != 0 {
		t.Error("PID of a killed server")
	}
	if _, err := Do(s.Addr, "PING"); err == nil {
		t.Error("killed server still answers")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if s.PID() == pid || s.PID() == 0 {
		t.Errorf("restart PID %d, old %d", s.PID(), pid)
	}
	// Without persistence a restart forgets everything.
	if got, _ := Do(s.Addr, "EXISTS", "k"); got != "0" {
		t.Errorf("EXISTS k after restart = %q", got)
	}
	if err := s.Restart(); err == nil {
		t.Error("restart of a running server accepted")
	}
}
