package redlease

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrNotObtained means an attempt to take a lock did not succeed: the key is
// held by someone else, or too few nodes granted it in time. It is safe to
// try again later. Per-node causes, where there are any, are reachable with
// errors.As (*NodeError) on the same error.
var ErrNotObtained = errors.New("redlease: lock not obtained")

// ErrNotHeld means the caller no longer holds the lock it asked to extend or
// release: the key expired, was taken over, or too few nodes confirmed it.
// Work done under the lock since its last confirmed validity must be treated
// as done without it.
var ErrNotHeld = errors.New("redlease: lock not held")

// ErrLost means a lock was lost while its holder still believed in it: its
// validity ran out without a successful renewal, or a renewal showed it was
// no longer held. Lock.Err returns it (wrapping the cause) once Lock.Lost is
// closed.
var ErrLost = errors.New("redlease: lock lost")

// ErrInvalid means an argument or option was rejected (an empty key, a
// non-positive TTL, a nil client, a quorum that cannot be met, ...). The
// error text names the offending value. Retrying will not help.
var ErrInvalid = errors.New("redlease: invalid argument")

// Invalid returns an error that errors.Is ErrInvalid and describes what was
// wrong. Strategies use it to report bad input.
func Invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// NodeError is the failure of one node in an operation: a network error, a
// timeout, a script error, or a reply the node never sent in time.
type NodeError struct {
	Node int    // index of the node in the strategy's node list
	Addr string // the node's address, where the client exposes one
	Err  error  // the cause; errors.Is(err, context.DeadlineExceeded) for timeouts
}

// Error names the node (index and address) and the cause.
func (e *NodeError) Error() string {
	if e.Addr != "" {
		return fmt.Sprintf("node %d (%s): %v", e.Node, e.Addr, e.Err)
	}
	return fmt.Sprintf("node %d: %v", e.Node, e.Err)
}

// Unwrap returns the cause.
func (e *NodeError) Unwrap() error { return e.Err }

// QuorumError reports an operation across several nodes that did not reach
// its quorum. It unwraps to its sentinel (ErrNotObtained for acquire,
// ErrNotHeld for extend and release) and to every per-node cause, so both
// errors.Is(err, ErrNotObtained) and errors.As(err, &nodeErr) work.
type QuorumError struct {
	Action  string        // "acquire", "extend" or "release"
	Votes   int           // nodes that agreed before the decision
	Quorum  int           // nodes that had to agree
	Nodes   int           // nodes asked
	Elapsed time.Duration // time from the first request to the decision
	Expired bool          // a quorum agreed, but too late: no validity was left
	Err     error         // the sentinel
	Causes  []error       // one *NodeError per failed node (ErrQueued in fair mode); nil if none failed
	// Unavailable is set on an acquisition that failures (nodes down,
	// timed out, erroring) decided rather than refusals: not enough nodes
	// said "taken" to rule the quorum out. The error then also matches
	// ErrUnavailable, while still matching ErrNotObtained.
	Unavailable bool
	// Remaining, on an acquisition, is the longest remaining TTL of the
	// holder's key among the nodes that refused, as they measured it when
	// they refused; 0 if none reported one. Locker.Lock bounds its wait by
	// it.
	Remaining time.Duration
}

// Error says how many nodes agreed out of how many, how many were needed,
// how long it took, and every per-node cause.
func (e *QuorumError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v", e.Err)
	if e.Unavailable {
		b.WriteString(" (nodes unavailable)")
	}
	fmt.Fprintf(&b, ": %s: %d of %d nodes agreed, %d needed, after %s",
		e.Action, e.Votes, e.Nodes, e.Quorum, e.Elapsed.Round(time.Microsecond))
	if e.Expired {
		b.WriteString(", with no validity left")
	}
	for _, c := range e.Causes {
		b.WriteString("; ")
		b.WriteString(c.Error())
	}
	return b.String()
}

// Unwrap returns the sentinel (and ErrUnavailable when Unavailable is set)
// followed by every per-node cause.
func (e *QuorumError) Unwrap() []error {
	errs := []error{e.Err}
	if e.Unavailable && e.Err != ErrUnavailable {
		errs = append(errs, ErrUnavailable)
	}
	errs = append(errs, e.Causes...)
	return errs
}

// HeldError is the error of an acquisition that one node refused because
// another token holds the key there (the one-primary strategies). It
// matches ErrNotObtained with errors.Is, and carries the holder's
// remaining TTL, which Locker.Lock bounds its wait by.
type HeldError struct {
	// Remaining is the TTL the holder's key had left (PTTL) when the node
	// refused.
	Remaining time.Duration
}

// Error says the lock is held, and for how long at most.
func (e *HeldError) Error() string {
	return "redlease: lock not obtained: held by another token for up to " + e.Remaining.String()
}

// Unwrap returns ErrNotObtained.
func (e *HeldError) Unwrap() error { return ErrNotObtained }

// holderRemaining reads the holder's remaining TTL from a refused
// acquisition's error: a *HeldError, or a *QuorumError that carries one.
func holderRemaining(err error) (time.Duration, bool) {
	var he *HeldError
	if errors.As(err, &he) {
		return he.Remaining, true
	}
	var qe *QuorumError
	if errors.As(err, &qe) && qe.Remaining > 0 {
		return qe.Remaining, true
	}
	return 0, false
}

// ErrUnavailable means too few nodes answered in time to decide an extend or
// release either way. The lock may still be held; its last Until still
// bounds it. Per-node causes are reachable with errors.As (*NodeError).
//
// An acquisition that failed because nodes were down or timed out, rather
// than because the lock is held, returns an error that matches both
// ErrNotObtained and ErrUnavailable.
var ErrUnavailable = errors.New("redlease: too few nodes answered")

// chain is err1: err2: … on one line, each message once: a cause that
// starts with the "redlease: " prefix the sentinel before it already shows
// loses it. errors.Is and errors.As see every error in it.
type chain []error

func (c chain) Error() string {
	var b strings.Builder
	for i, e := range c {
		m := e.Error()
		if i > 0 {
			b.WriteString(": ")
			m = strings.TrimPrefix(m, "redlease: ")
		}
		b.WriteString(m)
	}
	return b.String()
}

func (c chain) Unwrap() []error { return c }

// Wrap returns err followed by cause on one line, "err: cause", where a
// cause that starts with the "redlease: " prefix loses it (the message
// shows it once); errors.Is and errors.As see both. A nil cause returns
// err. Strategies use it to put a sentinel in front of a cause.
func Wrap(err, cause error) error {
	if cause == nil {
		return err
	}
	return chain{err, cause}
}
