package redlease

import "context"

// ForceReleaser is a Strategy that lets an operator end another holder's
// lock: ForceRelease deletes key on every node where it still holds token,
// and nowhere else (a compare-and-delete, as Release), so that a key that
// changed hands since token was read is left to its new holder. Each
// delete publishes the key's release notice, as a holder's release does,
// so that waiters try at once; the fence counters are left as they are,
// so the next grant's fence is above the revoked holder's. The strategies
// of this module implement it; Locker.ForceRelease uses it.
//
// It asks every node at once and waits for every one of them, within the
// strategy's call bound (CallBounder; DefaultCallBound for single and
// failover), whatever the go-redis client's options, and reports each
// node's outcome. Its error is nil when token was deleted on at least one
// node and the nodes that answered without token there (deleted or never
// there) make a majority: token can no longer hold a majority. It errors.Is
// ErrNotHeld when a majority answered and none of them held token (the key
// changed hands, was released or expired: nothing was deleted),
// ErrUnavailable when too few nodes answered to say (ErrDenied when their
// denials alone left too few), ErrInvalid for an empty key or token, and
// carries the ctx error if ctx ended first. A request still in flight when
// the call returns may still be applied: it too deletes only token.
type ForceReleaser interface {
	ForceRelease(ctx context.Context, key, token string) (ForceResult, error)
}

// ForceResult is the outcome of a forced release (see ForceReleaser).
type ForceResult struct {
	// Key is the key as the caller gave it (Locker.ForceRelease: without
	// the Locker's prefix), Token the token it was asked to delete.
	Key, Token string
	// Deleted is how many nodes held Token and deleted it; Quorum how many
	// make a majority of the strategy's nodes.
	Deleted, Quorum int
	// Nodes has one outcome per node of the strategy, in its node order.
	Nodes []ForcedNode
}

// ForcedNode is one node's outcome in a forced release.
type ForcedNode struct {
	Node int    // the node's index in the strategy's node list
	Addr string // the node's address, where the client exposes one
	// Deleted: the key held the token there and was deleted. False with a
	// nil Err: the key was not there, or held another token, which was
	// left alone.
	Deleted bool
	Err     error // why the node gave no answer (a timeout, a refusal, ...)
}

// ForceRelease ends another holder's lock on key: it deletes key on the
// strategy's nodes where it still holds token (the token an operator saw
// in Inspect), and nowhere else, so a key that changed hands meanwhile is
// left to its new holder and the call returns ErrNotHeld. The Locker's
// prefix is applied as Lock applies it. Errors, bounds and what each node
// did are those of ForceReleaser; a strategy that is not a
// ForceReleaser, an empty key or token, and a nil Locker are refused with
// ErrInvalid.
//
// A forced release ends mutual exclusion for the holder it revokes: the
// holder is not told, and goes on believing it holds the lock until its
// next renewal finds the key gone (Extend returns ErrNotHeld, Lost closes,
// Do cancels its function's context) or its validity (Lock.Until) runs
// out, while a waiter may be granted the key at once. Until then two
// holders can act. The new holder's fence is above the revoked holder's:
// storage that checks fences refuses the revoked holder's late writes,
// and nothing else does. Use it on a holder that is stuck or gone, not on
// one that is working.
func (l *Locker) ForceRelease(ctx context.Context, key, token string) (ForceResult, error) {
	if l == nil {
		return ForceResult{}, Invalid("nil Locker")
	}
	if key == "" || token == "" {
		return ForceResult{}, Invalid("force release: empty key or token")
	}
	fr, ok := l.defaults.strategy.(ForceReleaser)
	if !ok {
		return ForceResult{}, Invalid("strategy %T cannot force a release (it is not a redlease.ForceReleaser)", l.defaults.strategy)
	}
	ctx, done := observe(ctx, l.observer, Op{Name: "force_release", Strategy: strategyName(l.defaults.strategy), Key: key})
	r, err := fr.ForceRelease(ctx, l.prefix+key, token)
	done(err)
	if r.Nodes != nil {
		r.Key = key
	}
	return r, err
}
