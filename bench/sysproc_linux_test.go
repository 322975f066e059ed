package bench

import (
	"syscall"
	"time"
)

// sysProcAttr kills redis-server if the test binary dies without cleaning up
// (a -timeout panic, a kill), so no server outlives its run.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// processCPUTime is the CPU time (user and system) this process has used.
func processCPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
