//go:build !linux

package bench

import (
	"syscall"
	"time"
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

// processCPUTime is 0 where this package does not read it.
func processCPUTime() time.Duration { return 0 }
