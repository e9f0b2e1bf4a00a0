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
// A release wakes a waiter of its key. The release script deletes the
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
// A notice wakes one waiter per process, not all of them: every waiter
// woken costs a script call on every node, and all but one would be
// refused. Fair mode's release names the line's head, and the process
// where it waits wakes it; otherwise each process wakes its
// longest-waiting waiter of the key. A waiter that leaves without
// answering its notice with an attempt the nodes decided (it gave up, or
// its attempt failed on the way) hands the notice to the next one.
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
// costs), the waiters of one key are served in the order they called Lock, on every strategy of this module (single, failover and
// quorum implement Queuer; a Strategy that does not is simply not fair).
//
// The line: per node, beside the lock key, in its cluster slot and in the
// reserved namespace, one sorted set (redlease:queue:{key}, built like the
// fence counter's key). Each waiter has two members: its id (the Lock
// call's token base, "<base>" of "<base>.<n>") scored by its ticket, and a
// deadline member scored by the entry's expiry in the node's own TIME
// (negated, so the two kinds never mix in an ordered read). The ticket is
// the client's wall clock in milliseconds when Lock was called; ties go
// by id. It is chosen by the client, not by the node, so every node that
// has seen two waiters orders them the same way: with node-chosen order a
// quorum could split into nodes whose heads differ and block a majority
// for every waiter.
//
// The rule, inside the acquire script, atomically: a free key is granted
// only to the line's head, or to anyone when the line is empty (after
// entries past their deadline were purged). Fairness only ever adds
// refusals, never grants: the grant path (SET NX, the same token's
// refresh, the takeover of an earlier attempt of the same Lock call) is
// the one of the plain script, and a key held by another token is refused
// as before. So mutual exclusion, fences and validity are exactly those of
// the strategy without fairness, whatever state a line is in.
//
// Who is in line: every attempt of a Lock call joins (or refreshes) its
// entry on every node it reaches, at its first ticket: an attempt that
// reaches a node which has not seen the waiter (its earlier request was
// lost, the node restarted and forgot its line) inserts it at its place.
// A grant removes the winner's entry on the nodes that granted; a release
// removes the entry of its token's base on every node it reaches (the
// nodes that refused the winner still had it), then publishes the next
// head on the key's wake channel. TryLock never joins (it would never come
// back to take its turn): it only respects the line, so with waiters in
// line it is refused even when the key is free. A Lock that gives up (ctx
// end, WithMaxAttempts, an error) removes its own entry, by its own id,
// on every node, best effort. Otherwise an entry lasts its lifetime
// (max(1 s, 3 × the max of WithRetryDelay)) after its last refresh; every
// attempt refreshes it, and the waits between attempts are bounded by
// that max (and cut by the holder's TTL and by release notices), so a live
// waiter keeps its place. The line key itself carries a PEXPIRE of the
// lifetime, so an idle line vanishes.
//
// Failure modes, and what each costs (never safety):
//
//   - A waiter that dies or is paused (GC, SIGSTOP) while it is the head
//     stalls the key for at most one entry lifetime after its last
//     attempt: then its entry expires, and the next waiter is the head.
//   - A waiter whose wall clock is behind gets an earlier ticket and is
//     served ahead of waiters that came before it (ahead, a later one):
//     clock skew reorders the line, it does not block it. Tickets are not
//     clamped by the nodes, since a clamp by each node's own clock would
//     order the line differently on different nodes.
//   - Nodes of a quorum that have seen different waiters (a lost join, a
//     node restarted without its data) can have different heads for a
//     while. They converge: the live waiter with the smallest ticket is
//     the head of every node its attempts reach, so it gets a majority as
//     soon as the key is free on one; meanwhile someone may be served out
//     of turn (a fairness miss, not a stall). No node blocks every waiter
//     forever: an entry not refreshed expires.
//   - A waiter that reaches only a minority of the nodes (partitioned)
//     would otherwise keep its entries fresh there and, with one more node
//     down, leave the others no majority: after an attempt that too few
//     nodes answered (ErrUnavailable), the next attempt only respects the
//     line and does not refresh the waiter's entry, so its entries expire
//     within a lifetime while it cannot reach a majority.
//   - A late undo of a failed attempt does not touch the line (it deletes
//     the attempt's lock key by token, as before): only Release and the
//     give-up of a Lock leave the line.
//   - Clients without fairness (fairness off, an older redlease, redsync
//     on the same key layout) ignore the line: they take a free key
//     whoever is waiting. Fairness holds among fair clients only.
//   - Release notices name the next head, and wake that waiter only
//     (in whichever process it waits); a process whose waiters are all
//     behind the head wakes none of them. A lost notice costs one
//     backoff, as without fairness.
//   - A waiter refused because another is the head of a free key's line
//     (ErrQueued) learns no holder's TTL to cut its wait by. It waits a
//     ramp from the min of WithRetryDelay instead of the max: the head
//     takes the key within a round trip or two, and the next refusal then
//     carries the new holder's TTL; were it to wait the max, a lost
//     release notice would cost it the rest of that wait after the
//     head's hold. A head that never comes (it died in line) costs the
//     waiters one ramp of attempts, up to the max delay, until its entry
//     expires.
//
// Cost: an uncontended Lock or TryLock on a free key with an empty line
// runs one more command (EXISTS on the line) inside the same script; the
// command line carries the line's key and the waiter's id, ticket and
// lifetime. A contended attempt runs a few sorted-set commands.
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
// fence < ?) turns a holder that woke up too late into a rejected write
// instead of a double effect. single has fences on by default; quorum needs
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
