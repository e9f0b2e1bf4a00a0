// Package redlease makes "do this exactly once" safe for services that run
// many replicas: distributed locks (leases) on Redis, with fencing tokens.
//
// A Strategy decides where a lock lives and what a grant is worth:
//
//   - single.Strategy: one Redis primary. One round trip per call. Fast and
//     simple; a lock can be lost (or granted twice) if the primary fails over
//     before it replicated the lock. Good for cheap deduplication.
//   - quorum.Strategy: the Redlock algorithm over N independent primaries. A
//     grant needs a majority and survives the loss of a minority of nodes.
//     Use it where a double grant costs money.
//
// A Locker turns a Strategy into locks: TryLock makes one attempt, Lock
// retries with jittered backoff until ctx is done. Both return a *Lock that
// knows its Fence, its Until, and whether it was Lost.
//
// # How Lock waits
//
// A release wakes the waiters of its key. The release script deletes the
// key and, in the same atomic step, publishes on the key's channel
// (redlease:wake:…, in the reserved namespace). When Lock's first attempt
// is refused, it subscribes to that channel on the strategy's nodes (one
// subscription connection per node client for the whole process, shared
// by every waiter; closed once no waiter is left), waits until the nodes
// confirmed the subscription, and only then checks again: a release
// after that check is heard, so none can fall between the check and the
// wait. Each wait then ends at the first of: a release notice (from any
// node, for quorum; the attempt it triggers still needs its majority),
// the backoff of WithRetryDelay, the holder's remaining TTL as the
// refusing node reported it (+1 ms), and ctx. A notice only decides when a
// waiter tries; every grant still goes through the strategy's Acquire.
//
// A notice can be lost: the subscription connection broke (the waiters on
// it are woken when it breaks and again when it is back, in case a
// release fell in between), a node is down or paused, the holder released
// through a client that does not publish (an older redlease, redsync), an
// ACL denies PUBLISH or SUBSCRIBE (docs/redis-acl.conf allows them), or
// the key simply expired. A lost notice costs the waiter at most one
// backoff (≤ the max of WithRetryDelay), and never more than the holder's
// remaining TTL plus 1 ms for a key that expires. A strategy that is not a
// Waker is polled by backoff alone.
//
// # Do keeps its lock alive
//
// Locker.Do runs a function under a lock and renews the lock while the
// function runs, with no option given: a Locker without WithKeeper uses
// the one process-wide default watchdog, which this package starts on the
// first Do and whose goroutines (one, plus at most two per strategy, however
// many Do calls run) end whenever no Do is running. WithKeeper chooses
// another Keeper (a renew.Watchdog with options of your own);
// WithoutKeeper turns renewal off, and Do then cancels the function's
// context at the lock's loss margin, within its first TTL. Either way the
// function's context is cancelled as soon as the lock is known lost.
//
// # What a grant guarantees, and under which assumptions
//
// While time.Now() is before Lock.Until, no other holder can be granted the
// same key, provided that: the Redis nodes keep their data across restarts
// (persistence with fsync, or a restarted node stays out of the vote for one
// maximum TTL); each node's clock runs at the client's rate within the drift
// factor (default 1%, plus 2 ms); and the holder's process is not paused
// between checking Valid and acting on it. The last assumption is the one
// no lock service can make true, which is why grants carry fences.
//
// # Fences
//
// Lock.Fence is strictly greater than the fence of every earlier holder of
// the same key (under the same assumptions). Storage that keeps the highest
// fence it accepted and rejects anything not greater (UPDATE … WHERE
// fence < ?) turns a holder that woke up too late into a rejected write
// instead of a double effect. single has fences on by default; quorum needs
// quorum.WithFencing (one more round trip).
//
// # Errors
//
// Every failure is checkable with errors.Is against the sentinels
// (ErrNotObtained, ErrNotHeld, ErrLost, ErrUnavailable, ErrInvalid), and the
// failures of individual nodes are kept: errors.As(err, &nodeErr) with a
// *NodeError, errors.As(err, &quorumErr) with a *QuorumError. A cancelled
// or expired ctx stays visible: errors.Is(err, context.Canceled).
package redlease
