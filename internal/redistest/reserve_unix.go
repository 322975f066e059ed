//go:build unix

package redistest

import "syscall"

// reservePort binds, without listening, a TCP socket to 127.0.0.1:port and
// returns a function that closes it. While the socket is held, the kernel
// picks this port neither for a "127.0.0.1:0" listener (another test's
// server) nor as the local port of an outgoing connection, so a killed
// server's port is still free when Restart needs it. Connections to the port
// are refused, just as with no socket at all. SO_REUSEADDR lets the bind
// succeed while the killed server's connections linger in TIME_WAIT (and, on
// Linux, lets a program that asks for this very port bind it anyway).
//
// The reservation is best effort: on any error it returns a no-op and
// Restart relies on its retries instead.
func reservePort(port int) (release func()) {
	// Hold ForkLock so that no child started meanwhile inherits the socket
	// before it is marked close-on-exec (the pattern package syscall uses
	// where SOCK_CLOEXEC is unavailable).
	syscall.ForkLock.RLock()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return func() {}
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		_ = syscall.Close(fd)
		return func() {}
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		_ = syscall.Close(fd)
		return func() {}
	}
	return func() { _ = syscall.Close(fd) }
}
