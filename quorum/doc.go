// Package quorum implements the Redlock algorithm over N independent Redis
// primaries, with fencing tokens that rise across holders.
//
// # Acquire
//
// One attempt sends the acquire script (SET NX PX, or refresh if the key
// already holds our own token) to every node at once and decides as soon as
// it can: a quorum (default: a majority) granted, or so many nodes refused
// or failed that a quorum is out of reach, or the node timeout passed. It
// never waits for a slow or dead minority. The grant is valid until
//
//	start + ttl − (ttl×driftFactor + 2 ms)
//
// where start is read from the monotonic clock before the first request, so
// the time the round took is already spent. A quorum reached with no
// validity left is a failure. On any failure the attempt releases the key on
// every node, each only after that node's own acquire request has returned,
// so a slow node's late SET cannot leave a key behind until its TTL. That
// undo compares the attempt's token, and no two attempts share one
// (Locker.Lock draws a token per attempt): however late an undo lands, it
// can only remove its own attempt's write, never a key that a later attempt
// counted. An attempt whose ctx has ended, or reached its deadline, when its
// round would start (a Strategy's first attempt first asks every node for
// its run_id, for up to a quarter of the node timeout) sends nothing, and
// fails as a round that no node answered before ctx ended does
// (redlease.ErrUnavailable, with ctx's error).
//
// # Extend and Release
//
// Both run a compare-token script on every node in parallel. Extend succeeds
// with a quorum inside the new validity; Release returns once a quorum
// deleted the key, or once too many nodes did not hold it for a quorum to
// have held it (redlease.ErrNotHeld), or at the node timeout (redlease.ErrUnavailable if
// undecided). Requests still in flight finish in the background, bounded by
// the node timeout; Close waits for them.
//
// So the key may still be held, for a moment, on the nodes whose delete has
// not landed when Release returns: up to N − quorum of them (two of five),
// plus any node where an earlier acquisition's late request is still on its
// way (its own release follows it there). An acquisition that comes at once
// (a TryLock right after a Release, from this process or another) can be
// refused by those nodes. Nothing is held in their place: each delete lands
// within the node timeout, Locker.Lock's retry takes the key then, and the
// refusal never grants anyone anything (how often it happens on local
// nodes is in docs/bench/PERFORMANCE.md). Release does not wait for every node, because a slow or dead minority
// would then cost every release its timeout.
//
// # Inspect and ForceRelease (an operator's calls)
//
// Inspect asks every node at once, in one script per node that writes
// nothing, and judges the answers against a majority (held, free, split;
// redlease.ErrUnavailable when fewer than a majority answered, never
// "held"). ForceRelease runs the release script with the token an
// operator saw on every node at once; unlike Release it waits for every
// node, within the node timeout, because an operator is told what each
// node did, and it succeeds once the token can no longer hold a majority.
// Both return within the node timeout (or ctx), whatever the clients'
// options; a node that has not answered is reported with its timeout.
//
// # Fair mode (redlease.WithFairness)
//
// Strategy implements redlease.Queuer. Each node keeps its own line for a
// key (the line, step by step: docs/fair-mode.md): the acquire script joins
// the waiter at its client-chosen ticket and grants a free key only to the
// head. The quorum rule is unchanged: a grant still needs a majority of
// grants, each node deciding on its own, and fairness only adds refusals.
//
// Because the ticket is chosen by the client, every node orders any two
// waiters it has seen the same way; a node only differs from another in
// which waiters it has seen. An attempt inserts its waiter on every node
// it reaches, so the oldest live waiter becomes the head of every node its
// attempts reach and takes a majority as soon as the key is free there.
// Until then nodes with different heads may let a younger waiter through
// (a fairness miss); they never keep a free key from every waiter: a head
// that stops trying expires after the entry lifetime, and a waiter that
// reaches too few nodes stops refreshing its entries (its next attempt
// only respects the line).
//
// A grant removes the winner's entry on the nodes that granted; the nodes
// that refused it keep it until the winner's Release, which removes it on
// every node (by the token's base), or until its lifetime. While the
// winner holds the key those entries cost nothing: the key is held on a
// majority anyway. The undo of a failed attempt deletes only its lock key
// (by token), never an entry.
//
// # Guarantees and assumptions
//
// Two holders never hold a key at once (each within its Until) provided
// that: nodes fail by stopping, not by lying; a node that restarts either
// kept its data (appendonly with appendfsync always) or stays out of the
// vote for one maximum TTL; and every node's clock runs at the client's
// rate within driftFactor. An even node count is allowed but buys nothing:
// four nodes need three votes and tolerate one failure, like three.
//
// # The delayed-restart rule (WithDelayedRestart)
//
// A node that restarts forgets the locks it had not persisted: all of them
// without persistence, the newer ones when it comes back from an RDB
// snapshot or from an append-only file with appendfsync everysec. If it
// votes again at once, a lock held through a bare majority that included it
// can be granted a second time. The rule, from the Redlock analysis: a
// restarted node must not vote for one maximum TTL. Operators forget it, so
// the client enforces it: each node keeps a boot marker (the key
// "redlease:boot", no TTL) holding the server time when a redlease client
// first saw the running server process, and that process's run_id (from
// INFO server, new on every start). The acquire script compares them; if
// the marker is missing (the node lost its data) or names another process
// (the node restarted, whatever it kept), the script resets it and answers
// "too young" until the max TTL has passed. Every TTL that reaches a node
// is bounded by the max TTL (Acquire, Extend and ExtendBatch refuse a
// longer one), so that sitting out the max TTL covers every lock the node
// may have forgotten. The check runs inside the acquire script, so it costs
// no round trip; the price is that after every restart, and on a fresh
// deployment, a node does not vote for one max TTL. Nodes that lose
// nothing on a restart (appendonly yes, appendfsync always) can be declared
// with WithDurableNodes and keep their vote when their marker survived.
//
// # Fencing (on by default; WithoutFencing turns it off)
//
// Per node, a counter key sits beside the lock key, with a TTL refreshed
// on every grant (WithFenceTTL; redlease.DefaultFenceTTL by default).
//
//   - Round 1 (inside the acquire script): a node that grants increments
//     its counter (one it has none of starts from its clock, TIME in
//     microseconds since the epoch) and replies the new value. A node
//     that finds our own token already there (a resent request) replies
//     its counter as it is. Either way the reply is a value the node's
//     counter had, at least, at a moment our key was there, and the
//     counter's TTL was refreshed then.
//   - The fence f is the highest reply among the quorum of grants.
//   - Round 2, only if fewer than a quorum of nodes (counted by server)
//     replied exactly f: every node raises its counter to max(counter, f)
//     and replies whether the lock key still holds our token. The grant
//     needs a quorum of nodes that either replied f in round 1 or
//     confirmed in round 2, within the validity.
//
// Either way, a grant with fence f leaves a quorum of nodes, each of
// which held a counter of at least f (its TTL refreshed) at a moment our
// key was there. When every node granted the holders before us, the
// counters move in step and round 1 alone does it: fencing then costs no
// round trip. Counters part when nodes miss grants (a node down, a failed
// attempt that a minority granted, counters created at different
// moments), and round 2 brings them back together.
//
// Why f rises strictly for successive holders A then B, even when they
// reached different majorities: take a node k in both the quorum that A's
// grant left holding f_A and B's quorum of round-1 grants (two majorities
// always share a node). At k, A's key was there at the moment the counter
// held at least f_A, so B's SET NX at k did not happen while A's key was
// there. It did not happen before either: B's key would have had to
// vanish from k before A's SET there, ending B's validity before A's
// grant, so B would precede A. So B's grant at k incremented a counter
// already at least f_A, and f_B ≥ f_A + 1.
//
// Counters only rise, so round 2 also raises counters on nodes that did
// not grant (harmless, and it helps nodes that missed earlier rounds catch
// up), and a node's increment for an attempt that failed is harmless too.
// The increments alone would not do: if A's majority had seen many earlier
// holders and B's had not, B's maximum could be lower than A's; round 2
// is what carries A's fence to a majority when only a few of A's nodes
// replied it.
//
// The argument needs node k to keep its counter, or to have lost it by
// expiry only: a counter expires at least its TTL after the moment that
// made it count for A, so B's increment at k then starts from k's clock
// at least that TTL later, which is above f_A as long as the nodes'
// clocks differ by less than the TTL (f_A is at most the clock reading of
// some node when its counter was created, plus one per grant since, which
// cannot outpace microseconds: see internal/script's FenceTTL). A node
// that restarts without its data has lost its counters; the
// delayed-restart rule keeps mutual exclusion but not fence order across
// such a node. Run quorum nodes with appendonly yes and appendfsync always
// where fences matter. Fair mode (AcquireInLine) runs the same acquire
// script and the same rounds: its line only adds refusals.
//
// Fences are Lua numbers in the scripts: exact up to 2^53.
package quorum
