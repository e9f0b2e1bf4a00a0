//go:build !linux

package main

// isTerminal reports false off Linux: run writes plain lines there, which
// suit a terminal too.
func isTerminal(uintptr) bool { return false }
