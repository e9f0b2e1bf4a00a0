package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/renew"
)

// cluster-failover: the failover strategy on a Redis Cluster whose
// masters have replicas, through one shard's failover.
//
// The Cluster (cluster.go): three masters (nodes 0-2) and a replica
// following each (nodes 3-5, replica.go: each script's effects shipped over
// a replication link, acknowledged, WAIT answered from the acknowledged
// offset). CLUSTER SLOTS lists each master and its online replicas; CLUSTER
// SHARDS each shard's two nodes with their role and health
// (World.shardRole). Every client runs failover.New on a go-redis
// ClusterClient (a quarter of the workload clients WithReplicas(1)).
//
// One fault per run, FaultClusterFailover on shard f (Fault.Node), in one
// of three modes drawn alike:
//
//   - behind+takeover: at At the replica's link is cut (it falls behind);
//     Amount (150-350 ms) later it is promoted, as CLUSTER FAILOVER
//     TAKEOVER does, while the old master, alive, serves on for For
//     (0-100 ms) in its old view of the Cluster (it still calls itself
//     the shard's master and lists the replica as its own; its WAITs
//     answer 0), then learns of the takeover and follows the new master
//     (a full resync).
//   - behind+crash: the link is cut at At; the master crashes 20-150 ms
//     before the promotion at At+Amount (300-450 ms); it comes back empty
//     For (50-300 ms) after the promotion and follows the new master.
//   - healthy: the master crashes at At with replication up; the replica
//     is promoted Amount (20-150 ms) later; the old master comes back empty
//     For later and follows it.
//
// After a promotion and until the old master follows the new one, CLUSTER
// SHARDS lists the old one in the shard as a master without slots (health
// failed while it is down), as Redis 7 lists a failed primary: it is no
// replica, so the new master's WAIT asks for none unless WithReplicas says
// otherwise.
//
// The construction (clusterFailover.run): a client of its own (index
// Clients, its links meeting neither faults nor random loss: sheltered)
// takes the failing shard's keys around the failover:
//
//  1. K, TTL 3-4 s, kept by a renew.Watchdog from the start to its Until at
//     the promotion plus a TTL (cluster-kept);
//  2. P, held 1-10 ms and released well before At;
//  3. (behind modes) K2, TTL 250-400 ms, taken 5-30 ms before the cut and
//     kept: its first renewal comes during the cut, acknowledged by no
//     replica;
//  4. (behind modes) P again 1 ms after the cut: too few replicas can
//     acknowledge it (refused-left); a grant is held across the promotion;
//  5. P again after the promotion (and the old master's rejoin), with
//     retries: its fence must be above the first P's (fence-order);
//  6. (behind modes, from the promotion on, beside 5) K2 with retries until
//     a little after its Until: not before its holder stops believing
//     (overlap).
//
// The workload clients (even: lockClient, odd: doClient kept by a
// watchdog) contend for k0 (the failing shard's) and k1 (the next shard's)
// throughout. General faults: delays, loss, cuts on any node, pauses on the
// other shards' nodes.
//
// Invariants, beside overlap, fence-order, stale-accepted, state-valid
// (for a Cluster lock: the master serving its key now must hold its token
// until its Until: a promoted replica that lacks an acknowledged grant or
// extension fails it at the promotion) and ctx-bound:
//
//   - cluster-kept (InvClusterKept): K, protected when the promoted
//     replica held its token and it was valid at the promotion, is neither
//     lost nor invalid by its Until at the promotion plus its TTL.
//   - refused-left (InvRefusedLeft): a TryLock refused for too few
//     acknowledgements (failover.ErrNotReplicated) leaves no key behind on
//     the master that refused it, when it returns.
//   - fence-order/promotion (ExFencePromotion): fence-order pairs whose
//     first hold was granted before the promotion and second after.
//
// Every run must examine each of them (and refused-left in the behind
// modes, reshard-kept with a reshard): one that examined nothing fails the
// run (InvExaminedRun). In two runs in three a slot range of the other two
// shards migrates (FaultReshard, reshard.go).

// FaultClusterFailover is cluster-failover's failover of one shard
// (Node: the shard's index, also its first master's node id; Mode: one of
// the cf* modes).
const FaultClusterFailover = "cluster-failover"

// Modes of FaultClusterFailover.
const (
	cfBehindTakeover = "behind+takeover"
	cfBehindCrash    = "behind+crash"
	cfHealthy        = "healthy"
)

// InvRefusedLeft: a grant refused because too few replicas acknowledged it
// left its key on the master that refused it.
const InvRefusedLeft = "refused-left"

// ExFencePromotion counts fence-order pairs across a Cluster promotion.
const ExFencePromotion = InvFenceOrder + "/promotion"

// InvExaminedRun: a cluster-failover run in which an invariant its
// construction applies to examined nothing.
const InvExaminedRun = "examined-run"

func init() {
	cf := func(sc *Scenario) bool { return sc.Strategy == FailoverCluster }
	examinedIn[InvRefusedLeft] = cf
	examinedIn[ExFencePromotion] = cf
}

// clusterFailoverSchedule draws cluster-failover's faults: the shard's
// failover, and up to three delays, losses, cuts or pauses (pauses only on
// the other shards' nodes: a paused master holds the construction's
// probes past the moments they are for).
func clusterFailoverSchedule(r *rand.Rand, sc *Scenario, horizon time.Duration) []Fault {
	shard := r.IntN(ClusterMasters)
	f := Fault{Kind: FaultClusterFailover, Node: shard, Client: -1, At: ms(r, 200, int(horizon*3/4/time.Millisecond))}
	switch r.IntN(3) {
	case 0:
		f.Mode, f.Amount, f.For = cfBehindTakeover, ms(r, 150, 350), ms(r, 0, 100)
	case 1:
		// The crash (cfDown, at most 150 ms, before the promotion) comes
		// at least 150 ms after the cut: after the construction's probe
		// and its WAIT's 100 ms.
		f.Mode, f.Amount, f.For = cfBehindCrash, ms(r, 300, 450), ms(r, 50, 300)
	default:
		f.Mode, f.Amount, f.For = cfHealthy, ms(r, 20, 150), ms(r, 50, 300)
	}
	fs := []Fault{f}
	n := sc.faultNodes()
	for range r.IntN(4) {
		g := Fault{At: time.Duration(r.Int64N(int64(horizon * 3 / 4))), Node: r.IntN(n), Client: -1}
		switch r.IntN(4) {
		case 0:
			g.Kind, g.For, g.Amount = FaultDelay, ms(r, 20, 300), ms(r, 5, 150)
		case 1:
			g.Kind, g.For, g.Prob = FaultLoss, ms(r, 20, 300), 0.1+0.5*r.Float64()
		case 2:
			g.Kind = FaultCut
			if r.IntN(2) == 0 {
				g.Client = r.IntN(sc.Clients)
			}
		default:
			g.Kind, g.For = FaultPause, ms(r, 5, 250)
			if g.Node%ClusterMasters == shard {
				continue
			}
		}
		fs = append(fs, g)
	}
	if r.IntN(3) != 0 {
		rs := reshardFault(r, shard, horizon)
		if f.Mode != cfBehindTakeover && !sc.reshardOverlap {
			// A master is down from its crash until it rejoins: the
			// reshard comes after (reshard.go, healthy).
			rs.At = f.At + f.Amount + f.For + ms(r, 110, 200)
		}
		fs = slices.DeleteFunc(fs, func(g Fault) bool { return pausesReshard(g, rs) })
		fs = append(fs, rs)
	}
	if !sc.noClusterDown && r.IntN(2) == 0 {
		fs = downWindowFault(r, f, fs) // clusterdown.go
	}
	sortFaults(fs)
	return fs
}

// clusterFailoverActions are the steps of a FaultClusterFailover (nil for
// any other fault).
func (w *World) clusterFailoverActions(f Fault) []action {
	if f.Kind == FaultClusterDown {
		return w.clusterDownActions(f)
	}
	if f.Kind != FaultClusterFailover {
		return nil
	}
	i := f.Node
	old, rep := w.nodes[i], w.nodes[ClusterMasters+i]
	promoteAt := f.At + f.Amount
	switch f.Mode {
	case cfBehindTakeover:
		return []action{
			{f.At, f.String() + ": replication link cut", old.cutRepl},
			{promoteAt, "takeover: promote " + rep.name + " (" + old.name + " serves on)", func() { w.takeover(i, old, rep, true) }},
			{promoteAt + f.For, old.name + " learns of the takeover and follows " + rep.name, func() { w.rejoinShard(i, old, rep) }},
		}
	case cfBehindCrash:
		return []action{
			{f.At, f.String() + ": replication link cut", old.cutRepl},
			{promoteAt - w.cfDown(), "crash master " + old.name, old.crash},
			{promoteAt, "promote " + rep.name, func() { w.takeover(i, old, rep, false) }},
			{promoteAt + f.For, old.name + " back empty, follows " + rep.name, func() {
				old.restart(false, false)
				w.rejoinShard(i, old, rep)
			}},
		}
	default:
		return []action{
			{f.At, f.String() + ": crash master " + old.name, old.crash},
			{promoteAt, "promote " + rep.name, func() { w.takeover(i, old, rep, false) }},
			{promoteAt + f.For, old.name + " back empty, follows " + rep.name, func() {
				old.restart(false, false)
				w.rejoinShard(i, old, rep)
			}},
		}
	}
}

// cfDown is how long before the promotion behind+crash kills the master:
// 20-150 ms, drawn from the seed apart from the schedule.
func (w *World) cfDown() time.Duration {
	return time.Duration(20+mix(w.seed, 0xcfd0)%131) * time.Millisecond
}

// takeover promotes rep to master of shard i in old's place. stale: old is
// alive and serves on in its old view until rejoinShard.
func (w *World) takeover(i int, old, rep *Node, stale bool) {
	if stale {
		old.mu.Lock()
		old.staleShard = i + 1
		old.mu.Unlock()
	}
	rep.promote()
	w.cmaster[i].Store(rep)
	old.mu.Lock()
	health := "online"
	if old.down {
		health = "failed"
	}
	old.mu.Unlock()
	w.mu.Lock()
	w.shardRole[i] = shardState{role: "master", health: health}
	w.mu.Unlock()
	if w.cfo != nil {
		w.cfo.atPromotion(w, rep)
	}
}

// rejoinShard makes old, replaced by rep as shard i's master, follow it
// (a full resync), as a replica CLUSTER SHARDS lists again.
func (w *World) rejoinShard(i int, old, rep *Node) {
	old.mu.Lock()
	old.staleShard = 0
	old.mu.Unlock()
	old.follow(rep)
	w.mu.Lock()
	w.shardRole[i] = shardState{role: "replica", health: "online"}
	w.mu.Unlock()
}

// sheltered reports whether client ci's links meet no fault and no random
// loss or spike: cluster-failover's construction client, whose probes
// must land when the construction says.
func (w *World) sheltered(ci int) bool {
	return w.sc.Strategy == FailoverCluster && ci == w.sc.Clients
}

// cfKey is the i-th workload key of cluster-failover: k0 on the failing
// shard, k1 on the next one (the smallest "k<i>.<n>" whose slot is there).
func (w *World) cfKey(i int) string {
	return shardKey("k"+strconv.Itoa(i)+".", (w.cfo.shard+i)%ClusterMasters)
}

// shardKey is the first key prefix+n (n = 0, 1, ...) of shard m's slots.
func shardKey(prefix string, m int) string {
	for n := 0; ; n++ {
		if k := prefix + strconv.Itoa(n); masterOfSlot(keySlot(k)) == m {
			return k
		}
	}
}

// clusterFailoverLocker builds client ci's Locker for cluster-failover:
// failover.New on a ClusterClient (WithReplicas(1) one time in four), a
// renew.Watchdog keeper for odd clients. Called while the network is quiet.
func (w *World) clusterFailoverLocker(ci int, keeper bool, r *rand.Rand) (*redlease.Locker, *renew.Watchdog) {
	cte := r.IntN(2) == 0
	w.noteCTE(ci, cte)
	var opts []failover.Option
	if r.IntN(4) == 0 {
		opts = append(opts, failover.WithReplicas(1))
	}
	s := must(failover.New(w.clusterClient(ci, cte), opts...))
	w.onClose(ci, func() { _ = s.Close() })
	lopts := []redlease.Option{redlease.WithPolling(), redlease.WithObserver(stateObserver{w, ci})}
	var wd *renew.Watchdog
	if keeper {
		wd = must(renew.New())
		w.onClose(ci, func() { wd.Close() })
		lopts = append(lopts, redlease.WithKeeper(wd))
	}
	w.hist.logf("c%d failover on a ClusterClient: ContextTimeoutEnabled=%v, WithReplicas(1)=%v, watchdog=%v", ci, cte, len(opts) > 0, keeper)
	return must(redlease.New(s, lopts...)), wd
}

// clusterFailoverClient runs workload client ci of cluster-failover.
func (w *World) clusterFailoverClient(ci int, locker *redlease.Locker, r *rand.Rand) {
	if ci%2 == 0 {
		w.lockClient(ci, locker, r)
		return
	}
	w.doClient(ci, []doLocker{{name: "k", locker: locker}})
}

// clusterFailover is one run's construction (see the top of this file).
type clusterFailover struct {
	ci               int
	f                Fault
	shard            int
	keep, short, prb string // K, K2, P
	keepTTL          time.Duration
	locker           *redlease.Locker
	wd               *renew.Watchdog
	r                *rand.Rand

	mu        sync.Mutex
	keepLock  *redlease.Lock
	protected bool          // K: the promoted replica held its token, valid, at the promotion
	untilAt   time.Time     // K's Until at the promotion
	promoted  time.Duration // virtual; 0 until the promotion

	down *clusterDown // the run's CLUSTERDOWN window (clusterdown.go), nil if none drawn
}

// clusterFailoverSetup builds the construction (the schedule's
// FaultClusterFailover, its keys, its client's Locker and watchdog) and
// makes each replica follow its master. Called while the network is quiet.
func (w *World) clusterFailoverSetup() *clusterFailover {
	for i := range ClusterMasters {
		w.nodes[ClusterMasters+i].follow(w.nodes[i])
	}
	cf := &clusterFailover{ci: w.sc.Clients, r: rand.New(rand.NewPCG(w.seed, 0xcf5e7))}
	for _, f := range w.faults {
		if f.Kind == FaultClusterFailover {
			cf.f = f
		}
	}
	cf.shard = cf.f.Node
	cf.down = newClusterDown(w.faults)
	cf.keep, cf.short, cf.prb = shardKey("K.", cf.shard), shardKey("K2.", cf.shard), shardKey("P.", cf.shard)
	cf.keepTTL = ms(cf.r, 3000, 4000)
	w.cfo = cf
	cf.locker, cf.wd = w.clusterFailoverLocker(cf.ci, true, cf.r)
	w.hist.logf("c%d construction: shard %d (%s, replica %s) %s: keys %s (kept, TTL %v), %s, %s; workload keys %s, %s",
		cf.ci, cf.shard, w.nodes[cf.shard].name, w.nodes[ClusterMasters+cf.shard].name, cf.f.Mode, cf.keep, cf.keepTTL, cf.short, cf.prb, w.cfKey(0), w.cfKey(1))
	return cf
}

// behind reports whether the construction's replica falls behind before
// its promotion.
func (cf *clusterFailover) behind() bool { return cf.f.Mode != cfHealthy }

// promoteAt is when the replica is promoted (virtual).
func (cf *clusterFailover) promoteAt() time.Duration { return cf.f.At + cf.f.Amount }

// atPromotion records K's state as the replica rep is promoted (called by
// the fault driver, in takeover).
func (cf *clusterFailover) atPromotion(w *World, rep *Node) {
	cf.mu.Lock()
	defer cf.mu.Unlock()
	cf.promoted = w.hist.now()
	lk := cf.keepLock
	if lk == nil {
		w.hist.logf("c%d construction: no kept lock at the promotion", cf.ci)
		return
	}
	had, valid := rep.holds(cf.keep, lk.Token()), lk.Valid()
	cf.protected, cf.untilAt = had && valid, lk.Until()
	w.hist.logf("c%d construction: %s promoted, held %s's token %v, the lock valid %v, Until in %.3fms", cf.ci, rep.name, cf.keep, had, valid, msf(time.Until(cf.untilAt)))
}

// sleepUntil sleeps until virtual time at (plus a few ns drawn from the
// seed, off the instants the fault driver acts at).
func (cf *clusterFailover) sleepUntil(w *World, at time.Duration) {
	sleep(at + time.Duration(1+cf.r.IntN(999)) - w.hist.now())
}

// run makes the construction.
func (cf *clusterFailover) run(w *World) {
	seq := 0
	ctxFor := func(d time.Duration) (context.Context, context.CancelFunc) {
		seq++
		return context.WithTimeout(w.jitterCtx(context.Background(), cf.ci, jitClusterRepl, seq), d)
	}
	if w.resh != nil {
		var resharding sync.WaitGroup
		defer resharding.Wait()
		resharding.Go(func() { cf.reshardHold(w) })
	}
	if cf.down != nil {
		var down sync.WaitGroup
		defer down.Wait()
		down.Go(func() { cf.downHold(w) })
	}
	// 1. K, kept past the promotion.
	ctx, cancel := ctxFor(time.Second)
	lk, err := cf.locker.TryLock(ctx, cf.keep, redlease.WithTTL(cf.keepTTL))
	cancel()
	if err != nil {
		w.hist.logf("c%d construction: TryLock %s: %v", cf.ci, cf.keep, short(err))
	} else {
		cf.mu.Lock()
		cf.keepLock = lk
		cf.mu.Unlock()
		live := w.track(cf.ci, "c"+strconv.Itoa(cf.ci)+"#keep", cf.keep, lk, w.placeOf("", cf.keep))
		defer w.untrack(live)
		stop := cf.wd.Keep(lk)
		defer stop()
	}
	// 2. P, held and released before the fault.
	sleep(ms(cf.r, 1, 20))
	cf.probe(w, 1, "before", time.Second, ms(cf.r, 1, 10))
	var mid *probeHold
	var contender sync.WaitGroup
	defer contender.Wait()
	if cf.behind() {
		// 3. K2, kept into the cut.
		cf.sleepUntil(w, cf.f.At-ms(cf.r, 5, 30))
		ctx, cancel := ctxFor(time.Second)
		// A TTL long enough that a renewal's WAIT (100 ms) ends before the
		// watchdog's batch gives up on it (nine tenths of the validity
		// left): a short one's batches all end undecided, acknowledged or
		// not.
		k2, err := cf.locker.TryLock(ctx, cf.short, redlease.WithTTL(ms(cf.r, 250, 400)))
		cancel()
		if err != nil {
			w.hist.logf("c%d construction: TryLock %s: %v", cf.ci, cf.short, short(err))
		} else {
			h := cf.startHold(w, 4, "K2", cf.short, k2)
			stop := cf.wd.Keep(k2)
			contender.Go(func() { cf.contend(w, h, stop) })
		}
		// 4. P during the cut: no replica can acknowledge it.
		cf.sleepUntil(w, cf.f.At+time.Millisecond)
		mid = cf.refusedProbe(w, ctxFor)
	}
	// 5. P after the promotion and the old master's rejoin.
	cf.sleepUntil(w, cf.promoteAt()+cf.f.For+time.Millisecond)
	ctx, cancel = ctxFor(3 * time.Second)
	start := w.hist.now()
	p, err := cf.locker.Lock(ctx, cf.prb, redlease.WithTTL(time.Second), redlease.WithRetryDelay(5*time.Millisecond, 20*time.Millisecond), redlease.WithMaxAttempts(100))
	cancel()
	if err != nil {
		w.hist.logf("c%d construction: Lock %s after the promotion (%.3fms): %v", cf.ci, cf.prb, msf(w.hist.now()-start), short(err))
	} else {
		h := cf.startHold(w, 3, "after", cf.prb, p)
		sleep(ms(cf.r, 1, 10))
		h.end(w)
	}
	if mid != nil {
		mid.end(w)
	}
	cf.checkKept(w)
}

// contend is step 6, beside the others from the promotion on: Lock K2 with
// retries until a little after K2's Until then, while K2's holder (h)
// still keeps it. A renewal counted as extended that the promoted replica
// never received lets the key expire there while its holder believes it
// held: a double grant (overlap). Then it stops keeping K2 and releases it.
func (cf *clusterFailover) contend(w *World, h *probeHold, stop func()) {
	r := rand.New(rand.NewPCG(w.seed, 0xcf5e8)) // not cf.r: run draws from it meanwhile
	sleep(cf.promoteAt() + time.Duration(1+r.IntN(999)) - w.hist.now())
	ctx, cancel := context.WithDeadline(w.jitterCtx(context.Background(), cf.ci, jitClusterRepl, 200), h.lk.Until().Add(30*time.Millisecond))
	lk, err := cf.locker.Lock(ctx, cf.short, redlease.WithTTL(100*time.Millisecond), redlease.WithRetryDelay(5*time.Millisecond, 10*time.Millisecond), redlease.WithMaxAttempts(200))
	cancel()
	if err != nil {
		w.hist.logf("c%d construction: contender's Lock %s: %v", cf.ci, cf.short, short(err))
	} else {
		c := cf.startHold(w, 5, "contender", cf.short, lk)
		sleep(ms(r, 1, 5))
		c.end(w)
	}
	stop()
	h.end(w)
}

// probe takes P with TryLock (TTL ttl), holds it for d and releases it.
func (cf *clusterFailover) probe(w *World, seq int, what string, ttl, d time.Duration) {
	ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), cf.ci, jitClusterRepl, 100+seq), time.Second)
	lk, err := cf.locker.TryLock(ctx, cf.prb, redlease.WithTTL(ttl))
	cancel()
	if err != nil {
		w.hist.logf("c%d construction: TryLock %s (%s): %v", cf.ci, cf.prb, what, short(err))
		return
	}
	h := cf.startHold(w, seq, what, cf.prb, lk)
	sleep(d)
	h.end(w)
}

// refusedProbe is step 4: TryLock P while the replica cannot acknowledge
// anything. Refused for want of acknowledgements, P must not be left on
// the master (refused-left); granted (a defect: the grant is on no
// replica), the grant is held across the promotion and returned.
func (cf *clusterFailover) refusedProbe(w *World, ctxFor func(time.Duration) (context.Context, context.CancelFunc)) *probeHold {
	old := w.nodes[cf.shard]
	ctx, cancel := ctxFor(time.Second)
	start := w.hist.now()
	lk, err := cf.locker.TryLock(ctx, cf.prb, redlease.WithTTL(time.Second))
	cancel()
	if err == nil {
		w.hist.logf("c%d construction: TryLock %s granted during the cut (fence %d): held across the promotion", cf.ci, cf.prb, lk.Fence())
		return cf.startHold(w, 2, "cut", cf.prb, lk)
	}
	w.hist.logf("c%d construction: TryLock %s during the cut, %.3fms: %v", cf.ci, cf.prb, msf(w.hist.now()-start), short(err))
	if !errors.Is(err, failover.ErrNotReplicated) {
		return nil
	}
	old.mu.Lock()
	stale := old.down || old.master != nil
	old.mu.Unlock()
	if stale {
		w.hist.logf("c%d construction: %s no longer a master: refused-left not checked", cf.ci, old.name)
		return nil
	}
	w.hist.ex.count(InvRefusedLeft, 1)
	if v := old.get(cf.prb); v != "" {
		w.hist.violation(Violation{Inv: InvRefusedLeft, At: w.hist.now(), Detail: fmt.Sprintf(
			"c%d's TryLock %s at %.3fms was refused for too few acknowledgements (%v), yet %s still holds it (%q) when it returned",
			cf.ci, cf.prb, msf(start), short(err), old.name, v)})
	}
	return nil
}

// probeHold is one of the construction's holds (of P, K2), recorded for
// overlap and fence-order.
type probeHold struct {
	hd   *Hold
	lk   *redlease.Lock
	live *liveLock
	done chan struct{}
	mu   sync.Mutex
}

// startHold records the construction's grant lk of key (seq: its number
// among the construction's holds) from now on.
func (cf *clusterFailover) startHold(w *World, seq int, what, key string, lk *redlease.Lock) *probeHold {
	h := &probeHold{lk: lk, done: make(chan struct{}), hd: &Hold{Client: cf.ci, Seq: seq, Key: key, Via: "probe-" + what, Fence: lk.Fence(), From: w.hist.now(), LostAt: -1, RelSent: -1, Token: lk.Token()}}
	w.hist.logf("c%d construction: %s granted (%s) fence=%d until=+%.3fms", cf.ci, key, what, lk.Fence(), msf(time.Until(lk.Until())))
	h.live = w.track(cf.ci, fmt.Sprintf("c%d#%d", cf.ci, seq), key, lk, w.placeOf("", key))
	lost := lk.Lost()
	go func() {
		select {
		case <-lost:
			h.mu.Lock()
			h.hd.LostAt = w.hist.now()
			h.mu.Unlock()
		case <-h.done:
		}
	}()
	return h
}

// end releases the hold and records it.
func (h *probeHold) end(w *World) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	relSent := w.hist.now()
	h.mu.Lock()
	h.hd.RelSent = relSent
	h.mu.Unlock()
	err := h.lk.Release(ctx)
	cancel()
	close(h.done)
	w.untrack(h.live)
	h.mu.Lock()
	defer h.mu.Unlock()
	hd := h.hd
	hd.Until = w.untilV(hd.Client, h.lk)
	hd.To = min(relSent, hd.Until)
	if hd.LostAt >= 0 {
		hd.To = min(hd.To, hd.LostAt)
	} else {
		hd.LostAt = w.hist.now() // closed by the release
	}
	w.hist.logf("c%d construction: release %s: %v: %s", hd.Client, hd.Key, short(err), hd)
	w.hist.addHold(hd)
}

// checkKept checks cluster-kept for K once its Until at the promotion plus
// a TTL has passed.
func (cf *clusterFailover) checkKept(w *World) {
	cf.mu.Lock()
	lk, protected, until := cf.keepLock, cf.protected, cf.untilAt
	cf.mu.Unlock()
	if lk == nil || until.IsZero() {
		return
	}
	sleep(time.Until(until) + cf.keepTTL)
	lost := false
	select {
	case <-lk.Lost():
		lost = true
	default:
	}
	valid := lk.Valid()
	w.hist.logf("c%d construction: %s %.3fms after the promotion: lost=%v valid=%v protected=%v: %v", cf.ci, cf.keep, msf(w.hist.now()-cf.promoted), lost, valid, protected, short(lk.Err()))
	if !protected {
		return
	}
	w.hist.ex.count(InvClusterKept, 1)
	if lost || !valid {
		w.hist.violation(Violation{Inv: InvClusterKept, At: w.hist.now(), Detail: fmt.Sprintf(
			"c%d's lock on %s (TTL %v, kept) was lost although the replica promoted at %.3fms held its token and the lock was valid then (%s): %v",
			cf.ci, cf.keep, cf.keepTTL, msf(cf.promoted), cf.f.Mode, lk.Err())})
	}
}

// checkClusterFailover counts fence-order/promotion and fails the run for
// each invariant its construction applies to that examined nothing
// (counts: World.examined's).
func (w *World) checkClusterFailover(counts map[string]int) []Violation {
	cf := w.cfo
	if cf == nil {
		return nil
	}
	need := []string{InvOverlap, ExFencePromotion, InvClusterKept, InvStateValid}
	if cf.behind() {
		need = append(need, InvRefusedLeft)
	}
	if w.resh != nil && !cf.down.overlaps(w.resh.f.At-100*time.Millisecond, w.reshardCheckEnd()) {
		need = append(need, InvReshardKept)
	}
	if cf.down != nil {
		need = append(need, InvDownKept, ExHeldDown)
	}
	var vs []Violation
	for _, inv := range need {
		if counts[inv] == 0 {
			vs = append(vs, Violation{Inv: InvExaminedRun, At: w.hist.now(), Detail: fmt.Sprintf("%s examined nothing in this run (%s on shard %d)", inv, cf.f.Mode, cf.shard)})
		}
	}
	return vs
}

// countFencePromotion counts the fence-order pairs (second hold granted
// after the first ended) of one key whose first hold was granted before
// the construction's promotion and second after.
func (w *World) countFencePromotion() {
	cf := w.cfo
	if cf == nil {
		return
	}
	p := cf.promoteAt()
	w.hist.mu.Lock()
	byKey := map[string][]*Hold{}
	for _, hd := range w.hist.holds {
		if hd.To > hd.From {
			byKey[hd.Key] = append(byKey[hd.Key], hd)
		}
	}
	w.hist.mu.Unlock()
	n := 0
	for _, hs := range byKey {
		for _, a := range hs {
			for _, b := range hs {
				if a.From < p && b.From >= p && b.From >= a.To {
					n++
				}
			}
		}
	}
	w.hist.ex.count(ExFencePromotion, n)
}
