package live

import "syscall"

// sysProcAttr makes the kernel kill a run's processes when the process that
// started them dies, so that a sim killed with SIGKILL leaves none behind.
// (Pdeathsig fires when the starting thread exits; the Go runtime does not
// end threads it did not lock, and exec does not lock one.) Each process
// also gets its own process group, so that a Ctrl-C at the terminal reaches
// sim alone, which then stops the processes in order (see cluster.Close)
// instead of every process quitting at once on its own.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
