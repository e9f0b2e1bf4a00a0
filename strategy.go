package redlease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Strategy places, extends and removes one lock key on some arrangement of
// Redis nodes. Implementations live in the single, quorum and failover
// packages; Locker turns one into locks with retries, tokens and fences.
//
// A Strategy makes exactly one attempt per call and never retries on its own,
// so the caller's retry policy is the only one in play. Every method must be
// safe for concurrent use.
//
// Tokens are compared byte for byte. An Acquire that finds key already held
// under the same token counts that as a grant (a retried request whose
// first reply was lost must not see its own lock as taken).
//
// Locker.Lock gives every attempt a token of its own, "<base>.<n>": one
// random base (base64url, no '.') per Lock call, and the attempt number n.
// A failed attempt's cleanup compares its own token, so however late it
// lands it cannot remove a key a later attempt counted. The strategies of
// this module also let attempt n take over a key held by attempt m < n of
// the same base (the earlier attempt's reply was lost and its cleanup has
// not landed yet), so that a lost reply does not block the key until its
// TTL. A Strategy that compares tokens only byte for byte is still correct,
// just slower to recover from lost replies.
type Strategy interface {
	// Acquire makes ONE attempt to place key for ttl under token.
	// It returns a Grant whose Until lies in the future, or an error that
	// errors.Is ErrNotObtained (taken: refused by enough nodes, or granted
	// with no validity left), ErrUnavailable (too few nodes answered, or
	// a write they did not acknowledge: an outage, never "taken"),
	// ErrDenied (the nodes refused the client's credentials or rights),
	// ErrInvalid (bad input) or the ctx error.
	Acquire(ctx context.Context, key, token string, ttl time.Duration) (Grant, error)
	// Extend gives key, where it is still held under token, at least ttl
	// from when each node applies it. The strategies of this module raise
	// the key's TTL to ttl and never shorten it: a late copy of an earlier,
	// shorter extension (still in flight when its call returned, or resent)
	// may land after a later, longer one, and must not cut the key back
	// below that one's Until. A Lock does not count on it (see
	// Lock.Extend).
	// It fails with an error that errors.Is ErrNotHeld when the strategy cannot
	// vouch that token holds key. The returned Grant's Fence is 0:
	// an extension keeps the fence of the acquisition.
	Extend(ctx context.Context, key, token string, ttl time.Duration) (Grant, error)
	// Release removes key where it is still held under token. It returns nil
	// when the strategy confirmed the removal, and an error that errors.Is
	// ErrNotHeld when key was not (or not confirmably) held under token.
	Release(ctx context.Context, key, token string) error
}

// Waker is a Strategy that can tell a waiting Locker.Lock that the key it
// waits for was released, so that it tries again at once rather than at
// its next backoff. The strategies of this module implement it: their
// release script publishes on the key's channel (in redlease's reserved
// namespace) in the same atomic step as its delete, and Watch subscribes
// to that channel over one connection per node shared by the whole
// process. A Strategy without it is polled with backoff alone.
//
// A notice only changes when a waiter tries: every grant still goes
// through Acquire. The undo of a failed attempt (a quorum attempt that got
// some nodes but not a majority deletes its key there) is not a release:
// its notice reaches a waiter after a jittered pause that doubles with
// each undo since the last release (5 ms up to 1 s), so that waiters who
// all failed retry staggered, and waiters on a key a holder keeps on a
// bare majority do not wake each other at once, forever. Notices are hints and can be lost (a broken
// connection, a node down, a holder that released through a client that
// does not publish); the waiter's backoff, cut to the holder's remaining
// TTL, is the fallback.
type Waker interface {
	// Watch subscribes to releases of key (as sent to Redis) on the
	// strategy's nodes, and returns once the nodes confirmed the
	// subscription (every node; for a quorum, enough that every
	// majority includes one), a node failed, the strategy's bound passed
	// or ctx ended. Every release a confirmed node applies after Watch
	// returned sends on notices (buffer of one, never closed); so does
	// a broken subscription, since releases may have been missed. Watch
	// never waits on a node past the strategy's bound or ctx. stop ends
	// the subscription (later calls do nothing); the error, if any, means
	// there is none (the strategy was closed).
	//
	// A release wakes one waiter per process, not every one: the waiter
	// the release names (fair mode: the line's head, by waiter, the
	// caller's id in the line, "" when it waits without fairness) if it
	// is in this process, otherwise the one that has waited longest (only
	// among those without fairness when the named head is elsewhere).
	// stop(true) says the waiter took a notice that no attempt of its own
	// answered (it gives up, or its attempt failed on the way): the
	// notice goes to the next waiter, so that it is not lost. A notice
	// still unread in notices when stop runs (one that came after the
	// waiter last looked) goes to the next waiter too, whatever handOn
	// says: the Waker, not the waiter, can tell that without a gap.
	Watch(ctx context.Context, key, waiter string) (notices <-chan struct{}, stop func(handOn bool), err error)
	// Listen is Watch without I/O and without waiting, for a key whose
	// releases the process already hears: if enough nodes (as for Watch)
	// have the key's subscription confirmed, kept by other waiters, it
	// subscribes waiter on it and returns ok; a release that a node
	// applies after Listen returned reaches the process (and wakes a
	// waiter as Watch's notices do). Otherwise it subscribes nothing and
	// returns ok false. Locker.Lock calls it before its first attempt, so
	// that on a hot key that attempt is already the check after
	// subscribing and the second check Watch needs is saved. ctx is the
	// Lock call's: Listen neither waits on it nor does I/O with it; it
	// carries the call's values, as Watch's does.
	Listen(ctx context.Context, key, waiter string) (notices <-chan struct{}, stop func(handOn bool), ok bool)
}

// Sharder is a Strategy whose keys live on several servers that answer
// independently of each other: the masters of a Redis Cluster. Shard names
// the server that serves key now, by the client's last known topology
// ("" if it cannot say). The watchdogs (Locker.Do's default keeper and
// renew.Watchdog) renew each shard's locks in calls of their own, so that a
// slow server (paused, or waiting for its replicas) holds back only the
// verdicts of its own locks, not those of locks whose servers answered.
// single and failover implement it; Shard is "" on a client that is not a
// Cluster client.
type Sharder interface {
	Shard(key string) string
}

// Queuer is a Strategy that can serve the waiters of a key in arrival
// order: fair mode (WithFairness; what it guarantees and how it fails is
// in the package documentation, how the line works in docs/fair-mode.md).
// The strategies of this module implement it; a Strategy without it is
// just not fair, and WithFairness changes nothing on it.
//
// Fairness only ever adds refusals: AcquireInLine grants exactly when
// Acquire would, except that a free key is refused (ErrQueued) to anyone
// but the head of a non-empty line. Every guarantee of Acquire holds for
// it unchanged.
type Queuer interface {
	// AcquireInLine is Acquire for the waiter at place: it joins (or
	// refreshes) the waiter's entry in key's line when place.Join is set,
	// and grants a free key only if the line is empty or place.ID is its
	// head. A refusal because others are ahead errors.Is ErrQueued (and
	// ErrNotObtained).
	AcquireInLine(ctx context.Context, key, token string, ttl time.Duration, place Place) (Grant, error)
	// LeaveLine removes the entry of waiter id from key's line on every
	// node it reaches, best effort (one attempt, bounded by the
	// strategy's call bound and ctx). It removes nothing but that id's
	// entry. A nil error means the nodes that answered applied it.
	LeaveLine(ctx context.Context, key, id string) error
}

// Place is a waiter's place in a key's line (see Queuer).
type Place struct {
	// ID names the waiter: Locker.Lock gives the base of its tokens
	// ("<base>" of "<base>.<n>"), the same for every attempt of one call,
	// so that a release under any of its tokens removes it. It must not
	// be empty.
	ID string
	// Ticket orders the waiters, the earliest first, ties by ID: the
	// client's wall clock when the waiter arrived (Locker.Lock: when it
	// was called). It must be after the Unix epoch; only its milliseconds
	// count. Every node orders two waiters the same way because the
	// client, not the node, chose their tickets.
	Ticket time.Time
	// Join makes the attempt join the line (or refresh its entry). Without
	// it the attempt only respects the line (TryLock: it never comes back
	// for its turn).
	Join bool
	// Lifetime is how long the entry stays in line after this attempt
	// without another refresh (at least a millisecond when Join is set).
	// A waiter must attempt again within it to keep its place.
	Lifetime time.Duration
}

// ErrQueued is the cause of a refusal in fair mode when the key was free
// but other waiters were ahead in its line. It comes wrapped with
// ErrNotObtained.
var ErrQueued = errors.New("redlease: other waiters are ahead in the key's line (fair mode)")

// ReservedPrefix starts every key that redlease writes for its own
// bookkeeping: fence counters, the quorum strategy's boot markers, the
// CLI's holder metadata (redlease:holder:{key}), the lines of fair mode
// (redlease:queue:…); it also starts the wake channels of Waker
// (redlease:wake:…). No lock
// key may start with it: every strategy rejects such a key (and a Locker
// prefix that puts keys there) with ErrInvalid, so a lock can never land on
// a counter or a marker, or the other way round.
const ReservedPrefix = "redlease:"

// SetAcquirer is a Strategy that can take several keys in one atomic step
// when they live on one server (in a Redis Cluster, in one slot: give them
// one hash tag). Locker.TryLockAll, LockAll and DoAll use it for a set of
// keys that Together accepts, unless the call is fair (WithFairness) or
// fused: one round trip takes every key or none. single and failover
// implement it; the quorum strategy does not (each key needs its own
// majority).
type SetAcquirer interface {
	// Together reports whether AcquireSet can take keys (as sent to
	// Redis) in one atomic step: on one server, in one slot, and no more
	// than the strategy takes at once. It does no I/O.
	Together(keys []string) bool
	// AcquireSet makes ONE attempt to place every key for ttl under
	// token, in one atomic step: either every key is placed (each as
	// Acquire would place it alone: a key already held under token, or
	// under an earlier attempt "<base>.<m>" of the same base, is taken
	// too, each fenced by its own counter) and the grants come back in
	// keys' order, each with the same Until and its key's Fence; or none
	// is written. A refusal names the first key in keys' order that
	// another token holds: at is its index, and err is what Acquire
	// would have returned for it (a *HeldError, or ErrNotObtained). Any
	// other error (at is -1) is as Acquire's: ErrUnavailable (nothing
	// decided, or a write not acknowledged: an outage, and whatever the
	// step may have written is undone by token), ErrDenied, ErrInvalid
	// (among others: keys empty, a key twice, or keys not Together), or
	// the ctx error.
	AcquireSet(ctx context.Context, keys []string, token string, ttl time.Duration) (grants []Grant, at int, err error)
}

// Grant is what a Strategy vouches for after a successful Acquire or Extend.
type Grant struct {
	// Until is the end of validity on the caller's monotonic clock, with the
	// allowance for clock drift already subtracted: before Until no other
	// holder can be granted the same key, under the strategy's assumptions.
	// Compare it only with time.Now() from the same process.
	Until time.Time
	// Fence is the fencing token: strictly greater than the fence of every
	// earlier holder of the same key, under the strategy's assumptions. Pass
	// it to storage so the storage can reject a holder that woke up too late.
	// It is 0 when the strategy has fencing off, and on extensions.
	Fence uint64
}

// Revoker is a Strategy that can learn, after the fact, that grants it made
// are void: the failover strategy, when a Sentinel failover may have
// dropped locks that the old primary had granted. The Locker calls Track
// for every acquisition before it sends the request, so a revocation that
// comes while the grant's reply is on its way is not missed; the strategy
// calls revoke (from any goroutine, without holding its own locks) to mark
// that lock lost (at once, or as soon as the grant arrives), and the Locker
// calls untrack when the attempt fails or the lock is released or lost.
type Revoker interface {
	Track(key, token string, revoke func(cause error)) (untrack func())
}

// BatchExtender is a Strategy that can extend many keys at once, in one
// round trip per node whatever the number of keys. ExtendAll uses it where a
// strategy has it. The result slice matches items one to one.
type BatchExtender interface {
	ExtendBatch(ctx context.Context, items []Extension) []Extended
}

// DriftAllowancer is a Strategy that states its clock-drift allowance:
// every Grant it makes for an acquisition or extension to ttl ends
// DriftAllowance(ttl) before the start of that call plus ttl, so that a
// key the nodes expire on their own clocks is never still believed held
// after it is gone. The strategies of this module implement it, each with
// its configured drift factor (ttl×factor + 2 ms).
//
// A Lock uses it where no Grant tells it the validity: an extension still
// in flight, or one whose answer never came, may be applied by the nodes
// at any time and then keeps the key at least ttl after it arrives (exactly
// ttl, on a node that resets the TTL), so the lock counts itself valid at
// most until the extension's start plus ttl less this allowance (see
// Lock.Extend). A Strategy without it states no
// allowance, and the Lock then takes no validity at all from an extension
// it has no Grant for: such an extension to a TTL shorter than another
// that a node may apply after it leaves the lock's Until where it was, and
// Lock.Extend refuses a TTL shorter than the lock's (ErrInvalid), which
// would end the hold the moment it was sent.
type DriftAllowancer interface {
	DriftAllowance(ttl time.Duration) time.Duration
}

// Fencer is a Strategy that states whether its grants carry fences
// (Grant.Fence above 0, rising across holders of a key), or whether it was
// built without fencing (every Fence 0). The strategies of this module
// implement it. A caller whose safety rests on fences asks it: the
// idempotency package's Barrier refuses a strategy that does not fence, or
// does not say (WithStrategy), since its guard against a late claim
// compares fences.
type Fencer interface {
	Fencing() bool
}

// Placer is a Strategy that names where it places keys: its kind of
// placement and its nodes ("primary 10.0.0.1:6379", "quorum a,b,c" with
// the addresses sorted). Two strategies with the same placement take a key
// in the same place, so a lock taken through one excludes a lock taken
// through the other; two with different placements may both hold one key
// name at once. The strategies of this module implement it: single and
// failover on one client name the same placement (they take the same key
// on the same primary), unless the failover strategy names its Sentinel
// master (failover.WithMaster: "failover mymaster"). A client whose type
// exposes no address (a redis.NewFailoverClient's is "FailoverClient")
// names no more than that. The idempotency package records the placement
// of the lock that claimed a request, never lets a claim through another
// placement take it over, and refuses a placement that names such a
// client.
type Placer interface {
	Placement() string
}

// CallBounder is a Strategy that states how long one of its calls may
// take: the quorum strategy's node timeout (its rounds run on every node
// at once, each bounded by it). Locker.Do waits for its release after fn
// at most the shorter of this bound and the lock's TTL, and a keeper
// (renew.Watchdog, Do's default) waits for a renewal of its locks at
// least twice it. A Strategy without it is given DefaultCallBound.
type CallBounder interface {
	CallBound() time.Duration
}

// DefaultCallBound is the call bound of a Strategy that states none (see
// CallBounder): 1 s, the renew package's DefaultTimeout for a renewal.
const DefaultCallBound = time.Second

// Namer is a Strategy that names itself for observers: the Op.Strategy
// of its operations, which the observe package reports as the
// redlease.strategy attribute of every metric and span. A Strategy
// without it is named by its Go type ("*mypkg.Strategy"). The strategies
// of this module implement it ("single", "quorum", "failover"; an
// idempotency Barrier's lock on its store is "idempotency"). The name is
// a metric attribute: keep it short and the same for every instance.
type Namer interface {
	Name() string
}

// Clock is where locks and strategies read the time. The default,
// SystemClock, is time.Now, whose readings carry Go's monotonic clock: all
// validity is measured on it, so wall-clock steps (NTP corrections, date
// changes, leap smearing) never move a lock's Until. Another Clock is for
// tests and fault scenarios that emulate a client clock running at the
// wrong rate; give the same one to the Locker (WithClock) and to the
// strategy (its WithClock option).
type Clock interface {
	Now() time.Time
}

// SystemClock returns the default Clock, time.Now.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Extension asks for one key to be extended: the request side of
// BatchExtender.
type Extension struct {
	Key   string
	Token string
	TTL   time.Duration
}

// Extended is the outcome of one Extension: the new Grant, or an error with
// the same meaning as from Strategy.Extend.
type Extended struct {
	Grant Grant
	Err   error
}

// ErrNotObtained means an attempt to take a lock did not succeed: the key is
// held by someone else (enough nodes refused it), or the grant came back
// with no validity left. It is safe to try again later. Per-node causes,
// where there are any, are reachable with errors.As (*NodeError) on the
// same error. An attempt that failed because nodes were down, slow or did
// not acknowledge the write is an outage: ErrUnavailable, not this.
var ErrNotObtained = errors.New("redlease: lock not obtained")

// ErrNotHeld means the lock the caller asked to extend or release is not
// held under its token: the key expired, was taken over, or too few nodes
// confirmed it.
// Work done under the lock since its last confirmed validity must be treated
// as done without it.
var ErrNotHeld = errors.New("redlease: lock not held")

// ErrUnavailable means too few nodes answered in time to decide an
// operation either way: nodes down, timed out, erroring, or (failover) a
// write too few replicas acknowledged. On an extend or release the lock may
// still be held; its last Until still bounds it. On an acquisition nobody
// said "held": the lock was not obtained, and the error does not match
// ErrNotObtained. Locker.Lock and Do retry it like a refusal, within their
// bounds. Per-node causes are reachable with errors.As (*NodeError).
var ErrUnavailable = errors.New("redlease: too few nodes answered")

// ErrDenied means the nodes refused the client itself: its credentials
// (NOAUTH, WRONGPASS: a missing or wrong user or password) or its rights
// (NOPERM: the ACL user lacks a command, key or channel that redlease needs;
// docs/redis-acl.conf lists them, and `redlease doctor` checks them). It is
// a configuration error, neither ErrNotObtained nor ErrUnavailable:
// retrying will not help, so Locker.Lock and Do return it at once. A quorum
// operation fails with it when the denials alone rule its quorum out.
// Per-node causes (the server's replies) are reachable with errors.As
// (*NodeError), and with go-redis's IsPermissionError and IsAuthError.
var ErrDenied = errors.New("redlease: denied by the server (authentication or ACL rights)")

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
// its quorum. It unwraps to its sentinel (ErrNotObtained for an acquire
// that refusals decided, ErrUnavailable for one that failures decided,
// ErrNotHeld or ErrUnavailable for extend and release, ErrDenied for any
// operation that denials decided) and to every per-node cause, so both
// errors.Is(err, ErrNotObtained) and errors.As(err, &nodeErr) work.
type QuorumError struct {
	Action  string        // "acquire", "extend" or "release"
	Votes   int           // nodes that agreed before the decision
	Quorum  int           // nodes that had to agree
	Nodes   int           // nodes asked
	Elapsed time.Duration // time from the first request to the decision
	Expired bool          // a quorum agreed, but too late: no validity was left
	Err     error         // the sentinel (see above)
	Causes  []error       // one *NodeError per failed node (ErrQueued in fair mode); nil if none failed
	// Unavailable is set on an acquisition that failures (nodes down,
	// timed out, erroring) decided rather than refusals: not enough nodes
	// said "taken" to rule the quorum out. Err is then ErrUnavailable, and
	// the error does not match ErrNotObtained.
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
	if e.Unavailable && e.Err != ErrUnavailable {
		b.WriteString(" (nodes unavailable)")
	}
	fmt.Fprintf(&b, ": %s: %d of %d nodes agreed, %d needed, after %s",
		e.Action, e.Votes, e.Nodes, e.Quorum, e.Elapsed.Round(time.Microsecond))
	if e.Expired {
		b.WriteString(", with no validity left")
	}
	for _, c := range e.Causes {
		b.WriteString("; ")
		b.WriteString(strings.TrimPrefix(c.Error(), "redlease: ")) // ErrQueued: the prefix once
	}
	return b.String()
}

// Unwrap returns the sentinel (and ErrUnavailable when Unavailable is set
// and the sentinel is another) followed by every per-node cause.
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

// ReportNodeFailure is for Strategy implementations: it tells the Observer
// of the operation ctx belongs to, if there is one, that a node failed,
// even when the operation succeeds overall. Without an Observer it does
// nothing.
func ReportNodeFailure(ctx context.Context, ne *NodeError) {
	if f, ok := ctx.Value(nodeSinkKey{}).(func(*NodeError)); ok {
		f(ne)
	}
}

type nodeSinkKey struct{}
