package proctest

import (
	"os/exec"
	"syscall"
)

// SetParentDeath makes the kernel kill cmd's process (SIGKILL) if the
// process that starts it dies, so that no server outlives the test binary
// that started it. It keeps the rest of cmd.SysProcAttr. Call it before
// cmd.Start; Start does.
func SetParentDeath(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
