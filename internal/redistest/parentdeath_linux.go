package redistest

import (
	"os/exec"
	"syscall"
)

// setParentDeath makes the kernel kill the server if the test binary dies
// without running its cleanups (a panic, a test timeout), so that no server
// outlives the run that started it.
func setParentDeath(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
