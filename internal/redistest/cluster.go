package redistest

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Cluster is a Redis Cluster of masters without replicas, each a Server on
// loopback, with the 16384 hash slots split evenly between them.
type Cluster struct {
	// Nodes are the masters; Nodes[i] serves the i-th range of slots.
	Nodes []*Server
}

// StartCluster starts a Redis Cluster of masters (3 or more) on free
// loopback ports, each with an explicit cluster bus port, and waits until
// every node reports cluster_state:ok. It takes no testing.TB so that
// TestMain can start one cluster for a whole package; the caller must call
// Close. Without a redis-server binary it returns ErrNotInstalled, which
// tests pass to Unavailable.
func StartCluster(masters int) (*Cluster, error) {
	if masters < 3 {
		return nil, errors.New("redistest: a cluster needs at least 3 masters")
	}
	bin, err := binary()
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	for i := 0; i < masters; i++ {
		s, err := startClusterNode(bin)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Nodes = append(c.Nodes, s)
	}
	if err := c.form(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func startClusterNode(bin string) (*Server, error) {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		var port, bus int
		if port, err = FreePort(); err != nil {
			return nil, err
		}
		if bus, err = FreePort(); err != nil {
			return nil, err
		}
		if bus == port {
			continue
		}
		var s *Server
		s, err = start(bin, "", port, []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(bus),
			"--cluster-node-timeout", "3000",
		})
		if err == nil {
			return s, nil
		}
	}
	return nil, err
}

// form assigns the slots, introduces the nodes to each other and waits for
// the cluster to agree.
func (c *Cluster) form() error {
	n := len(c.Nodes)
	for i, s := range c.Nodes {
		if _, err := Do(s.Addr, "CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i+1)); err != nil {
			return fmt.Errorf("redistest: cluster epoch on %s: %w", s.Addr, err)
		}
		lo, hi := slotRange(i, n)
		if _, err := Do(s.Addr, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi)); err != nil {
			return fmt.Errorf("redistest: cluster slots on %s: %w", s.Addr, err)
		}
	}
	first := c.Nodes[0]
	for _, s := range c.Nodes[1:] {
		bus := busPort(s)
		if _, err := Do(first.Addr, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(s.Port), bus); err != nil {
			return fmt.Errorf("redistest: cluster meet %s: %w", s.Addr, err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok := true
		for _, s := range c.Nodes {
			info, err := Do(s.Addr, "CLUSTER", "INFO")
			f := ParseInfo(info)
			if err != nil || f["cluster_state"] != "ok" || f["cluster_known_nodes"] != strconv.Itoa(n) {
				ok = false
				break
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("redistest: cluster did not reach cluster_state:ok:\n" + first.LogTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func busPort(s *Server) string {
	for i, a := range s.args {
		if a == "--cluster-port" && i+1 < len(s.args) {
			return s.args[i+1]
		}
	}
	return strconv.Itoa(s.Port + 10000)
}

// Addrs returns the nodes' addresses, to seed a ClusterClient.
func (c *Cluster) Addrs() []string {
	a := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		a[i] = s.Addr
	}
	return a
}

// NodeForSlot returns the node that serves slot (0 to 16383).
func (c *Cluster) NodeForSlot(slot int) *Server {
	n := len(c.Nodes)
	for i := range n {
		if _, hi := slotRange(i, n); slot <= hi {
			return c.Nodes[i]
		}
	}
	return c.Nodes[n-1]
}

// slotRange returns the first and last slot node i of n serves.
func slotRange(i, n int) (lo, hi int) {
	return i * 16384 / n, (i+1)*16384/n - 1
}

// Close kills every node and removes its directory.
func (c *Cluster) Close() {
	for _, s := range c.Nodes {
		s.Close()
	}
}

// Slot returns the Redis Cluster hash slot of key, honouring a {hash tag}
// as Redis does.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % 16384)
}

// crc16 is CRC-16/XMODEM, the checksum Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
