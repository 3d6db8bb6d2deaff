package pgtest

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// waitExited waits, up to d, until each process in pids has exited (it is
// gone, or a zombie: it holds no memory any more).
func waitExited(pids []int, d time.Duration) {
	deadline := time.Now().Add(d)
	for _, pid := range pids {
		for time.Now().Before(deadline) {
			b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
			if err != nil {
				break
			}
			i := bytes.LastIndexByte(b, ')')
			if f := bytes.Fields(b[i+1:]); i < 0 || len(f) == 0 || string(f[0]) == "Z" || string(f[0]) == "X" {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// children returns the ids of the processes whose parent is pid, from
// /proc.
func children(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:])
		if len(f) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(string(f[1])); ppid == pid {
			out = append(out, c)
		}
	}
	return out
}

// CPU returns the processor time (user and system) the cluster has used so
// far: the postmaster's own, its running children's, and the exited
// children's it has reaped. /proc counts it in ticks of 10 ms.
func (s *Server) CPU() (time.Duration, error) {
	pid := s.PID()
	if pid == 0 {
		return 0, fmt.Errorf("pgtest: %s is not running", s.Addr)
	}
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	// After the command: state ppid ... utime(11) stime(12) cutime(13) cstime(14).
	ticks := f[11] + f[12] + f[13] + f[14]
	for _, c := range children(pid) {
		if cf, err := statFields(c); err == nil {
			ticks += cf[11] + cf[12]
		}
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// statFields returns the numeric fields of /proc/pid/stat after the
// command name (the state, field 0, reads as 0).
func statFields(pid int) ([]int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("pgtest: /proc/%d/stat unreadable", pid)
	}
	fields := bytes.Fields(b[i+1:])
	if len(fields) < 15 {
		return nil, fmt.Errorf("pgtest: /proc/%d/stat has %d fields", pid, len(fields))
	}
	out := make([]int64, len(fields))
	for j, f := range fields {
		out[j], _ = strconv.ParseInt(string(f), 10, 64)
	}
	return out, nil
}
