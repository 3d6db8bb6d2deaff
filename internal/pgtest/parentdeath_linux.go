package pgtest

import (
	"os/exec"
	"syscall"
)

// setParentDeath makes the kernel kill the postmaster if the test binary
// dies without running its cleanups (a panic, a test timeout); its
// backends notice the postmaster's death and exit. cmd.SysProcAttr must be
// set.
func setParentDeath(cmd *exec.Cmd) {
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
