// Command redlease guards commands with distributed locks on Redis, and
// inspects and checks the nodes it uses: flock(1), but across hosts.
//
//	redlease run --key nightly-settlement -- ./settle.sh
//	redlease inspect nightly-settlement
//	redlease release --force nightly-settlement
//	redlease doctor
//
// Nodes come from --nodes or REDLEASE_NODES (comma-separated host:port).
// One node means the single strategy; several mean quorum with fencing on;
// --strategy failover treats the nodes as Sentinels of --master: run starts
// a Sentinel watcher (a failover revokes the lock at once), and inspect and
// doctor talk to the primary the Sentinels name.
//
// # run as a supervisor
//
// run starts the command in a process group of its own, led by a small
// redlease process (the group leader) that starts the command, reaps
// everything it leaves behind and, on Linux, dies with run (Pdeathsig): if
// run itself is killed, even with SIGKILL, the leader kills the whole group
// at once, long before the lock's TTL lets anyone else in.
//
// Known limits, not solved:
//   - A process that leaves the group (setsid, setpgid, a daemon that
//     double-forks into a new session) is out of run's reach: no signal
//     reaches it. On Linux the leader, its subreaper, waits for it while
//     the command ends normally; but when the group is killed (lock lost,
//     a signal to run) the leader dies with it, and run releases the lock
//     while that process may still write. Do not daemonize under run.
//   - A process of the group that survives SIGKILL for 10 s (stuck in the
//     kernel, e.g. on a hung NFS mount) makes run exit 76 without
//     releasing the lock: the key lapses at its TTL, and that process may
//     still act once it wakes. Fences (REDLEASE_FENCE) are the defence.
//   - An internal error (70) or run being killed leaves the lock to lapse
//     at its TTL; the group is killed at once by its leader.
//
// While the command runs, run keeps the lock alive. When the lock is lost,
// run sends SIGTERM to the whole group, then SIGKILL after --grace, and no
// later than the lock's validity (Until) minus a safety margin of a quarter
// of the loss margin; when the loss is certain (a node said the key is no
// longer ours, or the primary failed over) it sends SIGKILL at once. --grace
// must fit in the loss margin (at most three quarters of it) or run refuses
// to start. SIGINT, SIGTERM and SIGHUP sent to run are passed on to the
// group, which gets --grace to exit before SIGKILL. In every case run
// releases the lock only once every process of the group is gone: a command
// that leaves background processes behind keeps the lock until they exit,
// as with flock(1), whose descriptor they inherit. Being in its own group,
// the command is in the background of a terminal: run is meant for
// unattended jobs.
//
// # Holder metadata
//
// The lock's value stays a plain random token, as redsync writes it, so
// redsync and the library can share lock names. Beside it, on every node
// that granted it, run writes a hash redlease:holder:{KEY} (KEY with the
// prefix; redlease:holder:tag:KEY for a key with a hash tag) with host,
// pid, start time, command and token, only while the lock key still holds
// that token, with the lock key's remaining TTL; run refreshes it every
// third of the TTL and deletes it before releasing. inspect shows it,
// on every node where its token matches the lock's. The command is the
// program only (CMD's first word): anyone allowed to read the lock keys
// reads the record, and arguments may carry secrets. --record-args records
// the whole command line.
//
// While run --wait waits, stderr says who holds the lock and how long run
// has waited: on a terminal one line redrawn in place every second; on
// anything else a plain line every 30 s, never a carriage return. Exit 75
// names the holder (host, pid, program) when it left a record.
//
// # Revoking a lock
//
// release --force KEY shows KEY as inspect does, asks for confirmation on
// the terminal (unless --yes) and deletes KEY on every node where it still
// holds the token shown (--token names another), and nowhere else: a key
// that changed hands meanwhile is left alone, and release exits 1. The
// revoked holder learns at its next renewal (run then stops its command
// and exits 76); until then it may still act, and only fences
// (REDLEASE_FENCE) keep its writes out of storage.
//
// # Exit codes
//
//	0      the command exited 0 (inspect: a majority answered; doctor: nothing unsafe; release: the token was deleted)
//	1-125  the command's own exit status (doctor: 1 when a finding is unsafe; release: 1 when nothing was released)
//	64     usage: bad flags, node list, TTL, --grace or strategy (EX_USAGE)
//	69     unavailable: too few nodes answered to tell free from held (EX_UNAVAILABLE)
//	70     internal error: a bug in redlease; the command's group dies with run, the lock lapses at its TTL (EX_SOFTWARE)
//	71     the command's process group could not be started: fork failed, or no /proc/self/exe (EX_OSERR)
//	74     inspect, doctor, release: the output could not be written (EX_IOERR)
//	75     the lock is held by another holder, within --wait (EX_TEMPFAIL)
//	76     the lock was lost while the command ran; its process group was stopped
//	77     denied: the user lacks ACL rights redlease needs, NOPERM (EX_NOPERM)
//	78     denied: a missing or wrong user or password, NOAUTH or WRONGPASS (EX_CONFIG)
//	126    the command was found but cannot be executed
//	127    the command was not found
//	128+n  the command was killed by signal n, or run got signal n (HUP 129, INT 130, TERM 143), passed it on and released the lock
//
// Codes run reports about itself come with a "redlease:" line on stderr.
// As with flock(1) and the shells, a command's own status can collide with
// them; 126 and 127 are checked before the lock is taken.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"

	"github.com/redis/go-redis/v9"
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
	if len(os.Args) > 1 && os.Args[1] == leaderArg {
		os.Exit(leaderMain(os.Args[2:]))
	}
	// go-redis logs dial failures and pool trouble on its own; run reports
	// what matters, once, with its exit code.
	redis.SetLogger(quietLogger{})
	os.Exit(run(os.Args[1:]))
}

// outWriter passes output on and remembers the first write that failed.
type outWriter struct {
	w   io.Writer
	err error
}

func (o *outWriter) Write(p []byte) (int, error) {
	if o.err != nil {
		return 0, o.err
	}
	n, err := o.w.Write(p)
	o.err = err
	return n, err
}

// check is an I/O error (74) if some output could not be written.
func (o *outWriter) check() error {
	if o.err != nil {
		return &exitError{exitIOErr, o.err}
	}
	return nil
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// run executes the CLI and returns the process's exit code: 70 if it
// panics (a bug). Then the process exits without releasing a lock it
// holds: the group leader kills the command's group as run exits, and the
// lock lapses at its TTL. A panic on another goroutine ends the process
// with Go's exit status 2; the group leader kills the group all the same.
func run(args []string) (code int) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "redlease: internal error (a bug in redlease; please report it): %v\n%s", r, debug.Stack())
			code = exitSoftware
		}
	}()
	root := newRoot()
	root.SetArgs(args)
	err := root.Execute()
	var ee *exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ee):
		if ee.err != nil {
			report(ee.err)
		}
		return ee.code
	}
	report(err)
	return exitUsage
}

// report prints err on stderr with the redlease: prefix once (errors from
// the library already start with it).
func report(err error) {
	fmt.Fprintln(os.Stderr, "redlease:", strings.TrimPrefix(err.Error(), "redlease: "))
}
