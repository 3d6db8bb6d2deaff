package pgtest

import (
	"os/exec"
	"sync"

	"github.com/idemkey/idemkey/internal/proctest"
)

// proc is a process a harness (Server, PgBouncer) started, through
// proctest (the parent-death signal, the reaping): its command, and a
// channel closed once it has exited and been reaped. Until then its PID is
// still its own, so signals sent to it reach it and no other.
type proc struct {
	mu   sync.Mutex
	cmd  *exec.Cmd
	done <-chan struct{} // closed when cmd has exited
}

// launch starts cmd with proctest.Start and records it.
func (p *proc) launch(cmd *exec.Cmd) (*proctest.Proc, error) {
	pr, err := proctest.Start(cmd)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.cmd, p.done = cmd, pr.Done()
	p.mu.Unlock()
	return pr, nil
}

// current returns the command and its channel as they stand (nil before
// the first start).
func (p *proc) current() (*exec.Cmd, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.done
}

// PID returns the process's id (the postmaster's, pgbouncer's), or 0
// before it started and after it exited.
func (p *proc) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.exited() {
		return 0
	}
	return p.cmd.Process.Pid
}

// exited reports whether the process has exited; p.mu is held or the
// caller holds p.done already.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}
