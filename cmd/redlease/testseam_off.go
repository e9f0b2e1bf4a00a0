//go:build !redlease_testseam_panic

package main

// afterGroupStart is a test seam (see testseam_panic.go); in every build
// without the redlease_testseam_panic tag it does nothing.
func afterGroupStart() {}
