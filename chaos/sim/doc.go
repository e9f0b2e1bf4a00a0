// Package sim is a seeded, virtual-time simulation of redlease against
// in-process Redis nodes. Each seed runs one scenario (a strategy, its
// options, a workload and a fault schedule) and checks the run's history
// against the library's promises. The library under test is the
// production code: unmodified go-redis clients (options under Gaps)
// reach the simulated nodes through a custom Dialer, and the nodes run
// the library's own Lua scripts. Figures, power measurements and the
// defects the simulator found are in docs/simulator.md.
//
// # Design
//
// Run runs one seed inside a testing/synctest bubble: every goroutine of
// the run (the workload's clients, go-redis, the library's fan-out
// workers and keepers, the network) runs on the bubble's virtual clock,
// which jumps whenever all of them are blocked, so a run of a few virtual
// seconds costs milliseconds of CPU and never sleeps. A goroutine that
// outlives the run fails the bubble (goroutine-leak); a workload still
// running after 120 virtual seconds is stuck. A run whose clock stops
// (a goroutine waits on a sync.Mutex, which synctest does not count as
// durably blocked, while its holder waits on the clock) would never reach
// that bound: TestSim reports a seed in flight for more than 1,000 times
// the real time per seed measured so far (at least a minute) as hung,
// with its replay command and every goroutine's stack, and exits (its
// goroutines cannot be stopped; hang_test.go). One goroutine per run
// (sched.go) delivers every message at its virtual time, in (time, send
// order) order, and runs the nodes' commands.
//
// The network (net.go, world.go): every go-redis connection is simulated.
// Its writes are parsed into commands; each request and reply gets a fate
// (a delay, or lost) drawn from a hash of the seed, the direction and the
// message's identity: a request's is its client, node, content and how
// many times that client sent that content to that node before; a reply's
// the request the node last took from the connection and its count since
// (a connection's settle follows its last request). Which goroutine sent
// first, and which of a client's pooled connections a request took, do
// not decide its fate. Both directions keep FIFO order per
// connection, as TCP does; there is no order across connections. A
// message takes 20-500 µs, one in 50 up to 40 ms more (a spike: a reply
// can arrive after the next attempt started), and one in 500 is lost (not
// on Sentinel links nor in Wake scenarios); faults add delay and loss. A
// lost message is a black-holed link: the connection stays open and the
// caller waits for its deadline.
//
// Nodes (node.go, lua.go): each a miniredis command engine whose key
// expiry runs on the node's own clock, the virtual clock plus its jumps
// plus its lead from clock-rate windows (drift.go). The simulator answers
// what miniredis lacks: INFO server (with a run_id new at every restart,
// which the delayed-restart rule reads), WAIT, EVAL, EVALSHA and SCRIPT
// (one gopher-lua state per node process, redis.call dispatching into
// miniredis), pub/sub in the Wake and Elect scenarios (pubsub.go: a push
// is a reply on the subscriber's own link), CLUSTER on Cluster masters. A
// node can pause (it queues everything, then serves the queue in order),
// crash, and restart empty, from a snapshot taken 5-200 ms before, or with
// its data. A node's script cache is lost on every restart; a generated
// run draws each node warm (three in four) or cold for its first process:
// a warm one has the library's lock scripts cached, as a server has once
// any client ran them, and a cold one answers their first EVALSHA with
// NOSCRIPT (warm.go). The idempotency scripts always start cold.
//
// Failover (replica.go, sentinel.go, failoverwork.go): a primary and one
// replica. The primary ships each write's effects (the keys a script
// declared that changed, with an absolute expiry, as Redis 7 replicates a
// script's effects and PXAT) over a replication link with its own seeded
// delay; the replica applies them in order and acknowledges its offset,
// and WAIT answers from that offset, blocking up to its timeout. Three
// emulated Sentinels answer SENTINEL get-master-addr-by-name, master (with
// its config epoch), sentinels and replicas, and publish +switch-master to
// their subscribers over their own links. Each client dials the primary a
// Sentinel names (primaryDialer) and watches the Sentinels with
// failover.NewWatcher.
//
// The Cluster (cluster.go, watchdog-mixed): three masters, the 16,384
// slots split as redis-cli --cluster create splits them. A go-redis
// ClusterClient seeded with the first master's address learns the
// topology from CLUSTER SLOTS (the simulator also answers SHARDS, NODES,
// MYID, KEYSLOT and INFO) and runs without routing policies (but the
// fresh-client construction's, clusterbound.go, which has go-redis's
// default ones and fetches COMMAND on its first routed command). A master
// refuses, as Redis 7 does, a key of another master's slot (MOVED), keys
// of several slots (CROSSSLOT) and a script touching a key outside its
// declared slot; nothing moves, so any refusal (counted) is a misrouted key,
// but in the failover construction (clusterfail.go), where a spare replica
// follows one master and takes its slots over when it crashes, and in
// cluster-failover's reshard (reshard.go), where a slot range migrates
// from one master to another as Redis 7.0 migrates it: MIGRATING on the
// source, IMPORTING on the target (Node.redirect: on the source a command
// whose keys are all present runs, all absent gets ASK, some of each
// TRYAGAIN; on the target a command runs right after ASKING on its
// connection, else gets MOVED to the source; a call inside a script that
// any of these would redirect fails with "non local key"; checked against
// redis-server 7.0.15), keys moved with their TTL by MIGRATE steps, and
// SETSLOT NODE at the end (CLUSTER SLOTS, SHARDS and NODES then list the
// range with the target). A
// ClusterClient learns the topology through a loader (ClusterSlots
// option) that asks the masters it knows over the simulated network in an
// order drawn from the seed, where go-redis would use math/rand's. In
// cluster-failover (clusterrepl.go) every master has a replica (nodes 3-5
// follow masters 0-2, replica.go's replication and WAIT): CLUSTER SLOTS
// lists each master and its online replicas, CLUSTER SHARDS each shard's
// two nodes with role and health as Redis 7 sends them (RESP2 flat maps),
// a replica answers a key of its master's slots with MOVED, and a master
// that a TAKEOVER replaced may serve on in its old view for a while
// (Node.staleShard: it accepts its old slots and answers CLUSTER from that
// view). While a clusterdown window lasts (clusterdown.go) every Cluster
// node answers a command naming a key "CLUSTERDOWN The cluster is down"
// (after CROSSSLOT, before MOVED, ASK and TRYAGAIN, as Redis 7's
// getNodeByQuery), and a key's call inside a script that declares none
// fails with "ERR Script attempted to execute a command while the
// cluster is down"; keyless commands (WAIT, CLUSTER SHARDS and SLOTS)
// answer as always, as Redis answers them while down.
//
// A client whose clock drifts reads a redlease.Clock (simClock) in its
// Locker, strategy and keepers; the others read the bubble's clock.
//
// # Faults and grading
//
// A seed's faults are drawn before the run (schedule.go: same seed, same
// schedule), start in the first three quarters of the scenario's Horizon,
// and are applied by a driver goroutine, after each of which every live
// lock is checked. Each fault is INSIDE the strategy's documented
// assumptions, or OUTSIDE (OUTSIDE-FENCES: outside those of fence order
// only) with the assumption it breaks:
//
//   - delay, loss (requests lost before they apply, replies after),
//     partition (a client from some nodes), cut (connections), pause,
//     blackhole (every message to and from a node lost, connections
//     open), badkey (a lock key overwritten with a hash), errnode (every
//     script call answered NOPERM or BUSY), blink (the idempotency store
//     crashes and comes back with its data): INSIDE.
//   - restart: durable, INSIDE. Empty or from a snapshot: OUTSIDE without
//     the delayed-restart rule (the node votes at once); under the rule,
//     INSIDE, or OUTSIDE-FENCES with fences on (its counters went back);
//     OUTSIDE for a snapshot restart of a node declared durable.
//   - clock-jump (a node's clock 5-400 ms forward) and clock-skew (a
//     majority's clocks forward together): OUTSIDE.
//   - clock-drift (drift.go): a node's clock at rate 1+r, a client's at
//     1-r, within a budget of 0.9 times the seed's smallest drift factor
//     split between the nodes and the clients, so that any node and
//     client together stay within it: INSIDE. One drift seed in eight also
//     runs a node at 1.2-3 times the largest factor: OUTSIDE.
//   - failover: crash (promotion after a 30-80 ms down-after, the old
//     primary back empty 50-300 ms later as a replica) or switch (the old
//     primary serves on, WAIT answering 0, until demoted 0-100 ms later):
//     INSIDE; one in eight promotes a replica 20-200 ms stale: OUTSIDE.
//     failback (a third of the runs without a stale promotion: the old
//     primary, rejoined and resynchronised, promoted back at epoch 3),
//     repl-slow, repl-hole (the link holds everything both ways), repl-cut
//     (in flight lost, then a resync), sentinel-hung, sentinel-down,
//     sentinel-lossy (never all three Sentinels), sentinel-mute (every
//     +switch-master of both moves lost, polls still answered): INSIDE.
//   - lostpub, subcut, subslow (Wake scenarios: pushes lost with the
//     connection up, subscription connections cut, pushes delayed): INSIDE.
//   - cluster-failover (cluster-failover; clusterrepl.go): one shard of
//     the Cluster fails over. behind+takeover: its replica's link is cut,
//     the replica promoted 150-350 ms later while the old master serves on
//     0-100 ms in its old view (WAIT there answering 0), then follows the
//     new master; behind+crash: the link cut, the master killed 20-150 ms
//     before the promotion 300-450 ms later, back empty as a replica
//     50-300 ms after it; healthy: the master killed, the replica (caught
//     up) promoted 20-150 ms later, the old one back as above. Until it
//     follows, CLUSTER SHARDS lists the old master in the shard as a
//     master without slots (failed while down), as Redis 7 lists a failed
//     primary. INSIDE: WAIT-acknowledged grants survive it.
//   - reshard (cluster-failover, two runs in three; reshard.go): slots
//     around k1's (0-200 either side) migrate from the shard after the
//     failing one to the next: MIGRATING/IMPORTING, 5-40 ms later a
//     MIGRATE of some of the range's keys (of the construction's three,
//     the first, the second in half the runs, never the third), and in
//     half the runs (complete) 20-200 ms later the rest and SETSLOT NODE;
//     otherwise (half) the range stays half migrated for the rest of the
//     run. In the crash modes it starts 110-200 ms after the failing
//     master rejoined (past the Horizon's first three quarters); no pause
//     touches the two shards from 100 ms before it. INSIDE: a migration
//     is routine operation.
//   - clusterdown (cluster-failover, one run in two; clusterdown.go):
//     every Cluster node, master or replica, answers every keyed command
//     CLUSTERDOWN for 10-60 ms (short: well under every TTL) or 200-600 ms
//     (long: past the workload's TTLs), as a Cluster with
//     cluster-require-full-coverage does while a master is unreachable
//     (the window is drawn, not caused: no master goes down for it). Half
//     the time during the workload, ending 150 ms before the failover's
//     cut or crash where there is room, else 0-300 ms after the
//     failover's span (its promotion plus the later of the old master's
//     rejoin and 450 ms, plus 150 ms). INSIDE: an outage, which costs
//     only the locks whose Deadline it outlasts.
//   - latejoin (fair-quorum3, half the seeds; heads.go): for a window,
//     each Acquire of a fair client's Lock attempt reaches one node of a
//     majority, chosen by the attempt's token, up to 20-150 ms late, so
//     that a join may land after its Lock call was granted and released
//     (a leftover entry, ahead of every later waiter): INSIDE.
//
// A violation is a HAZARD only within the scope of an outside fault that
// began before it (scope.go): the locks a clock jump, skew or excess rate
// cut short on its nodes; the locks a restart without the rule lost; for
// the fence invariants, the grants a node voted for after its counters
// went back; for a stale promotion, the old primary's grants after the
// replica's snapshot. Holds are matched by their Lock call (a token's
// base). Only violations that name holds can be excused (overlap,
// fence-order, stale-accepted, state-valid), a state-valid one only by
// scopes that touched as many of the nodes its lock was short on as it
// lacked. Every other violation is a FAIL.
//
// TestSim's report counts, per scenario and outside fault kind, the
// faults drawn and those that excused a hazard (state-valid's in rows of
// their own). Each row has a ceiling on that share (hazardCeiling,
// tally_test.go); a row of 30 or more faults fails the test when its
// share exceeds the ceiling by more than four binomial standard
// deviations plus two faults, or when it excuses hazards and has no
// ceiling: a strategy failing more often under an outside fault shows
// even while each violation is excused.
//
// # Scenarios
//
// Rotation is the lock rotation: seed s runs Rotation[s % len(Rotation)]
// unless -scenario names one (-rotation idem: IdemRotation, below). The
// general faults are one to five drawn by makeSchedule (delay, loss,
// partition, cut, pause, restart, clock-jump, clock-skew), restricted by a scenario's Kinds; clock-drift comes in
// half the seeds of the scenarios that draw them all (quorum5-*,
// quorum3-plain, quorum3-restart, single, fair-quorum5) and of the ops
// scenarios. lockClient (workload.go) takes a key with Lock (a 1-2 ns
// retry delay, bounded attempts) or TryLock, holds it a few steps,
// writing its fence to the fenced register while Valid and extending
// half the time (never below the validity left), and releases it with a
// ctx too short for the reply a quarter of the time, or not at all one
// time in ten. doClient (dowork.go) runs one lane per strategy, each
// doing Locker.Do kept by the client's one renew.Watchdog; fn works in
// steps for up to three TTLs, checking the nodes and writing while Valid.
// Both pause before one register write in eight, for up to 1.5 TTLs, so
// that the fences must refuse stale writes.
//
//   - quorum5-fenced: quorum over five nodes with fences, four clients on
//     two keys, lockClient, the general faults.
//   - quorum5-restart: the same with the delayed-restart rule.
//   - quorum3-plain: three nodes, no fences, one key.
//   - quorum3-restart: three nodes, the rule, no fences.
//   - quorum3-snapshot: quorum3-restart whose only faults are restarts
//     from a snapshot taken shortly before the crash (the boot marker
//     kept, the locks since lost): the rule must tell the new process by
//     its run_id.
//   - quorum3-extend: the rule with long holds, every extension asking 1.5
//     times its max TTL (to be refused), empty restarts, partitions, loss.
//   - watchdog-mixed: doClient over quorum on nodes 0-4 (fenced), single
//     on node 5, and single on a ClusterClient (nodes 6-8), under pauses,
//     black holes, loss, cuts, partitions, delays, badkey and errnode,
//     and one to three of those on one Cluster master.
//   - barrier (barrierwork.go): idempotency.Barrier clients on one store
//     sending requests on three keys with 20-150 ms timeouts and up to
//     four tries; even clients keep the lock with their Watchdog, odd
//     ones leave it to expire within its lease. The handler applies its
//     effect to a fenced effect store while its ctx is live. Pauses,
//     delays, loss, cuts and blinks of the store.
//   - single: the single strategy on one node, lockClient.
//   - quorum3-pastmax (pastmax.go): aimed at the rule's bound on
//     extensions: clients partitioned from one node each, empty restarts
//     inside long holds extended mostly past the max TTL.
//   - failover: four clients, even ones lockClient, odd ones doClient (and,
//     in a run with a failback, a long lane holding a key of their own
//     across both moves); one failover, the failover faults, the data
//     nodes' links slow, lossy or cut, nodes paused or restarted.
//   - wake-single, wake-quorum3 (wakework.go): waiters woken by release
//     notices on one hot key, under the pub/sub faults only (none in a
//     quarter of the seeds).
//   - wake-herd: wake-quorum3 with two waiters per client on one Locker,
//     so that a release's pushes from three nodes reach a process while
//     one of its waiters was woken and another waits.
//   - fair-quorum5: quorum5-restart in fair mode (three clients in the
//     keys' lines, one outside them), under the general faults.
//   - fair-single, fair-quorum3: the Wake scenarios in fair mode;
//     fair-quorum3 also draws latejoin. fair-herd: fair-quorum3 with two
//     waiters per client, as wake-herd is wake-quorum3's.
//   - multi-quorum3, multi-single, multi-single-faults (multiwork.go):
//     transfers between accounts under sets of two keys
//     (Locker.TryLockAll, LockAll, DoAll, the keys in the transfer's
//     direction), every client's Locker kept by a Watchdog of its own;
//     each lock of a set is a hold of its key, and set-whole checks that a
//     set is valid as a whole when handed out. Three accounts.
//     multi-quorum3: the general faults, every set taken key by key.
//     multi-single: no faults, and every LockAll and DoAll must be granted
//     within 10 s (set-wait: no deadlock, no key left behind); on single a
//     set's first attempt is one step (redlease.SetAcquirer), then the
//     keys in order. multi-single-faults: multi-single under the general
//     faults, so that steps are abandoned, undone by token, resent and
//     taken over; the fault scopes count a step's grant as a vote for
//     each of its keys (setLine).
//   - revoke-single, revoke-quorum3 (revokework.go): locks kept by a
//     Watchdog while their holders write to the fenced register, and an
//     operator (the last client) who inspects keys (Locker.Inspect) and
//     forces the release of those held by the token it saw
//     (Locker.ForceRelease). A revoked hold is not in overlap with a hold
//     granted after the force was sent, by design, and state-valid stops
//     checking it; fences must still rise. inspect-true: a held key names
//     a token some attempt sent for it (single: with its grant's fence).
//     revoke-single has no faults, and a revoked holder must learn at its
//     next renewal (revoke-lost); revoke-quorum3 has the general faults.
//   - sem-quorum3, sem-single (semwork.go): four clients take permits of
//     one semaphore of two (Locker.Semaphore: TryAcquire, Acquire, Do,
//     and Acquire of a permit then abandoned as by a crashed holder),
//     every client's Locker kept by a Watchdog of its own; each permit is
//     a hold of its slot key, sem-bound counts the permits believed held
//     at once (never more than two), and sem-held-kind checks that "all
//     held" is never answered with a slot undecided. sem-quorum3: the
//     general faults. sem-single: no faults, and every Acquire and Do
//     must be granted within 10 s (sem-wait); its Lockers poll.
//     sem-wake-single: sem-single whose waiters are woken by release
//     notices (SemWake: no polling, a 5 s retry delay, TTLs of 600 ms to
//     1 s), and sem-wake-slow: a release sent while a client waits must
//     see some permit granted within semWakeFast (12 one-way delays).
//   - elect-single (electwork.go; the election rotation, -rotation
//     elect): leader election (redlease.Election) on one key and one
//     primary, no faults, every client's Locker kept
//     by a Watchdog of its own. A leader writes to the fenced register
//     with its term, proclaims values and reads the leader back while it
//     leads, then resigns; half of them then send a late proclamation
//     under their old token and term. The leader's lock is a hold of the
//     key. elect-term: no two Campaigns returned one term, and a Campaign
//     called after another returned has a higher term; elect-value: a
//     leader whose lock was valid across a read of the leader read its
//     own term and a value it proclaimed; elect-late: a resigned leader's
//     late proclamation is refused. Every client also observes the
//     election (Election.Observe on its own Locker, electobserve.go) from
//     before its first Campaign until every client's campaigns ended (at
//     most 60 virtual seconds), the nodes answering pub/sub as in the
//     Wake scenarios, and records each leader its channel sends.
//     elect-observe-order: an observer's leaders never go back (a higher
//     term, or the same term with another value); elect-observe-known:
//     each is a term's leader with a value that leader proclaimed (a
//     value of a Campaign that failed is excused: its term is unknown);
//     elect-observe-timely: a value a Campaign or Proclaim recorded at t,
//     kept by its leader (not lost, no Resign nor other Proclaim sent)
//     until t + 10 ms (20 no-fault one-way delays), was seen by then by
//     every observer observing across it. Observe's doc promises
//     notices and a fallback read every max retry delay (320 ms here);
//     without faults no notice is lost, so the bound is the notice's and
//     the reads', not the fallback's. Quorum is not exercised: it holds
//     no election.
//   - cluster-failover (clusterrepl.go): failover.New on a go-redis
//     ClusterClient over three masters with a replica each (a quarter of
//     the clients WithReplicas(1)); even clients lockClient, odd ones
//     doClient kept by a Watchdog, on a key of the failing shard and one
//     of the next. One shard fails over per run (cluster-failover, below);
//     a construction client (its links meet no fault, no random loss)
//     keeps a key K (TTL 3-4 s) across it, holds and releases a key P
//     before it, in the behind modes keeps a key K2 (TTL 250-400 ms)
//     whose first renewal falls in the cut and tries P during the cut, and
//     takes P again after the old master rejoined; with a clusterdown
//     window, it keeps three keys (one per shard) through it and tries a
//     fourth inside it (down-kept, held-kind/down). Delays, loss, cuts,
//     and pauses of the other shards' nodes.
//   - ops-single, ops-quorum, ops-failover (opswork.go): every public
//     lock operation in random sequences (TryLock, Lock, Do kept by a
//     Watchdog or by the engine Do's default keeper is built from, Keep
//     and its stop, Extend longer, shorter or equal, ExtendAll, Release,
//     Close of keepers and (single, quorum) strategies while a lock is
//     kept, Lost, Valid, Err), with options drawn per seed and client
//     (fences, the rule and durable nodes, three or five nodes, drift
//     factors 0.01-0.2, TTLs, loss margins, fair mode, WithQuorum, node
//     timeouts). A quarter of the single and quorum seeds wake waiters by
//     notices and draw the Wake faults instead of the general ones. In
//     half the seeds one client then runs a bound construction
//     (boundwork.go): a silent release (fn returns as its client's links
//     fall silent for 1-20 ms) or, with wake, a dial-close (the strategy
//     closed while a subscription handshake is held).
//
// The idempotency rotation (-rotation idem; Scenario.Group "idem") drives
// the paths the barrier scenario does not (idemwork.go, tokenwork.go,
// idemhttp.go).
// Each idemClient has its own Barrier (lease 15-60 ms; half the clients
// renew by a Watchdog) and a Consumer on it, and sends requests on a new
// pair of keys every second op, a third through Consumer.HandlePayload,
// with one of two payloads (fingerprint "B" one time in four), a caller's
// ctx of 10-120 ms (every other try ended by a cancel, not a deadline: a
// client that honours contexts then still reads the store's answer to a
// lock attempt sent before the cancel) and up to four tries; the handler works while its ctx
// is live, applies its effect to the fenced effect store, then works
// 0-15 ms more that no ctx stops, and returns.
//
//   - idem-store: the store's own lock; pauses, delays, loss, cuts.
//   - idem-late: handlers that return late in their lease, delay faults
//     only (late completions after a takeover).
//   - idem-quorum: a fenced quorum over nodes 0-2 (the store among them).
//   - idem-mixed: both schemes on one prefix (even clients the store's
//     lock, odd ones the quorum).
//   - idem-unfenced: all clients but the last on a strategy built
//     WithoutFencing (single on the store or a quorum, by seed), the last
//     on the same strategy fenced; New refusing the unfenced one with
//     ErrInvalid is the expected outcome (counted as idem/refused).
//   - idem-failover: records on a plain store node after the Sentinels
//     (it never fails over), locks through a fenced failover.Strategy
//     with its Watcher over the failover scenario's primary and replica,
//     under its faults (one failover, maybe a failback; replication and
//     Sentinel faults; the data nodes' links slow, lossy or cut; the
//     store blinks). A stale promotion (OUTSIDE) excuses handler-overlap,
//     effect-twice, record-taken and replay-outcome after it (Scope.Unheld).
//   - idem-masters: idem-failover with four clients and a second primary
//     with its own replica (no Sentinels, never failing over, no faults):
//     even clients lock through failover on the Sentinels' master, odd
//     ones through failover on the second primary, all on one store and
//     prefix, every go-redis client reporting the address
//     "FailoverClient" as redis.NewFailoverClient's does; each strategy
//     names its master (failover.WithMaster). Two lock schemes that
//     exclude nothing between them: the Barrier must tell them apart
//     (handler-overlap, effect-twice, record-taken).
//   - idem-http: idempotency.Middleware (WithGlobalKeys, one route) on
//     each client's Barrier on the store's lock (idemhttp.go; even
//     clients WithStoreEverything, half renewed), called in process
//     through httptest (the Barrier's Redis traffic on the simulated
//     network), the other clients' idem-* paths not driven. The handler
//     answers a status drawn per try: 201 (its effect made), a relayed
//     409 with Retry-After, 429, 503, or 422. Two keys in three
//     negotiate: their handler names Accept-Language or Accept in Vary
//     and its body follows the request's value; each client prefers one
//     value of each and sends another (or none) on one try in four, so
//     duplicates of a key differ in it now and then. The caller's ctx of
//     10-120 ms only decides whether the client saw the response; the
//     Middleware's error log and its outcome-unknown 503 tell
//     effect-twice which runs ended unknown.
//   - idem-tokens: Tokens issued and consumed by one to three consumers
//     with a ctx of 0.2, 5 or 15 s, over lossy, cut and paused links
//     (go-redis resends a command whose reply was lost).
//
// The fence-expiry rotation (-rotation fence; Scenario.Group "fence"):
// fence-expiry-single, fence-expiry-quorum and fence-expiry-failover are
// ops-single, ops-quorum and ops-failover with fences always on and a
// fence counter TTL (WithFenceTTL) of the seed's longest lock TTL plus
// 0-60 ms, so that counters expire between grants within the run while
// holders paused past Valid still write to the fenced register:
// fence-order and stale-accepted compare fences across the expiries. A
// counter created anew starts from the node's TIME in µs, which is the
// node's clock (virtual time plus its jumps and drift). Their hazard
// ceilings are the ops scenarios' (the same faults cut the same locks
// short); do-bound/silent is not required on single and failover, whose
// silent release asks a TTL above the fence TTL and is refused.
//
// # Invariants
//
// Each invariant counts what it examined in a run (Result.Examined, by
// name; examined.go). TestSim sums the counts per scenario and fails
// when an invariant that applies to a scenario (examinedIn) examined
// nothing over minExaminedSeeds (50) or more of its seeds: a check that
// examined nothing cannot fail. Counts beside an invariant are named
// "<invariant>/<what>"; those registered in examinedIn must not stay at
// zero either.
//
//   - overlap: the belief intervals of one key never intersect; an
//     interval runs from the grant's return to the earliest of Lost
//     closing and Until (and, for Do, fn's return). Examined: pairs of
//     holds of a key.
//   - fence-order (fenced strategies): a hold granted after another ended
//     has a strictly greater fence. Examined: such pairs.
//   - stale-accepted (fenced): the fenced register, which accepts a write
//     only above its last accepted fence, never accepts one that
//     overwrites a write made under a later grant. Examined: accepted
//     writes after an earlier one.
//   - release-kept-valid: once a Release was sent, Lost is closed.
//     Examined: holds whose Release was sent.
//   - state-valid (every scenario; statecheck.go): while a holder believes
//     its lock valid (Lost open, its clock before the Deadline), the nodes
//     that make it valid (a majority of the quorum's nodes, the single
//     node, the Cluster master of its key (in cluster-failover the one
//     serving its slot at the moment: a promoted replica must hold what
//     it acknowledged), the primary that granted it)
//     hold its token until its Until less drift.Fixed, expiries and Until
//     read through the node's and the client's rate windows. Checked after
//     every command a node applied (for the keys it touched), after every
//     fault action, and when a client sees a grant, an extension (its
//     Observer) or a call return. A node that is down counts as holding,
//     as does a node sitting out the rule's max TTL after a restart, and
//     a token badkey replaced until it would have expired; a grant of a
//     primary a later move replaced is left to failover-kept
//     (state-valid/exempt); the Barrier's locks are tracked only while a
//     keeper keeps them. Examined: checks of a lock believed valid.
//   - held-past-expiry (watchdog-mixed): whenever a kept lock says it is
//     Valid, a quorum of its strategy's nodes hold its token, read from
//     the nodes; a hold whose token badkey replaced on enough nodes stops
//     believing by the moment a quorum stopped holding it. Examined: those
//     reads and those holds.
//   - renew-busy-retry (watchdog-mixed): renewals of one lock answered by
//     errnode on the single node or a Cluster master are sent at least the
//     watchdog's retry delay, min(interval/4, 250 ms), apart (on quorum
//     nodes counted only: the fan-out queue may send them bunched).
//     Examined: renewals answered by errnode.
//   - cluster-kept (watchdog-mixed; clusterfail.go): in the failover
//     construction (one seed in two, after the lanes end: a kept lock on
//     a Cluster master whose spare replica follows it; the master crashes
//     and the replica is promoted 20-150 ms later), a protected lock is not
//     lost by its Until at the promotion plus a TTL. Protected: the replica
//     held its token and it was valid at the promotion, the first renewal
//     that failed after it ended at least 500 ms plus five of the client's
//     dial backoffs before the lock's Deadline, and none of the client's
//     messages was lost. Examined: protected constructions.
//     In cluster-failover the construction's K (failover on the Cluster,
//     TTL 3-4 s, in every mode) is protected when the promoted replica
//     held its token and it was valid at the promotion; it must not be
//     lost by its Until at the promotion plus its TTL.
//   - reshard-kept (cluster-failover with a reshard; reshard.go): a lock
//     kept on a healthy Cluster through a migration is not lost. The
//     construction's client (sheltered) takes three keys of k1's slot
//     ({k1's name}m0-m2, TTL 400-800 ms) 20-60 ms before the migration,
//     keeps them with a renew.Watchdog of their own, and reads them three
//     TTLs after the migration's last step. Protected: valid and held on
//     the source as the migration began; healthy: no pause of the source's
//     or the target's shard (master or replica) from 100 ms before the
//     migration to the check, and no Cluster node down meanwhile. A
//     protected lock must be neither lost nor invalid then. Examined:
//     protected locks; a run with a reshard that examined none fails
//     (examined-run). state-valid reads a Cluster lock where its key
//     lives: the source while it has the key, else the target. A run
//     whose clusterdown window meets the reshard's locks (from 100 ms
//     before the migration to their check) judges none of them.
//   - down-kept (cluster-failover with a clusterdown window;
//     clusterdown.go): a lock kept through CLUSTERDOWN is lost only if it
//     must be. The construction's client (sheltered) takes three keys,
//     one per shard, 20-60 ms before the window (TTLs: one long enough
//     that the window cannot outlast it, (window + 600 ms)/0.89 plus 0-200
//     ms, on a shard other than the failing one whose pauses near the
//     window the schedule drops; one of 60-150 ms; one of 100-1500 ms),
//     kept by a renew.Watchdog of its own (default options). As the
//     window ends it reads each lock's Deadline D. Protected: valid and
//     held on its master as the window began, window end + downMargin <=
//     D, and its shard healthy from 100 ms before the window to D (no
//     pause of its master or replica; for the failing shard no part of
//     its failover). downMargin, from the library's code: the retry
//     delay after a failed renewal (renewal.RetryDelay: a quarter of the
//     renewal interval, ttl/3, at most 250 ms) plus two calls (the refused
//     one in flight at the window's end and the one that succeeds), each
//     a few round trips on sheltered links and one WAIT, at most
//     failover.DefaultWaitTimeout + 5 ms. A protected lock must be Valid
//     and not lost at D + 1 ms: its renewals resumed. Examined: protected
//     locks. down-kept/lost: a lock whose Deadline passed (by more than
//     boundSlack) during the window must read lost (Lost closed, Valid
//     false) as the window ends: it could not be renewed, and is reported
//     lost by its Deadline. Examined: such locks.
//   - refused-left (cluster-failover; clusterrepl.go): a TryLock refused
//     for too few acknowledgements (failover.ErrNotReplicated) leaves no
//     key behind on the master that refused it when it returns (the
//     construction's P during the cut). Examined: such refusals, while
//     that node is still an up master.
//   - fence-order/promotion (cluster-failover): the fence-order pairs
//     whose first hold was granted before the promotion and second after
//     (P before the cut and after the rejoin, in every run).
//   - examined-run (cluster-failover): a run in which overlap,
//     fence-order/promotion, cluster-kept, state-valid, in the behind
//     modes refused-left, with a reshard (and no clusterdown window over
//     its locks) reshard-kept, or with a clusterdown window down-kept or
//     held-kind/down examined nothing fails: the construction could not
//     make its case.
//   - healthy-lost (watchdog-mixed; health.go): a protected hold is never
//     lost. Protected: no badkey on its key, faults on at most a minority
//     of its strategy's nodes, a quorum of its granting nodes untouched and
//     losing no message to or from its client from 12 s before the grant
//     (the longest a go-redis call without context timeouts waits) until
//     fn returned, every renewal window long enough for three round trips
//     at the longest delay drawn. Other lost holds are classified in the
//     report. Examined: protected holds.
//   - effect-twice (barrier): the effect store accepts a key's effect at
//     most once, unless an earlier run was told its outcome is unknown
//     (ErrRunCancelled, ErrNotRecorded; counted). A run whose caller left
//     while the handler ran (Do answered with its ctx's error, the
//     handler running on) counts as unknown too, unless the idempotency
//     workload knows its outcome must have been recorded
//     (idem/must-record: returned with the lock valid, the run ended
//     within half a lease with the lock still valid, no fault on the
//     store; or its caller had left and a Watchdog kept the lock valid to
//     the run's end, idem/must-record-left, however long the store
//     failed). Examined: accepted effects.
//   - http-replay (idem-http): a response marked Idempotent-Replayed has
//     the status and body some handler run of its key answered, and that
//     status is one the Middleware records (201, 422; never 409, 429,
//     503, whatever WithStoreEverything). A replay of a negotiated
//     response goes only to a request with the recorded request's value
//     of the field its Vary names; a request whose value differs gets 409
//     negotiation-mismatch (marked replayed), and that answer goes only
//     to a request of a negotiating key whose value differs from that of
//     some run of the key that answered a recorded status. Examined:
//     replayed responses (http-replay/vary: those of negotiating keys;
//     http-replay/vary-differ: of those, the ones whose value differed).
//   - outcome-discarded, record-taken, replay-outcome (idem-* but
//     idem-http): a handler that returned its outcome while its lock
//     was valid is never answered ErrRunCancelled; a run whose lock stayed valid to its end
//     never finds its record taken over or deleted; every caller told nil
//     for a key got one outcome of one payload, a replay is a result some
//     handler of that key and payload returned, and no handler of another
//     payload starts once the key's outcome was recorded. The lock's
//     validity is read from the Lock (a Keeper that records what it
//     keeps; a Barrier on its own strategy runs with a Keeper that renews
//     nothing) or, on the store's lock without a Keeper, judged from the
//     call's start (within 0.8 of the lease, less 3 ms).
//   - handler-cut (idem-* but idem-http): a handler's ctx never ends
//     while it runs and its lock is valid (more than a millisecond of
//     validity left, not known lost): a Barrier cancels a run when its lock is lost, never
//     because its caller left. One handler in two works after its effect
//     under its ctx, so a cut there leaves an effect with an error.
//     Examined: handler runs (idem/cuts: those cut).
//   - answer-kind (idem-* but idem-tokens, idem-http): every error Do or
//     Consumer.HandlePayload returns is of a class their docs name: one
//     of the package's errors (ErrInProgress, ErrMismatch, ErrNotOwner,
//     ErrResultNotStored, ErrRunCancelled, ErrNotRecorded, ErrClosed, a
//     stored, Final or Permanent error), the caller's ctx error once that
//     ctx ended, the handler's own error, or a lock or store failure
//     (redlease.ErrUnavailable, a *redlease.NodeError, a connection's or
//     Redis's error, a timeout) — never the lock's bare ErrNotObtained,
//     which the docs answer with ErrInProgress. Examined: calls answered
//     with an error.
//   - token-once (idem-tokens): at most one Consume of a token returns
//     nil, and when every Consume of it got the store's answer (nil or
//     ErrTokenUsed), exactly one did.
//   - handler-overlap (barrier): two handlers of one key never run at once
//     with live contexts. Examined: pairs of handler spans.
//   - held-kind (failover, ops-failover, cluster-failover; heldkind.go):
//     an acquisition the Locker's observer saw answered "held"
//     (ErrNotObtained and not ErrUnavailable) carries a refusal:
//     *redlease.HeldError, a *redlease.QuorumError, ErrQueued, "no
//     validity left", or the attempt's ctx ending; a failed node or an
//     unacknowledged write is an outage (ErrUnavailable). Examined:
//     acquisitions answered "held" (required in failover and
//     ops-failover). held-kind/down (cluster-failover; clusterdown.go): an
//     attempt that started and ended inside a clusterdown window is
//     answered ErrUnavailable and not ErrNotObtained (nor granted), unless
//     its ctx ended. Examined: such attempts (the construction's TryLock
//     1 ms into the window, and the workload's in a window during it).
//   - failover-kept (failover, ops-failover): let S be the first moment a
//     healthy Sentinel (never hung, neither down nor lossy near its
//     switch) names the run's last move (the failback, else the
//     failover). A hold granted under a configuration that move replaced
//     stops claiming validity by max(S, its grant) + 2 poll + min(3/4
//     poll, 1 s) + 100 ms on its client: the next poll, a poll waiting out
//     a hung Sentinel's ask timeout, one poll missing a busy Sentinel,
//     spikes. Examined: such holds; failover-kept/bound: those still
//     believed at S.
//   - handoff-late (wake-*, fair-single, fair-quorum3): after a release
//     that returned nil while another client was inside Lock (and still
//     is at the bound), some client is granted the key by the holder's
//     grant + TTL + 208.5 ms (wakeSlack; in fair mode plus the 100 ms max
//     retry delay). Examined: such handoffs; handoff-late/heads-differ
//     (fair-quorum3): those during which a node refused a fair attempt as
//     not the head (Queued) while another node's head differed.
//   - wake-slow (the same scenarios): with no pub/sub fault from the first
//     waiter's Lock call to that bound, some client is granted the key
//     within 248 ms of the release (wakeFast): the notice ended the wait.
//     Examined: handoffs with no pub/sub fault.
//
// One case excuses handoff-late and wake-slow, the one docs/fair-mode.md
// documents for quorum nodes with different heads: leftover entries
// (heads.go, leftoverBound). It applies to that key and the window from
// the release to the later of the next grant and the bound, and only to
// nodes that refused a fair attempt as not the head (Queued) while
// another node's head differed, when that head was a waiter whose Lock
// call had ended before the refusal and whose entry was last refreshed
// after that end (a join that landed after it, never refreshed nor
// removed again; an entry the call's own grant, release or leave left
// behind excuses nothing). Per node, take the latest expiry of such a head
// (its last refresh plus LineLifetime, 1 s here); once the majority-th
// earliest of those has passed, a majority holds no leftover, and the
// next grant must come within 308.5 ms more (the new head's Queued wait,
// at most the 100 ms max retry delay, and one acquisition). A live head,
// heads that did not differ, leftovers on a minority, or a grant later
// than that excuse nothing. Excused verdicts are counted ("excused by a
// leftover entry" in the report) and logged, not failed.
//   - fifo (fair-quorum5, fair-single, fair-quorum3; fifo.go): just
//     before a node applies a fair attempt's Acquire, the check reads the
//     key and the line's live entries from that node; if it grants a free
//     key, the attempt is the head of those entries or there are none. A
//     waiter missing from a node's line is ahead of nobody there (counted
//     as a miss fair mode admits). Examined: free-key grants to fair
//     attempts.
//   - panic: Lock.Lost, called under recover, never panics.
//   - goroutine-leak and stuck: see Design.
//
// release-kept-valid, failover-kept, fifo, panic, goroutine-leak and
// stuck are never excused, nor is any invariant that names no hold.
//
// # Bound invariants
//
// Calls that promise to return within a bound do, on the virtual clock,
// whatever the nodes do (bounds.go, ctxbound.go). There the bounds are
// exact (the library's timers fire at their instant and every step
// between them takes no virtual time); each allows boundSlack, 1 ms, for
// a timer the library rounds or restarts. No fault excuses them.
//
//   - do-bound (watchdog-mixed, failover, ops-*): Locker.Do returns within
//     its strategy's call bound of fn's return (quorum's node timeout,
//     redlease.DefaultCallBound for single and failover). Examined: Do
//     calls whose fn ran; do-bound/silent (silent releases) must be
//     non-zero in the ops scenarios.
//   - close-bound (the quorum scenarios, wake-single, fair-single,
//     ops-single): every strategy Close the simulator calls returns within
//     its documented bound (quorum two node timeouts, single and failover
//     primary.CloseWait). Examined: Closes; close-bound/dialing (Closes
//     during a held handshake) must be non-zero in ops-single and
//     ops-quorum, so a dial-close that cannot arrange its stall fails.
//   - ctx-bound (every scenario but barrier and quorum3-pastmax): TryLock,
//     Lock, Lock.Extend, redlease.ExtendAll and Lock.Release called with a
//     ctx deadline return by it, with and without ContextTimeoutEnabled
//     (drawn per client). In watchdog-mixed only the fresh-client
//     construction's TryLock (clusterbound.go: a Cluster client with
//     go-redis's routing policies whose links fall silent before its first
//     routed command). Examined: calls checked (ctx-bound/acquire: TryLock
//     and Lock among them; ctx-bound/cluster-fresh: the construction's).
//   - outage-bound (ops-*; outagework.go): a Lock or Do without a deadline
//     whose client's data links are silent ends with ErrUnavailable within
//     its outage limit (50-400 ms, drawn), or its first attempt's bound if
//     longer (DefaultCallBound on single, plus the WAIT timeout on
//     failover; quorum's node timeout plus fanout.DeadlineSlack). The
//     outage construction (one client in half the ops seeds, after its
//     operations) silences the links and makes the call. Examined: such
//     calls.
//
// # Determinism and replay
//
// A run is a function of its seed, tokens aside. The seed decides the
// schedule, the workloads' choices (a PCG per client and lane), every
// message's fate, and the library's jitter: Lock's retry backoff, a
// waiter's pause before answering an undo notice and the failover
// Watcher's resubscription pause draw from internal/backoff streams the
// simulator seeds per call through its context (jitterCtx: seed, client,
// call). go-redis's own draws are kept off the timeline: each client's
// retry backoff is fixed from the seed (MinRetryBackoff =
// MaxRetryBackoff), its dial retries wait 100 ms plus up to 4 µs drawn
// from the seed, and a ClusterClient asks one master. Where the Go
// scheduler's order among goroutines woken at one instant would decide
// something, they are spread over distinct instants in an order of the
// seed: a blocked Read notices its deadline or a cut up to 4 µs late
// (conn.settle, per connection), and the workloads retry a Lock 1-2 ns
// after its last attempt was decided (retryAtOnce). Every go-redis client
// has an orderHook (order.go): each command (but a connection's HELLO)
// passes the run's turnstile before it asks the pool for a connection.
// The turnstile's goroutine waits (synctest.Wait) until every other
// goroutine of the bubble is durably blocked, so that everything the
// instant started has arrived, then lets through, of each go-redis
// client with a command waiting, the one with the lowest key drawn from
// the seed, its client, its target and its content, and waits again
// until none waits; this takes no virtual time. So commands started
// together (the fan-out workers one Lock deadline frees, an Extend and a
// renewal, a release and a renewal) take idle connections, or queue for
// new ones (go-redis hands a dial's connection to the first request in
// its queue), one at a time in an order of the seed. A command whose ctx
// ends while it runs returns 1-4096 ns later, drawn likewise, so that
// the callers one deadline ends get their answers after the goroutines
// it wakes directly (the failover Watcher's next poll
// looks at which Sentinels are still being asked). A Lock or TryLock
// call's base token (a fair waiter's id, which orders equal tickets) is
// drawn from the seed too: jitterCtx carries internal/locktoken.WithSeed
// (per key, in call order); a context outside this module cannot carry it,
// so production tokens stay crypto-random. An ops client that starts a
// keeper (Keep, or Do's) settles (World.settleInstant: the turnstile)
// before its next step, so the keeper's first renewal reads the lock's
// TTL before an Extend changes it; an idempotency caller's ctx ends 1-999
// ns off the microsecond grid (offGrid), not on a renewal of the lock
// its request took at the same instant, and one with a deadline ends 1-999
// ns before or after the deadline it reports (idemCallerCtx: a cancel
// before it, or a late end), so that a copy of that deadline the library
// makes (Locker.attempt's release of a grant born lost) ends before or
// after the caller's ctx as the seed says; an idempotency client's
// Watchdog renews at a fraction of a third moved 4e-7 to 5e-6 either way
// (keeperFraction), so that a kept lock's fourth renewal falls 18 ns to
// 0.9 µs before or after its first Until, where the Barrier abandons a
// claim bounded by it, as the seed says. The wake hub subscribes a
// batch in channel-name order, and the end-of-run closers run by client,
// then in registration order, a nanosecond after the workload's last
// instant (what that instant started in the background, a fair Lock
// leaving its line after it gave up, runs first). The library's fan-out
// decides, in the goroutine that queues a job for a node, whether it gets
// a worker at once (a free one, else a new one below the node's limit),
// and a worker is free again before the reply it got is published: jobs
// queued together for one node with workers to spare are sent together,
// not one behind the other as the scheduler lets workers come free
// (fair-quorum5 8: a fair Lock's undo and its LeaveLine to one node;
// internal/fanout, node.claim). A quorum acquisition whose ctx ended, or
// reached its deadline, while its first round identified the nodes sends
// nothing (quorum's acquire; it waits for a ctx at its deadline's instant
// to end): its round, started at that instant, went out or not as a woken
// fan-out worker and the caller's decision to undo were scheduled
// (quorum3-pastmax 16, idem-unfenced 4 and 11, ops-quorum 2). A Barrier
// handler that returns as its ctx ends is cut in every run (handlerSpan:
// ctx's AfterFunc starts its goroutine after Done is closed, and the
// handler's return could stop it first; idem-mixed 17). A connection's
// Read returns one reply at most, and a pushed message that a Read would
// start at the instant it finished the reply before it is read conn.settle
// later: a reader that catches up with what came while it was not reading
// (the wake hub pausing after a broken connection, then reading the
// resubscription's confirmation and a release's notice) hands each on
// after everything the one before woke has run (fair-single 13: a waiter
// the confirmation woke checked for a notice before or after the notice
// came, and made one more attempt or not).
//
// Not determined by the seed: the undo pauses of a waiter registered by
// Waker.Listen (no context; no scenario has two waiters of one client on
// one key at once); two commands of one go-redis client with the same
// content at the turnstile together (they go in the order they came);
// rarely (one run in 100 or fewer), orders not examined: followed only
// before quorum's one-round fenced acquire (idem-mixed 5, in every run
// then; since, one history in 1,790 replays of it alone, two in one
// det.sh run of 10), fan-out workers all waiting on a paused node taking
// the jobs queued behind them as go-redis hands them the connections it
// dialled meanwhile. The handshakes a client sends a node at one instant
// share one identity, so one fate (World.requestID): two dials go-redis
// retries at one instant, each for one command, handshake alike,
// whichever the scheduler runs first; the first write after a handshake
// (but a subscriber's) passes the turnstile in the order of its content
// (conn.Write), so the commands those connections were dialled for go out
// in an order of the seed. docs/simulator.md has the measured share of
// exact replays.
//
// -replays N (with -seed) runs the seed N times in turn and compares
// canonical histories: every line, node-level ones included, each lock
// token replaced by T and its number in order of first appearance (an
// attempt's suffix kept), each connection's dial number dropped from its
// name (c1>node0#3 reads c1>node0#), the lines of one exact virtual instant compared
// as a set (goroutines woken together log in the scheduler's order; a
// line that differs, one more or one fewer, still differs). It reports
// the verdicts, the distinct canonical histories with each one's count,
// and the number of distinct histories in logged order. -replaydump DIR
// writes each distinct canonical history to a file in DIR.
//
// # Running
//
// chaos is a module of its own; from the repository's root:
//
//	go -C chaos test ./sim                                # 200 seeds, 30 under -race
//	go -C chaos test ./sim -run 'TestSim$' -seeds 15000   # what make test adds,
//	go -C chaos test ./sim -run 'TestSim$' -rotation idem -seeds 4000   # and this
//	go -C chaos test ./sim -run 'TestSim$' -rotation fence -seeds 900
//	go -C chaos test ./sim -run 'TestSim$' -scenario failover -seed 5 -replays 10
//	chaos/sim/det.sh   # -replays 10 of seeds 1-20 of every scenario: distinct histories per pair
//
// TestSim's flags (sim_test.go): -seeds N from -first
// (default 1; 0 seeds: 200, or 30 under -race); -rotation idem (the
// idempotency rotation instead of the lock one) or fence (the fence-expiry
// rotation); -scenario NAME; -seed S
// (one seed, printing its schedule, each outside fault's scope, its
// history with every command each node applied, and its violations);
// -replays N and -replaydump DIR (see above); -list (print the
// rotation's scenario names, for det.sh); -workers N (seeds at once,
// default GOMAXPROCS: a bubble keeps its CPU busy, more workers only
// cost CPU per seed); -stopfail (stop at the first failure); -inv a,b
// (only these invariants' violations count; examined counts are checked
// as always); -progress (a line every 10 s); -lostfirst (call Lock.Lost
// before Valid on every grant, as Locker.Do does); -findings
// (the regression tests in findings_test.go of defects still open; the
// others run always). TestSim sets the GC percent to 400 unless GOGC is
// set. make test runs the package under -race, then 15,000 seeds of the
// lock rotation (500 per scenario), 4,000 of the idempotency rotation
// (444-445 per scenario), 900 of the fence rotation and 2,000 of the
// election rotation without; make sim runs SIM_SEEDS (100,000) with
// progress lines.
//
// To reproduce a failing seed, run the command it prints (-v shows the
// log of a passing one):
//
//	go -C chaos test ./sim -run 'TestSim$' -scenario NAME -seed S
//
// Check with -replays 10 that it fails every time before relying on one
// history, and diff differing runs' -replaydump files. To show that an
// invariant finds a defect, put the defect back with a go build overlay
// (-overlay f.json, a library file swapped for a copy without the fix)
// and run with -stopfail.
//
// # Gaps versus real Redis
//
//   - miniredis, not redis-server, except what the simulator answers.
//     Scripts run on gopher-lua with the base, table, string and math
//     libraries; the library's string.match patterns run as Go functions
//     matching what the Lua patterns match (TestMatchPatterns); script
//     errors read "ERR user_script: ...".
//   - Expiry is exact and lazy (no active expiry cycle, no replica-side
//     expiry). Snapshots and durable restarts keep string and hash keys
//     only, which is all the library writes. A command is atomic per node
//     and takes no virtual time.
//   - A lost message is lost alone: a later one on the connection still
//     arrives (TCP would retransmit, or lose the connection). No workload
//     pipelines more than one command per connection, so replies never
//     misalign. A connection the client closes still delivers its
//     requests in flight; a cut or a crash loses them.
//   - go-redis runs with DisableIdentity, maintenance notifications off
//     (their auto mode resolves the address in DNS, outside the bubble),
//     RESP2, 1 KiB buffers and a pool of 64 connections per client and
//     node, never exhausted (a pool turn waits on a timer from a
//     process-wide sync.Pool, fatal in another bubble).
//   - Failover: one replica, one failover and at most one failback per
//     run; replication ships key states (scripts' KEYS, a few write
//     commands; strings and hashes); the schedule, not an election,
//     decides each promotion and each Sentinel's switch. Clients do not
//     use redis.NewFailoverClient, which holds a mutex across network
//     calls (a goroutine waiting on a mutex is not durably blocked, so the
//     clock would stop); the simulator closes their connections to a
//     demoted primary. Primary and replica drift at one rate.
//   - Wake scenarios: a connection's handshake takes no virtual time and
//     meets no fault, since go-redis's PubSub dials holding a mutex the
//     wake hub's other goroutine waits on; for the same reason they lose
//     no command and pause no node. The dial-close construction holds one
//     handshake only once nobody waits on that mutex (boundwork.go).
//   - Resharding only in cluster-failover, one range per run, moved by
//     the simulator (no MIGRATE command, no CLUSTER SETSLOT or GETKEYSINSLOT
//     from clients; CLUSTER NODES does not show the migrating state); every
//     node learns SETSLOT NODE at once; the source keeps no copy of a moved
//     key. CLUSTERDOWN only as clusterdown's drawn window: a crashed
//     master does not take the Cluster down, and every node enters and
//     leaves the state at the same instant; reads are refused as writes
//     (cluster-allow-reads-when-down no). No gossip or failure detection (the schedule decides each promotion
//     and when an old master learns of it); replicas only in
//     cluster-failover (CLUSTER SLOTS lists them there only, so that
//     watchdog-mixed's histories stay as they were), and there every
//     replication-offset in CLUSTER SHARDS reads 0. Its clients warm up on
//     a quiet network.
//   - Process-wide objects cannot cross bubbles: every keeper is made in
//     its run, so Locker.Do's default keeper is exercised through the same
//     engine built per client (ops scenarios), not itself.
//   - Fence counter TTLs: the ops scenarios draw WithFenceTTL at 30-60 s
//     (or leave the default, 10 minutes), longer than any run; only the
//     fence-expiry rotation lets counters expire within a run.
package sim
