package child

import "syscall"

// sysProcAttr makes the kernel kill a child process when the process that
// started it dies, so that a sim or test binary killed with SIGKILL leaves
// none behind. (Pdeathsig fires when the starting thread exits; the Go
// runtime does not end threads it did not lock, and exec does not lock
// one.) Each child also gets its own process group, so that a Ctrl-C at the
// terminal reaches the parent alone, which then stops its children in order
// instead of every process quitting at once on its own.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
