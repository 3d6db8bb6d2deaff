//go:build !linux

package redistest

import "os/exec"

// setParentDeath does nothing where the kernel cannot tie a child's life to
// its parent's; Close still kills every server by its PID.
func setParentDeath(cmd *exec.Cmd) {}
