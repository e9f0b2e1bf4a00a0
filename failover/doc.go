// Package failover keeps locks on one Redis primary with replicas, for
// deployments that run Sentinel rather than N independent primaries.
//
// # Replication-acknowledged grants
//
// Every acquisition and extension is followed, in the same pipeline on the
// same connection (one round trip), by WAIT n timeout. A grant stands only if
// at least n replicas acknowledged it (WithReplicas, default 1); otherwise
// the key is released again and the caller gets an error that errors.Is
// redlease.ErrUnavailable and ErrNotReplicated (an outage, never "held":
// not ErrNotObtained). A fence is INCRed in
// the same script before the WAIT, so a failover that WAIT covered keeps the
// fence counter, and the next holder's fence is higher. Fence counters
// expire (WithFenceTTL; redlease.DefaultFenceTTL by default) and one
// created anew starts from the server's clock in microseconds, so a
// counter that expired, or that a promoted replica never had, still hands
// out fences above the old ones, provided the clocks of the old primary and
// the new one differ by less than the fence TTL.
//
// # What WAIT does not do
//
// WAIT is best effort, not consensus. It says that n replicas had received
// the write when it answered, not that the replica Sentinel promotes will be
// one of them, nor that the write survives a replica's restart without
// persistence. Measured here: with the replication link black-holed, WAIT 1
// returns 0 while the replica still reports its link as up — which is the
// case this strategy turns from a silent double grant into a refused grant.
// A failover that promotes a replica that never acknowledged can still lose
// a lock; the Watcher therefore revokes every lock on a failover.
//
// # Bounds
//
// Every call returns by its ctx deadline, with or without go-redis's
// ContextTimeoutEnabled. A call whose ctx has no deadline waits at most
// redlease.DefaultCallBound (1 s), plus the WAIT timeout (WithWaitTimeout), since WAIT
// runs in the same round trip. The clean-up after a
// failed acquisition (the release of what it may have written, by its
// token) runs in the background, at most a DefaultCallBound; Close ends
// it. An operator's Inspect and ForceRelease wait for no replica and
// return within DefaultCallBound.
//
// # Lock-loss signalling on failover
//
// A Watcher (NewWatcher) subscribes to Sentinel's +switch-master for the master
// name on every Sentinel it is given, and polls them as a backstop. On every
// failover, every lock the strategy granted and that is still held is
// marked lost (Lost closes, Locker.Do cancels its function) with a cause
// that errors.Is ErrFailover. A failover is a +switch-master message, or a
// poll that finds a config epoch higher than the newest seen, whatever
// primary it names: a failover and a failback between two polls leave the
// same primary in place, with the locks it lost to the replica promoted in
// between. Since a message carries no epoch, the poll that hears of its
// failover (asked at once) revokes again, and so costs the locks granted
// within that round trip to the Sentinels. Use it with
// redis.NewFailoverClient, which follows the primary on its own, and start
// it before taking locks: those held when it starts are revoked.
//
// # Redis Cluster
//
// New takes a Cluster client too. Every acquisition and extension then
// runs on its key's master (go-redis's MasterForKey), followed in the
// same pipeline on that master's connection by WAIT for every replica the
// master's shard lists in CLUSTER SHARDS, whatever their health, and at
// least WithReplicas's n (0 by default on Cluster). A Cluster promotes
// whichever replica of a failed master wins its election, so only a grant
// that all of them acknowledged survives any failover; a replica that
// joins later copies the data set, locks included, before it can be
// promoted. Each master's count is asked of that master (its own view of
// its replicas), at most once a second and again after a WAIT that fell
// short. Consequences:
//
//   - A failover never grants a held lock again while the promoted replica
//     keeps what it acknowledged: the new master has the key, with the
//     expiry of the last extension its replicas acknowledged, which is at
//     or after the holder's Until. An extension the replicas did not
//     acknowledge leaves Until where it was.
//   - A healthy failover keeps the lock: renewals follow the new master
//     (a master that leaves a call unanswered makes the library ask
//     go-redis for a new topology; see single's package doc, Redis
//     Cluster), which has the key. The lock must outlive that: size the
//     TTL to cluster-node-timeout.
//   - A shard whose replica is down, or whose replication is behind,
//     grants and extends nothing (ErrUnavailable and ErrNotReplicated)
//     until the replica is back or removed (CLUSTER FORGET): the locks
//     held there are lost at their Deadline (chaos: a replica killed
//     under a 6 s lock lost it 5.3 s later). A shard that lists no
//     replica cannot fail over and waits for none: after a failover whose
//     old master is dead, the new master lists none until the old one
//     returns as its replica, so its locks are renewed meanwhile.
//   - Each WAIT blocks up to its timeout at the server's timer
//     resolution: WithWaitTimeout(100 ms) measured 194–202 ms on
//     redis-server 7.0.15, so a refused grant takes about that long.
//   - The client follows MOVED (reloading the topology), ASK (with
//     ASKING) and TRYAGAIN (waiting 10 ms, doubling) itself, at most five
//     times per call and within its ctx. Renewals of many keys send one
//     pipeline per master, one script call per 500 keys whatever their
//     slots, with one WAIT (see single's package doc, Redis Cluster); a
//     key that call cannot reach is renewed on its own, following the
//     redirection.
//   - The Watcher is for Sentinel; on Cluster no failover revokes a lock,
//     since every promoted replica acknowledged it.
//
// # Naming the master
//
// go-redis gives every redis.NewFailoverClient the address
// "FailoverClient", so a strategy on one cannot say by its client which
// master it locks on. WithMaster names it: the strategy's placement
// (redlease.Placer) is then "failover " and the name, and NewWatcher refuses
// another master name. The idempotency package refuses a lock strategy
// over such a client without it, since Barriers locking on two masters
// would otherwise share records as one lock scheme while their locks
// exclude nothing between them and their fences come from unrelated
// counters.
//
// # Assumptions
//
// Mutual exclusion holds while the primary keeps its data, its clock runs at
// the client's rate within the drift factor, and any promoted replica had
// acknowledged the locks it inherits (on Cluster, every replica has: see
// above; a replica that restarts without its data breaks it). Use quorum where that last assumption
// is not good enough.
package failover
