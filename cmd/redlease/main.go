// Command redlease guards commands with distributed locks on Redis, and
// inspects and checks the nodes it uses: flock(1), but across hosts.
//
//	redlease run --key nightly-settlement -- ./settle.sh
//	redlease inspect nightly-settlement
//	redlease doctor
//
// Nodes come from --nodes or REDLEASE_NODES (comma-separated host:port).
// One node means the single strategy; several mean quorum with fencing on;
// --strategy failover treats the nodes as Sentinels of --master.
//
// Exit codes of run: the command's own status (128+signal if it was killed
// by a signal); 75 when the lock was not obtained (EX_TEMPFAIL); 76 when the
// lock was lost while the command ran (the command was sent SIGTERM, then
// SIGKILL after --grace); 64 for a usage error; 70 for anything else.
package main

import (
	"errors"
	"fmt"
	"os"
)

// Exit codes.
const (
	exitUsage       = 64 // EX_USAGE
	exitSoftware    = 70 // EX_SOFTWARE
	exitNotObtained = 75 // EX_TEMPFAIL: try again later
	exitLost        = 76 // the lock was lost while the command ran
)

// exitError carries an exit code out of a command.
type exitError struct {
	code int
	err  error
}

// Error describes the failure (or just the exit code).
func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

// Unwrap returns the failure.
func (e *exitError) Unwrap() error { return e.err }

func main() {
	os.Exit(run(os.Args[1:]))
}

// run executes the CLI and returns the process's exit code.
func run(args []string) int {
	root := newRoot()
	root.SetArgs(args)
	err := root.Execute()
	var ee *exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if ee.err != nil {
			fmt.Fprintln(os.Stderr, "redlease:", ee.err)
		}
		return ee.code
	}
	fmt.Fprintln(os.Stderr, "redlease:", err)
	return exitUsage
}
