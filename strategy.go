package redlease

import (
	"context"
	"errors"
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
	// errors.Is ErrNotObtained (taken, or too few nodes agreed in time),
	// ErrInvalid (bad input) or the ctx error.
	Acquire(ctx context.Context, key, token string, ttl time.Duration) (Grant, error)
	// Extend resets the ttl of key where it is still held under token.
	// It fails with an error that errors.Is ErrNotHeld when the strategy can
	// no longer vouch that token holds key. The returned Grant's Fence is 0:
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
// process. A Strategy without it is polled with backoff, as before.
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
	// notice goes to the next waiter instead of being lost.
	Watch(ctx context.Context, key, waiter string) (notices <-chan struct{}, stop func(handOn bool), err error)
	// Listen is Watch without I/O and without waiting, for a key whose
	// releases the process already hears: if enough nodes (as for Watch)
	// have the key's subscription confirmed, kept by other waiters, it
	// subscribes waiter on it and returns ok; a release that a node
	// applies after Listen returned reaches the process (and wakes a
	// waiter as Watch's notices do). Otherwise it subscribes nothing and
	// returns ok false. Locker.Lock calls it before its first attempt, so
	// that on a hot key that attempt is already the check after
	// subscribing and the second check Watch needs is saved.
	Listen(key, waiter string) (notices <-chan struct{}, stop func(handOn bool), ok bool)
}

// Queuer is a Strategy that can serve the waiters of a key in arrival
// order: fair mode (WithFairness; how it works and how it fails is in the
// package documentation). The strategies of this module implement it; a
// Strategy without it is just not fair, and WithFairness changes nothing
// on it.
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
