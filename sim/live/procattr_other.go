//go:build !linux

package live

import "syscall"

// sysProcAttr: elsewhere than on Linux a run's processes are stopped by the
// run's own clean-up only.
func sysProcAttr() *syscall.SysProcAttr { return nil }
