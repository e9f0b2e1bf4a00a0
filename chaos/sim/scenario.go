package sim

import (
	"cmp"
	"time"
)

// Strategy names of a Scenario.
const (
	Quorum   = "quorum"
	Single   = "single"
	Failover = "failover"
	// FailoverCluster: the failover strategy on a go-redis ClusterClient
	// (failover.New(cc)), over the simulated Cluster with a replica behind
	// every master (clusterrepl.go).
	FailoverCluster = "failover-cluster"
)

// Scenario is one kind of run: a strategy with its options, a workload, and
// whether faults are drawn. A seed picks the faults, the delays and the
// workload's choices.
type Scenario struct {
	Name     string
	Strategy string // Quorum, Single, Failover or FailoverCluster
	Nodes    int    // quorum: lock nodes; single: 1; failover: 2 (a primary and its replica); FailoverCluster: 0 (its nodes are the Cluster's)
	// Sentinels: failover only, the emulated Sentinels (nodes after the
	// primary and replica).
	Sentinels int
	Clients   int // workload clients, each with its own go-redis clients and Locker
	Keys      int // lock keys they contend for
	Ops       int // operations per client (bounded loop)
	TTL       [2]time.Duration

	Fencing        bool          // quorum.WithFencing (single and failover fence by default)
	DelayedRestart time.Duration // quorum.WithDelayedRestart(maxTTL); 0: off
	// Watchdog: the clients run Locker.Do kept by a renew.Watchdog of
	// their own, on a second strategy (single) beside the scenario's own
	// (and the Cluster with Cluster).
	Watchdog bool
	// Cluster (with Watchdog): a third strategy, single on a go-redis
	// ClusterClient to ClusterMasters simulated Cluster masters (after the
	// single strategy's node), kept by the same watchdog; one master per
	// seed gets pauses, black holes, errnode and badkey faults. With
	// FailoverCluster: the run's only nodes, ClusterMasters masters and a
	// replica following each.
	Cluster bool
	// Barrier: the clients send idempotent requests through an
	// idempotency.Barrier on node 0 (the store), with client timeouts.
	Barrier bool
	Faults  bool // draw a fault schedule
	// Horizon: faults start in its first three quarters (0: 1.5 s). Set
	// near the workload's mean virtual length: a fault drawn after the
	// workload ended tests nothing.
	Horizon time.Duration
	// HoldSteps bounds the steps of a hold (sleep, write, maybe extend):
	// 0 to HoldSteps-1 of them (0: 4).
	HoldSteps int
	// PastMax: with the delayed-restart rule, one extension in PastMax
	// asks for 1.5 times the rule's max TTL, which must be refused (0: 4).
	PastMax int
	// Kinds restricts the fault kinds drawn (nil: all).
	Kinds []string
	// RestartModes restricts the restart modes drawn (nil: empty,
	// snapshot, durable).
	RestartModes []string
	// ShortExtends lets the workload extend a lock with a TTL shorter than
	// the validity it has left (the case of TestFindingShortExtend). Off,
	// an extension never shortens.
	ShortExtends bool
	// Wake: the Lockers wait by release notices (no WithPolling); the
	// nodes answer SUBSCRIBE, UNSUBSCRIBE and PUBLISH (pubsub.go), a
	// connection's handshake takes no virtual time, and no message is
	// lost at random (only pushes, under the pub/sub faults). See
	// wakework.go.
	Wake bool
	// Fair: every client's Locker but the last waits in fair mode
	// (redlease.WithFairness), the last without: fair waiters in line
	// behind a holder that never joined it, and a waiter that ignores the
	// line beside them. Fairness only adds refusals (the Queued reply), so
	// every invariant of the scenario without it holds.
	Fair bool
	// Schedule, if set, draws the faults instead of the generic draw
	// (quorum3-pastmax); Client, if set, is the workload's client instead
	// of lockClient.
	Schedule scheduleFunc
	Client   clientFunc
	// OpsWork: every public lock operation in random sequences, with
	// options drawn per seed and client (opswork.go); the seed's draw
	// sets Fencing, DelayedRestart, Durable, Nodes (quorum) and Wake.
	OpsWork bool
	// Durable: quorum.WithDurableNodes (with DelayedRestart): a node
	// restarted from a snapshot votes at once, OUTSIDE.
	Durable bool
	// Idem: the idempotency workloads of idemwork.go and tokenwork.go
	// (IdemStore, IdemQuorum, IdemMixed, IdemUnfenced, IdemTokens)
	// instead of the scenario's own.
	Idem string
	// FenceExpiry (with OpsWork): fences on, and every client's fence
	// counters expire (WithFenceTTL) the longest lock TTL of the seed plus
	// 0-60 ms after their last grant, so that counters expire between
	// grants within the run while holders paused past Valid still write
	// to the fenced register with their old fences.
	FenceExpiry bool
	// Waiters (Wake scenarios): Lock loops per client sharing its Locker
	// (0: one), so that several waiters of one process wait on one key
	// and a release's pushes from each node reach one process's hubs
	// while more than one of its waiters waits (wake-herd).
	Waiters int
	// Revoke: the clients keep their locks with a Watchdog and the last
	// client is an operator who inspects keys and forces the release of
	// those held (revokework.go).
	Revoke bool
	// Multi: the clients transfer between accounts under sets of two
	// keys (multiwork.go), their Lockers kept by a renew.Watchdog of
	// their own (LockAll keeps the keys it took while it waits).
	Multi bool
	// Permits: the clients take permits of one semaphore of Permits
	// permits (semwork.go), their Lockers kept by a renew.Watchdog of
	// their own (Semaphore.Do renews its permit); 0: no semaphore.
	Permits int
	// SemWake: the Sem clients' Lockers do not poll, so that a waiting
	// Acquire subscribes to the slots' releases, and their retry delay is
	// semWakeBackoff, longer than every TTL: only a notice ends a wait
	// before a holder's expiry (sem-wake-slow).
	SemWake bool
	// Elect: the clients campaign for the leadership of one election
	// (electwork.go), their Lockers kept by a renew.Watchdog of their
	// own, and observe it (Election.Observe, electobserve.go): the nodes
	// answer SUBSCRIBE, UNSUBSCRIBE and PUBLISH as in Wake (pubsub.go).
	Elect bool
	// Group: the rotation the scenario belongs to: "" the lock rotation
	// (Rotation), "idem" the idempotency rotation (IdemRotation), "fence"
	// the fence-expiry rotation (FenceRotation), "elect" the election
	// rotation (ElectRotation).
	Group string
	// reshardOverlap (TestFindingAskReloadsTopology): cluster-failover's
	// reshard may come while the failing shard's master is down (by
	// default it comes after that master rejoined: reshard.go).
	reshardOverlap bool
	// noClusterDown (reshardFinding): cluster-failover draws no
	// clusterdown window, so that a seed keeps the schedule it had before
	// the window existed (clusterdown.go).
	noClusterDown bool
}

// Scenarios is every scenario: the lock rotation's (Rotation) first,
// then the idempotency rotation's (IdemRotation).
var Scenarios = []Scenario{
	{Name: "quorum5-fenced", Strategy: Quorum, Nodes: 5, Clients: 4, Keys: 2, Ops: 4, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Fencing: true, Faults: true, Horizon: 600 * time.Millisecond},
	{Name: "quorum5-restart", Strategy: Quorum, Nodes: 5, Clients: 4, Keys: 2, Ops: 4, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Fencing: true, DelayedRestart: 400 * time.Millisecond, Faults: true, Horizon: 600 * time.Millisecond},
	{Name: "quorum3-plain", Strategy: Quorum, Nodes: 3, Clients: 3, Keys: 1, Ops: 4, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Faults: true, Horizon: 550 * time.Millisecond},
	{Name: "quorum3-restart", Strategy: Quorum, Nodes: 3, Clients: 3, Keys: 1, Ops: 4, TTL: [2]time.Duration{60 * time.Millisecond, 200 * time.Millisecond}, DelayedRestart: 200 * time.Millisecond, Faults: true, Horizon: 450 * time.Millisecond},
	// quorum3-snapshot: quorum3-restart whose only faults are restarts
	// from a snapshot taken 5-200 ms before the crash (which keeps the
	// boot marker of the process before, not the locks granted since):
	// the delayed-restart rule must tell the new process by its run_id
	// (mutant 14, which fair-quorum5's overlap found about once in
	// 10,000 seeds, is found here about once in 40).
	{Name: "quorum3-snapshot", Strategy: Quorum, Nodes: 3, Clients: 3, Keys: 1, Ops: 4, TTL: [2]time.Duration{60 * time.Millisecond, 200 * time.Millisecond}, DelayedRestart: 200 * time.Millisecond, Faults: true, Horizon: 450 * time.Millisecond,
		Kinds: []string{FaultRestart}, RestartModes: []string{"snapshot"}},
	// quorum3-extend is built to catch an Extend past the rule's max TTL
	// (the bound of 8a56ae8): long holds (up to 9 steps), every extension
	// asking for 1.5x the max TTL, restarts that lose the data, and
	// request loss and partitions so that grants land on bare majorities;
	// a node restarted empty votes again max TTL after its first contact,
	// while a lock extended past it may still be believed held.
	{Name: "quorum3-extend", Strategy: Quorum, Nodes: 3, Clients: 3, Keys: 1, Ops: 6, TTL: [2]time.Duration{40 * time.Millisecond, 100 * time.Millisecond}, DelayedRestart: 100 * time.Millisecond, HoldSteps: 10, PastMax: 1,
		Kinds: []string{FaultRestart, FaultPartition, FaultLoss}, RestartModes: []string{"empty"}, Faults: true, Horizon: 600 * time.Millisecond},
	// watchdog-mixed: Locker.Do kept by one renew.Watchdog per client over
	// three strategies at once (quorum over nodes 0-4 with fences, single
	// on node 5, single on a 3-master Cluster, nodes 6-8), fn working one
	// to three TTLs, under pauses, black holes, lossy and cut links,
	// partitions and slow links, lock keys overwritten with a hash
	// (badkey) and nodes answering every script call with a fast error
	// (errnode); on the Cluster, pauses, black holes, errnode and badkey
	// on one master per seed.
	{Name: "watchdog-mixed", Strategy: Quorum, Nodes: 5, Clients: 3, Keys: 2, Ops: 3, TTL: [2]time.Duration{60 * time.Millisecond, 200 * time.Millisecond}, Fencing: true, Watchdog: true, Cluster: true,
		Kinds: []string{FaultPause, FaultBlackhole, FaultLoss, FaultCut, FaultPartition, FaultDelay, FaultBadKey, FaultErrNode}, Faults: true, Horizon: 700 * time.Millisecond},
	// barrier: idempotency.Barrier clients on one store (node 0) with
	// client timeouts and retries, the store blinking (crash and durable
	// restart), paused, slow, lossy and cut.
	{Name: "barrier", Strategy: Single, Nodes: 1, Clients: 3, Keys: 3, Ops: 4, TTL: [2]time.Duration{30 * time.Millisecond, 150 * time.Millisecond}, Fencing: true, Barrier: true,
		Kinds: []string{FaultPause, FaultDelay, FaultLoss, FaultCut}, Faults: true, Horizon: 600 * time.Millisecond},
	{Name: "single", Strategy: Single, Nodes: 1, Clients: 3, Keys: 2, Ops: 4, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Fencing: true, Faults: true, Horizon: 1100 * time.Millisecond},
	// quorum3-pastmax: built for the bound of 8a56ae8 (see pastmax.go):
	// clients partitioned from one node each, empty restarts inside long
	// holds extended mostly past the max TTL, the key contended throughout.
	{Name: "quorum3-pastmax", Strategy: Quorum, Nodes: 3, Clients: 3, Keys: 1, Ops: 120, TTL: [2]time.Duration{40 * time.Millisecond, 100 * time.Millisecond}, DelayedRestart: 100 * time.Millisecond, HoldSteps: 12, Faults: true, Horizon: 300 * time.Millisecond,
		Schedule: pastMaxSchedule, Client: (*World).pastMaxClient},
	// failover: the failover strategy on a primary with one replica (WAIT
	// 1 after every grant) behind three emulated Sentinels, clients on a
	// go-redis client that dials the primary a Sentinel names
	// (primaryDialer), each with a failover.NewWatcher over every Sentinel;
	// half run Lock/TryLock/Extend/Release, half Locker.Do kept
	// by a renew.Watchdog, on the same keys. One failover per run (the
	// primary killed or not, the promoted replica maybe stale), in one
	// run in three followed by a failback (A→B→A, its announcements
	// mostly lost; failoverwork.go), around it replication-link faults,
	// Sentinels hung, down or lossy, and the clients' links to the data
	// nodes slow, lossy, cut or paused.
	{Name: "failover", Strategy: Failover, Nodes: 2, Sentinels: 3, Clients: 4, Keys: 2, Ops: 4, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond},
		Kinds: []string{FaultDelay, FaultLoss, FaultCut, FaultPause, FaultRestart}, RestartModes: []string{"empty", "durable"}, Faults: true, Horizon: 900 * time.Millisecond},
	// wake-single, wake-quorum3: waiters woken by release notices (no
	// polling) on one hot key, under lost publishes, cut subscription
	// connections and slow pushes (wakework.go); besides mutual
	// exclusion, a liveness bound: after a confirmed release with a
	// client waiting, some client is granted the key within the holder's
	// TTL plus wakeSlack of the holder's grant.
	{Name: "wake-single", Strategy: Single, Nodes: 1, Clients: 3, Keys: 1, Ops: 4, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Fencing: true, Wake: true,
		Faults: true, Horizon: 900 * time.Millisecond, Schedule: wakeSchedule, Client: (*World).wakeClient},
	// wake-quorum3 makes two Lock calls per client, not four, to keep its
	// seeds' cost near the rotation's (docs/simulator.md, Speed).
	{Name: "wake-quorum3", Strategy: Quorum, Nodes: 3, Clients: 3, Keys: 1, Ops: 2, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Wake: true,
		Faults: true, Horizon: 600 * time.Millisecond, Schedule: wakeSchedule, Client: (*World).wakeClient},
	// fair-quorum5: quorum5-restart with Fair: the lines of fair mode on
	// nodes that pause, restart empty (the delayed-restart rule keeps
	// exclusion), lose requests and are partitioned, so that nodes hold
	// different lines; the Lockers poll, as in quorum5-restart.
	{Name: "fair-quorum5", Strategy: Quorum, Nodes: 5, Clients: 4, Keys: 2, Ops: 4, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Fencing: true, DelayedRestart: 400 * time.Millisecond, Fair: true, Faults: true, Horizon: 600 * time.Millisecond},
	// wake-herd: wake-quorum3 with two waiters per process (Waiters), so
	// that the later pushes of a release come while the waiter the first
	// woke still waits, or after it was granted and left, with another of
	// its process's waiters waiting: what a release that names itself
	// decides (internal/wake, ReleaseMark).
	{Name: "wake-herd", Strategy: Quorum, Nodes: 3, Clients: 2, Waiters: 2, Keys: 1, Ops: 2, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Wake: true,
		Faults: true, Horizon: 600 * time.Millisecond, Schedule: wakeSchedule, Client: (*World).wakeClient},
	// fair-single, fair-quorum3: wake-single and wake-quorum3 with Fair
	// (the lines of fair mode, and a client outside them), under the same
	// pub/sub faults.
	{Name: "fair-single", Strategy: Single, Nodes: 1, Clients: 3, Keys: 1, Ops: 4, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Fencing: true, Wake: true, Fair: true,
		Faults: true, Horizon: 900 * time.Millisecond, Schedule: wakeSchedule, Client: (*World).wakeClient},
	{Name: "fair-quorum3", Strategy: Quorum, Nodes: 3, Clients: 3, Keys: 1, Ops: 2, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Wake: true, Fair: true,
		Faults: true, Horizon: 600 * time.Millisecond, Schedule: wakeSchedule, Client: (*World).wakeClient},
	// fair-herd: fair-quorum3 with two waiters per client (Waiters): a
	// release names the head of the line, which may be one of two waiters
	// of one process, the other waiting behind it or outside the line.
	{Name: "fair-herd", Strategy: Quorum, Nodes: 3, Clients: 2, Waiters: 2, Keys: 1, Ops: 2, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Wake: true, Fair: true,
		Faults: true, Horizon: 600 * time.Millisecond, Schedule: wakeSchedule, Client: (*World).wakeClient},
	// multi-quorum3, multi-single: transfers between three accounts
	// under sets of two keys (Multi: TryLockAll, LockAll, DoAll;
	// multiwork.go), the keys given in the transfer's direction.
	// multi-quorum3 under the general faults; multi-single without
	// faults, so that every LockAll and DoAll must be granted within
	// setWait (set-wait: no deadlock, no key left behind by a set that
	// failed). With two accounts every set would be both keys, and no set
	// would wait for its second key while another holds only that one.
	{Name: "multi-quorum3", Strategy: Quorum, Nodes: 3, Clients: 3, Keys: 3, Ops: 3, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Fencing: true, Multi: true,
		Faults: true, Horizon: 450 * time.Millisecond, Client: (*World).multiClient},
	{Name: "multi-single", Strategy: Single, Nodes: 1, Clients: 3, Keys: 3, Ops: 3, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Fencing: true, Multi: true,
		Client: (*World).multiClient},
	// multi-single-faults: multi-single under the general faults, where
	// sets are taken in one step (single: redlease.SetAcquirer): its
	// replies lost, cut, delayed and paused, so that a step is abandoned,
	// undone by token, resent and taken over.
	{Name: "multi-single-faults", Strategy: Single, Nodes: 1, Clients: 3, Keys: 3, Ops: 3, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Fencing: true, Multi: true,
		Faults: true, Horizon: 450 * time.Millisecond, Client: (*World).multiClient},
	// revoke-single, revoke-quorum3: locks kept by a Watchdog, and an
	// operator who inspects keys and forces the release of those held
	// (Revoke; revokework.go). revoke-single without faults, so that a
	// revoked holder must learn at its next renewal (revoke-lost);
	// revoke-quorum3 under the general faults.
	{Name: "revoke-single", Strategy: Single, Nodes: 1, Clients: 3, Keys: 2, Ops: 3, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Fencing: true, Revoke: true,
		Client: (*World).revokeClient},
	{Name: "revoke-quorum3", Strategy: Quorum, Nodes: 3, Clients: 3, Keys: 2, Ops: 3, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Fencing: true, Revoke: true,
		Faults: true, Horizon: 600 * time.Millisecond, Client: (*World).revokeClient},
	// sem-quorum3, sem-single: permits of a semaphore of two (Permits:
	// TryAcquire, Acquire, Do, and Acquire of a permit then abandoned as
	// by a crashed holder; semwork.go), four clients on its two slots.
	// sem-quorum3 under the general faults; sem-single without faults,
	// so that every Acquire and Do must be granted within semWait
	// (sem-wait: permits released or expired come back to waiters).
	{Name: "sem-quorum3", Strategy: Quorum, Nodes: 3, Clients: 4, Keys: 1, Ops: 3, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Fencing: true, Permits: 2,
		Faults: true, Horizon: 450 * time.Millisecond, Client: (*World).semClient},
	{Name: "sem-single", Strategy: Single, Nodes: 1, Clients: 4, Keys: 1, Ops: 3, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Fencing: true, Permits: 2,
		Client: (*World).semClient},
	// sem-wake-single: sem-single whose waiters are woken by release
	// notices (SemWake), with TTLs long enough that a wait a notice did
	// not end outlasts sem-wake-slow's bound.
	{Name: "sem-wake-single", Strategy: Single, Nodes: 1, Clients: 4, Keys: 1, Ops: 3, TTL: [2]time.Duration{600 * time.Millisecond, time.Second}, Fencing: true, Permits: 2, SemWake: true,
		Client: (*World).semClient},
	// elect-single: leader election (Elect; electwork.go) on one
	// primary without faults, so that a resigned leader's late
	// proclamation must be refused (elect-late), and an observer must
	// see a kept proclamation by its notice (elect-observe-timely,
	// electobserve.go). The quorum strategy
	// holds no election (redlease.NewElection refuses it). A rotation of
	// its own (Group "elect", -rotation elect): added to the lock
	// rotation it gives every lock scenario other seeds (s % 26), and
	// multi-quorum3's restart row then exceeds its ceiling on seeds 1-10,000
	// (12 of 99 faults; the same seeds alone on the tree before it give
	// the same histories), which needs a new measurement of the ceilings.
	{Name: "elect-single", Strategy: Single, Nodes: 1, Clients: 3, Keys: 1, Ops: 3, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Fencing: true, Elect: true,
		Group: "elect", Client: (*World).electClient},
	// ops-single, ops-quorum, ops-failover: every public lock operation
	// in random sequences (opswork.go) with options drawn per seed and
	// client (TTLs, loss margins, drift factors 0.01–0.2, fences on or
	// off with or without a counter TTL, fair mode, the quorum's size,
	// node timeout, delayed-restart rule and durable nodes), under the
	// general faults and clock-rate drift (a quarter of the single and
	// quorum seeds: waiters woken by notices, under the Wake faults);
	// ops-failover on the failover scenario's primary, replica,
	// Sentinels and Watchers.
	// cluster-failover: the failover strategy on the simulated Cluster,
	// three masters each followed by a replica (clusterrepl.go): even
	// clients run Lock/TryLock/Extend/Release, odd ones Locker.Do kept by
	// a renew.Watchdog, on a key of the failing shard and a key of
	// another. One shard fails over per run: its replica falls behind (the
	// replication link cut) and is promoted while the old master serves
	// on a little (TAKEOVER) or after it crashed, or the master crashes
	// with replication healthy; a construction client holds, probes and
	// keeps keys of that shard across it. Around it, delays, loss, cuts
	// and pauses on the Cluster's nodes; in two runs in three a slot range
	// of the other shards migrates, completed or left half migrated
	// (reshard.go).
	{Name: "cluster-failover", Strategy: FailoverCluster, Clients: 3, Keys: 2, Ops: 4, TTL: [2]time.Duration{60 * time.Millisecond, 300 * time.Millisecond}, Cluster: true,
		Faults: true, Horizon: 800 * time.Millisecond, Schedule: clusterFailoverSchedule},
	{Name: "ops-single", Strategy: Single, Nodes: 1, Clients: 3, Keys: 2, Ops: 4, OpsWork: true, Faults: true, Horizon: 700 * time.Millisecond},
	{Name: "ops-quorum", Strategy: Quorum, Nodes: 3, Clients: 3, Keys: 2, Ops: 4, OpsWork: true, Faults: true, Horizon: 550 * time.Millisecond},
	{Name: "ops-failover", Strategy: Failover, Nodes: 2, Sentinels: 3, Clients: 3, Keys: 2, Ops: 4, OpsWork: true,
		Kinds: []string{FaultDelay, FaultLoss, FaultCut, FaultPause, FaultRestart}, RestartModes: []string{"empty", "durable"}, Faults: true, Horizon: 800 * time.Millisecond},
	// The idempotency rotation (Group "idem"): the idempotency paths the
	// barrier scenario never drives (idemwork.go, tokenwork.go): two payloads per key, callers'
	// ctx ending while the handler runs, Do and the Consumer, leases of
	// 15-60 ms (takeovers and late completions), the store paused, slow,
	// lossy, cut and blinking. idem-store on the store's own lock,
	// idem-quorum on a fenced quorum over nodes 0-2 (the store among
	// them), idem-mixed with both schemes on one prefix, idem-unfenced
	// with strategies built WithoutFencing, idem-http with the
	// Middleware (idemhttp.go), idem-tokens with Tokens over lossy and
	// cut links.
	{Name: "idem-store", Strategy: Single, Nodes: 1, Clients: 3, Keys: 2, Ops: 5, Barrier: true, Idem: IdemStore, Group: "idem",
		Kinds: []string{FaultPause, FaultDelay, FaultLoss, FaultCut}, Faults: true, Horizon: 400 * time.Millisecond},
	{Name: "idem-late", Strategy: Single, Nodes: 1, Clients: 5, Keys: 1, Ops: 12, Barrier: true, Idem: IdemLate, Group: "idem",
		Kinds: []string{FaultDelay}, Faults: true, Horizon: 400 * time.Millisecond},
	{Name: "idem-quorum", Strategy: Quorum, Nodes: 3, Fencing: true, Clients: 3, Keys: 2, Ops: 5, Barrier: true, Idem: IdemQuorum, Group: "idem",
		Kinds: []string{FaultPause, FaultDelay, FaultLoss, FaultCut, FaultPartition}, Faults: true, Horizon: 400 * time.Millisecond},
	{Name: "idem-mixed", Strategy: Quorum, Nodes: 3, Fencing: true, Clients: 4, Keys: 2, Ops: 5, Barrier: true, Idem: IdemMixed, Group: "idem",
		Kinds: []string{FaultPause, FaultDelay, FaultLoss, FaultCut, FaultPartition}, Faults: true, Horizon: 400 * time.Millisecond},
	{Name: "idem-unfenced", Strategy: Quorum, Nodes: 3, Clients: 4, Keys: 2, Ops: 10, Barrier: true, Idem: IdemUnfenced, Group: "idem",
		Kinds: []string{FaultDelay}, Faults: true, Horizon: 400 * time.Millisecond},
	{Name: "idem-http", Strategy: Single, Nodes: 1, Clients: 3, Keys: 2, Ops: 5, Barrier: true, Idem: IdemHTTP, Group: "idem",
		Kinds: []string{FaultPause, FaultDelay, FaultLoss, FaultCut}, Faults: true, Horizon: 400 * time.Millisecond},
	// idem-failover: the Barriers' records on a plain store node beside
	// the failover scenario's primary, replica and three Sentinels (it
	// never fails over), their locks through a fenced failover.Strategy
	// with its Watcher (WithStrategy), under the failover scenario's
	// faults: one failover, replication and Sentinel faults, and the
	// data nodes' links slow, lossy or cut.
	{Name: "idem-failover", Strategy: Failover, Nodes: 2, Sentinels: 3, Clients: 3, Keys: 2, Ops: 5, Barrier: true, Idem: IdemFailover, Group: "idem",
		Kinds: []string{FaultDelay, FaultLoss, FaultCut}, Faults: true, Horizon: 400 * time.Millisecond},
	// idem-masters: idem-failover's world with a second primary and its
	// replica (no Sentinels, never failing over): even clients lock
	// through failover on the Sentinels' master, odd ones through
	// failover on the second primary, all on one store and prefix. Every
	// client's go-redis client reports the address "FailoverClient", as
	// redis.NewFailoverClient's does; each strategy names its master
	// (failover.WithMaster).
	{Name: "idem-masters", Strategy: Failover, Nodes: 2, Sentinels: 3, Clients: 4, Keys: 2, Ops: 5, Barrier: true, Idem: IdemMasters, Group: "idem",
		Kinds: []string{FaultDelay, FaultLoss, FaultCut}, Faults: true, Horizon: 400 * time.Millisecond},
	{Name: "idem-tokens", Strategy: Single, Nodes: 1, Clients: 3, Ops: 6, Idem: IdemTokens, Group: "idem",
		Kinds: []string{FaultLoss, FaultCut, FaultPause}, Faults: true, Horizon: 150 * time.Millisecond},
	// The fence-expiry rotation (Group "fence"): the ops scenarios with
	// FenceExpiry, fence counters that expire between grants within the
	// run; fence-order and stale-accepted compare fences across those
	// expiries.
	{Name: "fence-expiry-single", Strategy: Single, Nodes: 1, Clients: 3, Keys: 2, Ops: 4, OpsWork: true, FenceExpiry: true, Group: "fence", Faults: true, Horizon: 700 * time.Millisecond},
	{Name: "fence-expiry-quorum", Strategy: Quorum, Nodes: 3, Clients: 3, Keys: 2, Ops: 4, OpsWork: true, FenceExpiry: true, Group: "fence", Faults: true, Horizon: 550 * time.Millisecond},
	{Name: "fence-expiry-failover", Strategy: Failover, Nodes: 2, Sentinels: 3, Clients: 3, Keys: 2, Ops: 4, OpsWork: true, FenceExpiry: true, Group: "fence",
		Kinds: []string{FaultDelay, FaultLoss, FaultCut, FaultPause, FaultRestart}, RestartModes: []string{"empty", "durable"}, Faults: true, Horizon: 800 * time.Millisecond},
}

// Rotation is the lock rotation: the scenarios of Group "" (make test's
// first run; seed s runs Rotation[s % len]).
var Rotation = rotation("")

// IdemRotation is the idempotency rotation: the scenarios of Group "idem"
// (make test's second run, -rotation idem).
var IdemRotation = rotation("idem")

// FenceRotation is the fence-expiry rotation: the scenarios of Group
// "fence" (-rotation fence).
var FenceRotation = rotation("fence")

// ElectRotation is the election rotation: the scenarios of Group "elect"
// (make test's fourth run, -rotation elect).
var ElectRotation = rotation("elect")

func rotation(group string) []Scenario {
	var rot []Scenario
	for _, sc := range Scenarios {
		if sc.Group == group {
			rot = append(rot, sc)
		}
	}
	return rot
}

// ScenarioByName returns the scenario called name, if any.
func ScenarioByName(name string) (Scenario, bool) {
	for _, sc := range Scenarios {
		if sc.Name == name {
			return sc, true
		}
	}
	return Scenario{}, false
}

func (sc *Scenario) restartable() bool { return true }

// allNodes is how many nodes a run has: with Watchdog, the single
// strategy's node after the quorum's, and with Cluster the Cluster's
// masters after it.
func (sc *Scenario) allNodes() int {
	if sc.Strategy == FailoverCluster {
		return 2 * ClusterMasters // the masters, then a replica of each
	}
	if sc.Cluster {
		return sc.Nodes + 1 + ClusterMasters + 1 // and the spare replica (clusterfail.go)
	}
	if sc.Strategy == Failover {
		return sc.Nodes + sc.Sentinels + sc.plainStore() + sc.secondMaster()
	}
	return sc.faultNodes()
}

// faultNodes is how many nodes makeSchedule draws its general faults on:
// every node but the Cluster's and the Sentinels', whose faults are drawn
// apart (so the seeds drawn before the Cluster existed keep their other
// faults).
func (sc *Scenario) faultNodes() int {
	if sc.Strategy == Failover {
		return sc.Nodes // the Sentinels' faults are drawn apart
	}
	if sc.Strategy == FailoverCluster {
		return 2 * ClusterMasters
	}
	if sc.Watchdog {
		return sc.Nodes + 1
	}
	return max(sc.Nodes, 1)
}

func (sc *Scenario) holdSteps() int { return cmp.Or(sc.HoldSteps, 4) }
func (sc *Scenario) pastMax() int   { return cmp.Or(sc.PastMax, 4) }

// storeNode is the node the idempotency store lives on: node 0, or in a
// failover scenario with Idem the plain node after the Sentinels.
func (sc *Scenario) storeNode() int {
	if sc.plainStore() > 0 {
		return sc.Nodes + sc.Sentinels
	}
	return 0
}

// plainStore is 1 when the run has a plain store node of its own beside
// the failover pair and its Sentinels (a failover scenario with Idem),
// else 0.
func (sc *Scenario) plainStore() int {
	if sc.Strategy == Failover && sc.Idem != "" {
		return 1
	}
	return 0
}

// secondMaster is 2 when the run has a second primary and its replica
// after the plain store node (IdemMasters: the lock of odd clients), else
// 0. It has no Sentinels and never fails over; no fault is drawn on it.
func (sc *Scenario) secondMaster() int {
	if sc.Strategy == Failover && sc.Idem == IdemMasters {
		return 2
	}
	return 0
}

// primary2 is the second primary's node id (IdemMasters), its replica the
// next one.
func (sc *Scenario) primary2() int { return sc.Nodes + sc.Sentinels + sc.plainStore() }

// restartOutside says whether a restart in mode breaks the strategy's
// assumptions: for mutual exclusion (outside), or for fence order only.
func (sc *Scenario) restartOutside(mode string) (outside, fenceOutside bool, why string) {
	if mode == "durable" {
		return false, false, ""
	}
	if sc.Strategy == Quorum && sc.DelayedRestart > 0 && sc.Durable && mode == "snapshot" {
		return true, false, "a node declared durable restarted from an older snapshot and voted at once"
	}
	if sc.Strategy == Quorum && sc.DelayedRestart > 0 {
		if sc.Fencing {
			return false, true, "a restarted node lost fence counters (the delayed-restart rule keeps exclusion, not fence order)"
		}
		return false, false, ""
	}
	return true, false, "a node restarted without its data (" + mode + ") and voted at once"
}
