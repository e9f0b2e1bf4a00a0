//go:build unix

package renew_test

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user and system) this process used so far.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
