//go:build !unix

package redistest

// reservePort does nothing where package syscall has no portable sockets;
// Restart relies on its retries instead.
func reservePort(port int) (release func()) { return func() {} }
