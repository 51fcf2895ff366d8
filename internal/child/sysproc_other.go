//go:build !linux

package child

import "syscall"

// sysProcAttr: elsewhere than on Linux child processes are stopped by
// their parent's own clean-up only.
func sysProcAttr() *syscall.SysProcAttr { return nil }
