// Package single keeps locks on one Redis primary: SET NX PX and a fence
// counter INCR in one Lua script (one round trip), and compare-token-then-act
// scripts for Extend and Release.
//
// # Guarantees
//
// Mutual exclusion holds while the primary keeps its data and stays the
// primary, and its clock runs at the client's rate within the drift factor.
// Fences (on by default) rise strictly for successive holders of a key
// under the same conditions. The fence counter expires (WithFenceTTL;
// redlease.DefaultFenceTTL by default) and one created anew starts from
// the server's clock in microseconds, so fences rise across its expiry as
// long as the server's clock does not step back by the fence TTL.
//
// # What it does not guarantee
//
// Redis replication is asynchronous. If the primary fails and a replica that
// had not yet received a lock is promoted (Sentinel, Cluster failover), the
// lock is gone and a second holder can be granted while the first still
// believes it holds it. Fences then protect storage only if the fence
// counter survived the failover too, which is not guaranteed either. Use
// quorum for work where a double grant costs money.
//
// # Bounds
//
// Every call returns by its ctx deadline, with or without go-redis's
// ContextTimeoutEnabled. On a ClusterClient a call runs on a goroutine
// of its own whatever its options (go-redis fetches COMMAND, at a
// ClusterClient's first routed command, on a 5 s context of its own, not
// the caller's). A call whose ctx has no deadline waits at most
// redlease.DefaultCallBound (1 s). The clean-up after a
// failed acquisition (the release of what it may have written, by its
// token) runs in the background, at most a DefaultCallBound; Close ends
// it. An operator's Inspect and ForceRelease are bounded the same way.
//
// # Redis Cluster
//
// A Cluster client works: the fence counter's key shares the lock key's hash
// slot. It lies in the reserved namespace (redlease.ReservedPrefix, which no
// lock key may enter): "redlease:fence:tag:"+key when key has a hash tag
// ("{order:7}:lock" → "redlease:fence:tag:{order:7}:lock") and
// "redlease:fence:{"+key+"}" otherwise ("order:7" →
// "redlease:fence:{order:7}"). Keys that contain '}' without a valid hash
// tag are rejected, since no same-slot companion can be built for them.
//
// Renewals of many keys (ExtendBatch: the watchdog) send one pipeline per
// master, with one script call per 500 keys whatever their slots: the call
// declares no key (a script without a shebang may touch keys of several
// slots that its node serves, Redis 7.0 and later). A key the master no
// longer serves, or has already handed over because its slot is
// migrating, fails alone there and is sent again on its own, so that the
// Cluster client follows MOVED or ASK: a slot left half migrated costs no
// lock. CLUSTERDOWN (a master down, with cluster-require-full-coverage on,
// the default) refuses every write on every master, renewals included:
// locks on healthy masters are lost at their Deadline unless the cluster
// recovers first; set cluster-require-full-coverage no to keep them.
//
// A master's failover: go-redis reloads a ClusterClient's topology by
// itself only on MOVED, ASK and READONLY, which a dead master never
// sends, and every ClusterStateReloadInterval (60 s by default). So a
// call that a master leaves without a reply asks go-redis for a reload
// and marks that master silent until it answers again; a batch of
// renewals whose keys the topology still places on a silent master waits
// for a reload to place them elsewhere, at most 500 ms and half of its
// own wait, and then sends them where the topology says. A lock whose
// master fails over to a replica that had replicated it is kept if that
// leaves time before its Deadline: the first renewal to the dead master
// fails (it waits, like any silent master's, up to nine tenths of the
// time its call has), the reload finds the new master (go-redis asks the
// nodes it knows in a random order, and spends its dial retries on the
// dead one when it asks it first; on a host that does not answer at all,
// its dial timeouts), and the next renewal goes there. A failover before
// the replica had the lock can grant it twice (see the package doc's
// guarantee).
//
// # Fair mode (redlease.WithFairness)
//
// Strategy implements redlease.Queuer: the primary keeps the key's line,
// a sorted set at "redlease:queue:"+the same suffix as the fence counter
// ("redlease:queue:{order:7}", "redlease:queue:tag:{order:7}:lock"), in
// the lock key's slot. The acquire script grants a free key only to the
// head of the line (the line, step by step: docs/fair-mode.md); it adds
// refusals, never grants. On one primary there is one line, so order is
// exact among fair clients whose clocks agree; a head that dies stalls the
// key for one entry lifetime at most. A failover that promotes a replica
// may lose the line with the lock: the waiters' next attempts rebuild it
// at their own tickets. The failover strategy shares this code.
//
// Waiters of Locker.Lock are woken by releases (see redlease.Waker). On a
// Cluster client the release script uses plain PUBLISH, which the cluster
// bus carries to every node, and waiters share one plain SUBSCRIBE
// connection per client, to any node. Sharded pub/sub (SPUBLISH and
// SSUBSCRIBE, Redis 7) would keep each notice on its shard, but a client
// then needs one subscription connection per shard and must follow slot
// migrations, which go-redis's PubSub (one connection, routed by its first
// channel) does not; the wake channel is already in the key's slot
// (redlease:wake:{key}), so that a later version can switch.
package single
