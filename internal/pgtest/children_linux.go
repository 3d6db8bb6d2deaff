package pgtest

import (
	"bytes"
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
