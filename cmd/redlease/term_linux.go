//go:build linux

package main

import "golang.org/x/sys/unix"

// isTerminal reports whether fd is a terminal: whether it has terminal
// attributes (TCGETS succeeds), as isatty(3) decides.
func isTerminal(fd uintptr) bool {
	_, err := unix.IoctlGetTermios(int(fd), unix.TCGETS)
	return err == nil
}
