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
// A release wakes a waiter of its key: the release script deletes the key
// and, in the same atomic step, publishes on the key's channel
// (redlease:wake:…, in the reserved namespace). When Lock's first attempt
// is refused, it subscribes to that channel on the strategy's nodes and
// waits until they confirmed the subscription before it checks again, so
// no release falls between the check and the wait. Each wait then ends at
// the first of: a release notice (from any node, for quorum; the attempt
// it triggers still needs its majority), the backoff of WithRetryDelay,
// the holder's remaining TTL as the refusing node reported it (+1 ms), and
// ctx. A notice only decides when a waiter tries; every grant still goes
// through the strategy's Acquire. A notice wakes one waiter per process
// (fair mode: the line's head; otherwise the longest-waiting one), and a
// waiter that leaves without using it hands it to the next; one granted
// the key drops a notice it has not read. On a quorum a release reaches
// the process once per node; a release with an empty line names itself,
// so its later pushes tell the waiter it woke again while that waiter
// waits, and wake nobody once it has left.
// One subscription connection per node client serves the whole process.
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
// # Fair mode (WithFairness): waiters served in arrival order
//
// With fairness on (it is off by default: see WithFairness for what it
// costs), the waiters of one key are served in the order they called Lock,
// on every strategy of this module (single, failover and quorum implement
// Queuer; a Strategy that does not is simply not fair). Each node keeps a
// line per key beside the lock key, in the reserved namespace, and its
// acquire script grants a free key only to the line's head. How the line
// works, step by step, is in docs/fair-mode.md.
//
// Fairness only ever adds refusals, never grants: mutual exclusion, fences
// and validity are exactly those of the strategy without fairness,
// whatever state a line is in. What it needs, and what can cost a waiter
// its turn or some time (never safety):
//
//   - Every client of the key must be fair. Clients without fairness
//     (fairness off, an older redlease, redsync on the same key layout)
//     take a free key whoever is waiting.
//   - TryLock never joins the line, but respects it: with waiters in line
//     it is refused (ErrQueued, with ErrNotObtained) even when the key is
//     free.
//   - A waiter's place is its client's wall clock when Lock was called: a
//     client whose clock is behind is served ahead of waiters that came
//     before it. Clock skew reorders the line; it does not block it.
//   - A waiter that dies or is paused (GC, SIGSTOP) at the head of the line
//     holds the key back for at most LineLifetime after its last attempt
//     (max(1 s, 3 × the max of WithRetryDelay)); then its place expires. A
//     Lock that gives up (ctx, WithMaxAttempts, an error) leaves the line,
//     best effort.
//   - On a quorum, nodes that have seen different waiters (a lost request,
//     a node restarted without its data) can have different heads for a
//     while: someone may then be served out of turn, but a line keeps a
//     free key from every waiter at most as long as its head's entry lives
//     without a refresh. A join that reaches a node after its Lock call
//     ended (a delayed request) puts back an entry only expiry removes:
//     on a majority, such entries hold a free key back from every waiter
//     for up to LineLifetime after they landed (docs/fair-mode.md). A
//     waiter that reaches too few nodes stops keeping its place until it
//     reaches a majority again.
//   - The ACL user needs the line's sorted-set commands
//     (docs/redis-acl.conf lists them).
//
// Cost: an uncontended Lock or TryLock runs one more command (EXISTS on
// the line) inside the same script; a contended attempt runs a few
// sorted-set commands.
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
// A keeper renews a lock by its TTL, which is that of its latest
// Lock.Extend (Lock.TTL): a function that extends its lock to a longer TTL
// keeps that TTL, and every renewal goes through the same bookkeeping as
// Extend. After
// the function returns, Do waits for the release at most the strategy's
// call bound (CallBounder: the quorum strategy's node timeout;
// DefaultCallBound, 1 s, for the others), or the lock's TTL if shorter.
//
// # Several keys at once
//
// Locker.LockAll, TryLockAll and DoAll take a set of keys, all or none
// (a LockSet). Each key is a lock of its own, with its own fence and
// Until: on a quorum each key needs its own majority, and every guarantee
// of a single lock holds for each key of a set.
//
// Where the strategy can take the keys in one atomic step (a
// SetAcquirer: single and failover, keys on one server; on a Cluster
// client, keys in one hash slot, given one hash tag) and the call is not
// fair, the first attempt takes every key in one script and one round
// trip, or writes nothing: each key judged as Acquire judges it, each
// fenced by its own counter (failover: followed by WAIT, and undone when
// too few replicas acknowledged, as one key's grant is). A refused step
// holds nothing, so it cannot wait in a cycle with anyone.
//
// Otherwise (quorum, keys in different slots, fair mode, or after the
// step was refused) the keys are taken one after another in one order
// shared by every caller, their names as sent to Redis, byte by byte, so
// that sets that overlap never wait for each other in a cycle. The keys
// already taken are kept alive by the Locker's keeper while a later one
// is waited for (not with WithoutKeeper). A set is handed out only if
// every key is still valid when the last was taken; otherwise, and when
// a key cannot be taken, the keys taken are released (in the background
// when the call has a deadline, so that it returns by it) and the error
// names the failing key. A set is as held as its least held lock:
// LockSet.Valid, Until, Lost and Context answer for the whole set, and
// DoAll cancels its function's context when any key is lost.
//
// What it does not do: taken in order, others may see a set's first keys
// held while it waits for the rest; and a caller that holds a key by
// Lock while it asks LockAll for another can still wait in a cycle with a
// set holding the other.
//
// # At most N holders: Semaphore
//
// Locker.Semaphore(name, n) hands out at most n permits at once. It is n
// ordinary lock keys, its slots "<name>#0" to "<name>#<n-1>", and a permit
// is the *Lock of one slot, taken through the strategy's Acquire: it has
// its own token, fence and Until, is renewed by a Keeper (Semaphore.Do;
// a renew.Watchdog) and lost or released exactly as a Lock. No script is
// added. So "never more than n permits believed held" is each slot's
// mutual exclusion, on every strategy and under its own assumptions (on a
// quorum, each slot is a Redlock key with its own majority). TryAcquire
// tries each slot once, from one drawn at random, and answers
// ErrUnavailable, not ErrNotObtained, when a slot was undecided: an outage
// is never "all held". Acquire tries the slots in rounds: after its
// first refused round it subscribes to every slot's releases (on a Waker,
// without WithPolling, up to MaxWatchedPermits slots), and a release wakes
// it; each wait is also cut at the shortest remaining TTL a refusal
// reported.
//
// What it does not do: fences rise per slot, not across slots (storage
// keeps the highest fence per slot key); waiters are not served in order
// (a release wakes one waiter per process and slot, and a waiter that
// came later may be served first); a holder paused past its TTL believes
// in its permit as a Lock's holder does; and callers must agree on n (one
// that opens the name with a larger n lets that many in).
//
// # Extending a lock
//
// Lock.Extend has the nodes keep the key at least its TTL from when they
// apply it, and moves the lock's Until to the extension's start plus that
// TTL, less the drift allowance. A node never shortens a held key: an
// extension (or a resent acquisition) raises the key's TTL to the one it
// carries, or leaves a longer one as it is, so that a late copy of an
// earlier, shorter extension (a quorum's request to a node that had not
// answered when the call returned) cannot cut the key back below a later
// extension's Until. So an Extend to a shorter TTL shortens the holder's
// Until at once, but not the key: it keeps the longer life an earlier
// extension gave it, and others may be refused the key until that runs
// out. Release is how to let them in sooner.
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
// fence < ?) rejects the write of a holder that woke up too late: it has
// no effect, let alone a double one. single has fences on by default; quorum needs
// quorum.WithFencing (one more round trip).
//
// A fence comes from a counter per lock name beside the lock key
// ("redlease:fence:…"). Every counter expires, DefaultFenceTTL after its
// last grant unless the strategy's WithFenceTTL says otherwise, so a
// service that locks one key per payment does not grow Redis without
// bound. Fences still rise across a counter's expiry: a counter created
// anew starts from the server's clock in microseconds since the epoch (a
// fence is then a number near 1.8e15, and adds one per grant), above every
// fence the expired one handed out. A holder paused past its counter's
// expiry therefore still has its write refused. This assumes that the
// server's clock does not step back by the counter's TTL across its
// expiry, and for quorum that the nodes' clocks differ by less than it;
// the argument is in internal/script's FenceTTL.
//
// # Inspection and revocation by an operator
//
// Locker.Inspect says who holds a key (its token), until when the nodes
// keep it without a renewal, with which fence, and how many waiters keep
// a place in its fair-mode line, node by node and as a verdict: held by
// one token on a majority of the nodes, free on a majority, split (no
// majority either way), or, when fewer than a majority answered,
// ErrUnavailable: an outage is never reported as "held". It writes
// nothing, reads each node in one script, asks every node at once and
// returns within the strategy's call bound (CallBounder; DefaultCallBound
// otherwise), whatever the go-redis client's options. It is a snapshot,
// stale as soon as it is read. When the holder took the key is known only
// where the holder left a record (`redlease run` does: host, pid, start
// time, command); the library records no grant time, and Since is then
// the zero time. Waiters without fairness keep no place and are not
// counted.
//
// Locker.ForceRelease ends another holder's lock: it deletes the key on
// every node where it still holds the token the operator saw, and nowhere
// else (the release script's compare-and-delete), so that a key that
// changed hands since the inspection is left to its new holder and the
// call says ErrNotHeld. It publishes the release notice, so waiters try
// at once, and leaves the fence counters alone, so the next holder's
// fence is above the revoked holder's. On a quorum it waits for every
// node within the call bound, reports each node's outcome, and succeeds
// once the token can no longer hold a majority.
//
// A forced release ends mutual exclusion for the holder it revokes. The
// holder is not told: it goes on believing it holds the lock until its
// next renewal finds the key gone (Extend returns ErrNotHeld, Lost
// closes, Do cancels its function's context: within one renewal
// interval, a third of the TTL by default, plus a call) or until its
// validity (Lock.Until) runs out, while a waiter may be granted the key at
// once. Until then two holders can act, and fences are what keep storage
// safe: the revoked holder's fence is below the new holder's, and storage
// that checks fences refuses its writes. Force a holder that is stuck or
// gone, never one that is working.
//
// # Leader election
//
// An Election (NewElection) is a leader election on one lock key, shaped
// like etcd's concurrency.Election. The leader is the holder of the key,
// and its term is its lock's fence: Leadership.Term is strictly above
// every earlier leader's term, so storage that refuses writes with a term
// below the highest it accepted refuses a deposed leader's writes.
// Campaign waits for the key as Lock does (retries, wake on release),
// keeps it alive with the Locker's keeper as Do does, and records the
// leader's value beside it (redlease:leader:…, in the reserved namespace
// and the key's cluster slot, living at least as long as the lock key),
// written only in one atomic step with a compare of the lock's token: a
// deposed leader's Proclaim is refused (ErrNotHeld), never written over a
// newer leader's value, and Leader reads the holder and the record in one
// step and reports a record only beside its own holder (otherwise
// ErrNoLeader; ErrUnavailable on an outage, never another leader). Observe
// subscribes to the election's proclamations and releases and reads the
// leader on each notice, with a poll every max retry delay for notices
// lost; it reports terms rising, and its goroutine ends with its ctx.
//
// What each strategy guarantees. single: one leader at a time and rising
// terms under the assumptions of a grant (the primary keeps its data). A
// failover of the primary before it replicated the grant can elect two
// leaders at once, as it can grant a lock twice, and the second may get
// the same term as the first (the new primary's fence counter predates
// it): storage that must survive that keeps the writer of a term
// (Leadership.Lock().Token()) beside it and refuses a second writer with
// an equal term. failover: the same, except that grants and records
// stand only once replicas acknowledged them (WAIT), which narrows that
// window to a failover that promotes a replica that did not acknowledge
// (see package failover); a failover.Watcher, where one runs, revokes
// the leadership on a failover (Lost closes). quorum: not supported. The record would have to be written on a majority under the
// token compare and read as a majority, and observers would have to
// combine notices from every node; until that is built and tested,
// NewElection refuses a quorum strategy (and any strategy without
// fences) with ErrInvalid rather than elect with a weaker guarantee.
//
// Failure modes: a leader paused past its TTL (GC, SIGSTOP, a stuck
// keeper) goes on believing it leads until it runs again: its Lost
// closes at its own deadline, or at once when a Proclaim or a renewal
// finds the key gone, and meanwhile the next leader may be elected: only
// the term at the storage keeps the old leader's writes out. A leader's
// value is recorded one round trip after its grant: in between Leader
// reports ErrNoLeader. A leader whose key expires publishes nothing:
// observers learn of the next leader from its record's notice, or of
// none at their next poll. Each Observe holds one subscription
// connection of its own while it runs.
//
// # Errors
//
// Every failure is checkable with errors.Is against the sentinels
// (ErrNotObtained, ErrNotHeld, ErrLost, ErrUnavailable, ErrDenied,
// ErrInvalid), and the failures of individual nodes are kept:
// errors.As(err, &nodeErr) with a *NodeError, errors.As(err, &quorumErr)
// with a *QuorumError. A cancelled or expired ctx stays visible:
// errors.Is(err, context.Canceled). An acquisition fails with exactly one
// of ErrNotObtained (held), ErrUnavailable (an outage: nodes down, slow,
// or a write too few replicas acknowledged) and ErrDenied (credentials or
// ACL rights: a configuration error, which Lock and Do do not retry).
//
// # Constructors and Close
//
// Every constructor of the module (New here and in single, failover,
// quorum, renew, idempotency and observe, idempotency.Middleware) has the
// shape New(...) (T, error): a nil client or strategy, a rejected option
// and options that contradict each other are reported there, as an error
// that errors.Is ErrInvalid, and no constructor panics. A mistake in
// configuration is then found where it is made, once, at start-up, rather
// than by the first lock call or, worse, not until a request takes the
// path that uses it; and a value that exists is one that works. Options
// given to a single call (TryLock, Lock, Do) are checked by that call.
// Everything that owns goroutines or connections has Close (the
// strategies, renew.Watchdog, failover.Watcher).
package redlease
