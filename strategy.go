package redlease

import (
	"context"
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
// through Acquire. Notices are hints and can be lost (a broken
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
	Watch(ctx context.Context, key string) (notices <-chan struct{}, stop func(), err error)
}

// ReservedPrefix starts every key that redlease writes for its own
// bookkeeping: fence counters, the quorum strategy's boot markers, the
// CLI's holder metadata (redlease:holder:{key}); it also starts the wake
// channels of Waker (redlease:wake:…). No lock
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
