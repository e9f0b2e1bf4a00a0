//go:build unix && !linux

package main

import (
	"os"
	"syscall"
)

// leaderAttr puts the leader in a process group of its own. Without
// Pdeathsig the leader notices run's death by polling its parent pid.
func leaderAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func selfExe() (string, error) { return os.Executable() }

// becomeSubreaper does nothing here: orphans go to init, and run waits for
// the group by polling it.
func becomeSubreaper() {}
