package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// redisServer is the redis-server the driver starts for the run: loopback
// only, on a free port, keeping nothing on disk, stopped by its PID.
type redisServer struct {
	addr string
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

func startRedis(bin string) (*redisServer, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("%s not found: install Redis 7 (apt-get install redis-server) or pass -redis-server", bin)
	}
	dir, err := os.MkdirTemp("", "idemkey-load-redis-")
	if err != nil {
		return nil, err
	}
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			break
		}
		s := &redisServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, done: make(chan struct{})}
		s.cmd = exec.Command(path,
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--dir", dir, "--save", "", "--appendonly", "no",
			"--daemonize", "no", "--logfile", "redis.log")
		s.cmd.Dir = dir
		s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := s.cmd.Start(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		go func() { s.cmd.Wait(); close(s.done) }()
		if s.waitReady() == nil {
			return s, nil
		}
		s.kill()
	}
	os.RemoveAll(dir)
	return nil, errors.New("redis-server did not start; see its log in " + dir)
}

func (s *redisServer) waitReady() error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return errors.New("redis-server exited")
		default:
		}
		if reply, err := redisDo(s.addr, "PING"); err == nil && reply == "PONG" {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("redis-server did not answer PING")
}

// kill stops the server by its PID and waits for it to exit.
func (s *redisServer) kill() {
	select {
	case <-s.done:
		return
	default:
	}
	syscall.Kill(s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
}

func (s *redisServer) close() {
	s.kill()
	os.RemoveAll(s.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// redisStats is the part of INFO the table uses.
type redisStats struct {
	calls map[string]int64 // per command, from INFO commandstats
	usec  map[string]int64
	cpu   float64 // used_cpu_user plus used_cpu_sys, seconds
}

// notCounted lists commands that are the driver's or a client's
// housekeeping, not a request's work.
var notCounted = map[string]bool{"info": true, "ping": true, "hello": true, "client": true, "client|setinfo": true, "config": true, "command": true}

func readRedisStats(addr string) (redisStats, error) {
	st := redisStats{calls: map[string]int64{}, usec: map[string]int64{}}
	reply, err := redisDo(addr, "INFO", "commandstats")
	if err != nil {
		return st, err
	}
	for _, line := range strings.Split(reply, "\n") {
		// cmdstat_evalsha:calls=12,usec=34,usec_per_call=2.83,...
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				st.calls[name] = n
			case "usec":
				st.usec[name] = n
			}
		}
	}
	reply, err = redisDo(addr, "INFO", "cpu")
	if err != nil {
		return st, err
	}
	for _, line := range strings.Split(reply, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			st.cpu += f
		}
	}
	return st, nil
}

// redisDelta is what a cell cost Redis: commands run (those a client sent
// and those scripts ran inside Redis alike), their time, and the server's
// CPU time.
type redisDelta struct {
	calls map[string]int64
	usec  map[string]int64
	cpu   float64 // seconds
}

func (a redisStats) delta(b redisStats) redisDelta {
	d := redisDelta{cpu: b.cpu - a.cpu, calls: map[string]int64{}, usec: map[string]int64{}}
	for name, n := range b.calls {
		if notCounted[name] || strings.HasPrefix(name, "client") {
			continue
		}
		if c := n - a.calls[name]; c > 0 {
			d.calls[name] = c
			d.usec[name] = b.usec[name] - a.usec[name]
		}
	}
	return d
}

func (d *redisDelta) add(o redisDelta) {
	if d.calls == nil {
		d.calls, d.usec = map[string]int64{}, map[string]int64{}
	}
	d.cpu += o.cpu
	for k, v := range o.calls {
		d.calls[k] += v
	}
	for k, v := range o.usec {
		d.usec[k] += v
	}
}

// sentUsec returns the time Redis spent on the commands clients sent: a
// script's time includes the commands it ran, so the commands scripts ran
// count only in the share of their calls that clients sent themselves.
func (d redisDelta) sentUsec(sent map[string]int64) float64 {
	var t float64
	for name, calls := range d.calls {
		if calls == 0 {
			continue
		}
		share := min(1, float64(sent[name])/float64(calls))
		t += share * float64(d.usec[name])
	}
	return t
}

// redisDo sends one command on a new connection and returns its reply as
// text: a status or bulk string as is, an integer in decimal, an error
// reply as an error.
func redisDo(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write(b.Bytes()); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}
