//go:build !linux

package proctest

import "os/exec"

// SetParentDeath does nothing where the kernel cannot tie a child's life
// to its parent's: the harnesses' cleanups still stop their servers.
func SetParentDeath(cmd *exec.Cmd) {}
