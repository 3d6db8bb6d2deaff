//go:build !linux

package pgtest

import "os/exec"

// setParentDeath does nothing where the kernel cannot tie a child's life to
// its parent's; Close still kills every cluster by its process group.
func setParentDeath(cmd *exec.Cmd) {}
