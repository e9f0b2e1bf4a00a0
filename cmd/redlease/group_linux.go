//go:build linux

package main

import "syscall"

// leaderAttr puts the leader in a process group of its own and has the
// kernel send it SIGTERM when the thread that started it (see startGroup)
// ends: when run dies, however it dies.
func leaderAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}

// selfExe is this binary, even if its file was replaced since it started.
func selfExe() (string, error) { return "/proc/self/exe", nil }

// becomeSubreaper makes orphaned descendants of this process its children
// (PR_SET_CHILD_SUBREAPER) instead of init's, so it can wait for them.
func becomeSubreaper() {
	const prSetChildSubreaper = 36
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}
