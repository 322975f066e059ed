package redistest

import "syscall"

// sysProcAttr asks the kernel to SIGKILL the child when the test binary dies,
// so that a test binary killed by `go test -timeout` or ^C leaves no
// redis-server behind. (The signal is tied to the OS thread that started the
// child; the Go runtime only ends threads that a goroutine left locked with
// runtime.LockOSThread, which these tests do not do.)
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
