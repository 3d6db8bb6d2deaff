//go:build !linux

package pgtest

import (
	"errors"
	"time"
)

// children cannot find a process's children without /proc: the
// postmaster alone is signalled, and its backends notice its death on
// their own.
func children(pid int) []int { return nil }

// waitExited cannot see processes without /proc; it waits d/10 instead.
func waitExited(pids []int, d time.Duration) { time.Sleep(d / 10) }

// CPU needs /proc.
func (s *Server) CPU() (time.Duration, error) {
	return 0, errors.New("pgtest: the cluster's CPU time is read from /proc")
}
