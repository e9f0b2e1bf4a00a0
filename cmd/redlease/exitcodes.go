package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
)

// Exit codes, aligned with flock(1), the shells and sysexits.h. Codes that
// run reports about itself (64–78) come with a "redlease:" line on stderr;
// the command's own status passes through unchanged, so a command that
// exits 75 itself is indistinguishable from "held", as with flock -E.
const (
	exitOK          = 0
	exitUnsafe      = 1   // doctor: at least one finding is unsafe for locking
	exitNotReleased = 1   // release: nothing was released (declined, or not held by the token)
	exitUsage       = 64  // EX_USAGE: bad flags, node list, TTL, grace, strategy
	exitUnavailable = 69  // EX_UNAVAILABLE: too few nodes answered to decide
	exitSoftware    = 70  // EX_SOFTWARE: an internal error (a bug in redlease)
	exitOSErr       = 71  // EX_OSERR: a system error: the command's process group could not be started
	exitIOErr       = 74  // EX_IOERR: output could not be written
	exitNotObtained = 75  // EX_TEMPFAIL: the lock is held by another (within --wait)
	exitLost        = 76  // the lock was lost while the command ran; its group was stopped
	exitNoPerm      = 77  // EX_NOPERM: the nodes refused the user's ACL rights (NOPERM)
	exitConfig      = 78  // EX_CONFIG: the nodes refused the credentials (NOAUTH, WRONGPASS)
	exitCannotExec  = 126 // the command exists but cannot be executed (as in sh)
	exitNotFound    = 127 // the command was not found (as in sh)
	exitSignalBase  = 128 // 128+n: the command was killed by signal n, or run got signal n (INT 130, TERM 143, HUP 129) and passed it on
)

// exitRow is one row of the documented table.
type exitRow struct {
	code string
	what string
}

// exitTable is the table printed in run's help and repeated, word for word,
// in the package documentation (TestExitTableDocumented checks both).
var exitTable = []exitRow{
	{"0", "the command exited 0 (inspect: a majority answered; doctor: nothing unsafe; release: the token was deleted)"},
	{"1-125", "the command's own exit status (doctor: 1 when a finding is unsafe; release: 1 when nothing was released)"},
	{"64", "usage: bad flags, node list, TTL, --grace or strategy (EX_USAGE)"},
	{"69", "unavailable: too few nodes answered to tell free from held (EX_UNAVAILABLE)"},
	{"70", "internal error: a bug in redlease; the command's group dies with run, the lock lapses at its TTL (EX_SOFTWARE)"},
	{"71", "the command's process group could not be started: fork failed, or no /proc/self/exe (EX_OSERR)"},
	{"74", "inspect, doctor, release: the output could not be written (EX_IOERR)"},
	{"75", "the lock is held by another holder, within --wait (EX_TEMPFAIL)"},
	{"76", "the lock was lost while the command ran; its process group was stopped"},
	{"77", "denied: the user lacks ACL rights redlease needs, NOPERM (EX_NOPERM)"},
	{"78", "denied: a missing or wrong user or password, NOAUTH or WRONGPASS (EX_CONFIG)"},
	{"126", "the command was found but cannot be executed"},
	{"127", "the command was not found"},
	{"128+n", "the command was killed by signal n, or run got signal n (HUP 129, INT 130, TERM 143), passed it on and released the lock"},
}

// exitTableText renders exitTable as an indented two-column list.
func exitTableText(indent string) string {
	var b strings.Builder
	for _, r := range exitTable {
		fmt.Fprintf(&b, "%s%-6s %s\n", indent, r.code, r.what)
	}
	return b.String()
}

// deniedHint is what doctor says of a user without the rights, for a run
// the nodes denied.
const deniedHint = "check --user and the password ($REDLEASE_PASSWORD), grant the user the rights in docs/redis-acl.conf (the lock prefix, redlease:*, EVAL/EVALSHA and the commands the scripts call), and run `redlease doctor` to check"

// deniedExit is the exit of what errors.Is redlease.ErrDenied: 77
// (EX_NOPERM) when a node refused a right (NOPERM), 78 (EX_CONFIG) when it
// refused the credentials (NOAUTH, WRONGPASS); the message has the
// server's reply and deniedHint.
func deniedExit(what string, err error) *exitError {
	code := exitConfig
	if redis.IsPermissionError(err) {
		code = exitNoPerm
	}
	return &exitError{code, redlease.Wrap(errors.New(what), hinted{err})}
}

// hinted is a denial followed by deniedHint.
type hinted struct{ error }

func (h hinted) Error() string { return h.error.Error() + "; " + deniedHint }

func (h hinted) Unwrap() error { return h.error }
