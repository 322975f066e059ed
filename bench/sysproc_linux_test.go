package bench

import "syscall"

// sysProcAttr kills redis-server if the test binary dies without cleaning up
// (a -timeout panic, a kill), so no server outlives its run.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
