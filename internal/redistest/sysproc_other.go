//go:build !linux

package redistest

import "syscall"

// sysProcAttr returns nil: only Linux can tie a child's life to its parent.
// Cleanup still kills every process when the test ends normally.
func sysProcAttr() *syscall.SysProcAttr { return nil }
