//go:build redlease_testseam_panic

package main

// afterGroupStart panics once run has taken the lock and started the
// command's group, so that TestInternalErrorExitCode can see a bug's exit
// code (70) from a real process. Only a binary built with the tag
// redlease_testseam_panic has this; no release build does.
func afterGroupStart() {
	panic("redlease_testseam_panic: a bug after the command's group started")
}
