package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/renew"
)

// reshard: a slot range of the simulated Cluster migrating from one master
// to another mid-run, as redis-cli --cluster reshard moves slots, and
// sometimes left half migrated, as an interrupted resharding leaves them
// (cluster-failover; drawn in two runs in three).
//
// The steps (World.reshardActions), each a fault action:
//
//  1. At: CLUSTER SETSLOT IMPORTING on the target, then MIGRATING on the
//     source, for every slot of the range. The source stays the slots'
//     owner (CLUSTER SLOTS, SHARDS and NODES do not change): it serves a
//     command whose keys it has, sends one whose keys it lacks to the
//     target with ASK, and answers TRYAGAIN to a command naming keys of
//     both kinds; the target serves a command right after ASKING and
//     answers MOVED (to the source) otherwise (Node.redirect).
//  2. At+For: MIGRATE of some of the range's keys from the source to the
//     target (value and TTL, each node's replica following its master's
//     change): of the construction's three keys the first, the second in
//     half the runs, never the third; of the others each in half the runs.
//  3. mode complete, At+For+Amount: MIGRATE of the rest, then SETSLOT NODE
//     (the target owns the range: CLUSTER SLOTS, SHARDS and NODES list it
//     with the target, and the source answers MOVED). Mode half: nothing
//     more; the range stays half migrated for the rest of the run.
//
// Every node learns of SETSLOT NODE at once (Redis spreads it by gossip,
// the source first, as redis-cli sets the target, then the source).
//
// The source is the shard after the failing one (cluster-failover's
// workload key k1 lives there), the target the one after it: neither
// fails over. The range holds k1's slot, 0-200 slots either side within
// the source's. The construction (clusterFailover.reshardHold) takes three
// keys of k1's slot ("{k1's name}m0" ...), TTL 100-250 ms, 20-60 ms before
// At, kept by the construction's watchdog, and checks them
// (InvReshardKept) once the last step is three TTLs past. Its client is
// sheltered (no fault and no random loss on its links), and the schedule
// draws no pause of the source's or the target's shard (master or
// replica) that ends after 100 ms before At: the Cluster is healthy for
// those locks throughout.

// FaultReshard is a slot migration (reshard.go; Node: the source master,
// Nodes: source and target, Slots: the range, Mode: reshardComplete or
// reshardHalf, For: from MIGRATING to the first MIGRATE, Amount: from it
// to the end of a complete migration).
const FaultReshard = "reshard"

// Modes of FaultReshard.
const (
	reshardComplete = "complete"
	reshardHalf     = "half"
)

// InvReshardKept: a lock kept on a healthy Cluster through a slot
// migration was lost.
const InvReshardKept = "reshard-kept"

func init() {
	examinedIn[InvReshardKept] = func(sc *Scenario) bool { return sc.Strategy == FailoverCluster }
}

// Phases of a reshard.
const (
	reshardBefore    = iota
	reshardMigrating // IMPORTING on the target, MIGRATING on the source
	reshardDone      // SETSLOT NODE: the target owns the range
)

// reshard is a run's slot migration.
type reshard struct {
	f        Fault
	src, dst int // shard indices
	keys     [3]string
	phase    atomic.Int32
}

// reshardFault draws cluster-failover's reshard: from the shard after the
// failing one (shard) to the next, a range around k1's slot.
func reshardFault(r *rand.Rand, shard int, horizon time.Duration) Fault {
	src, dst := (shard+1)%ClusterMasters, (shard+2)%ClusterMasters
	s := keySlot(shardKey("k1.", src))
	own := masterSlots(src)
	lo, hi := max(own[0], s-r.IntN(201)), min(own[1], s+r.IntN(201))
	f := Fault{Kind: FaultReshard, Node: src, Nodes: []int{src, dst}, Client: -1, Slots: [2]int{lo, hi},
		At: ms(r, 150, int(horizon*3/4/time.Millisecond)), For: ms(r, 5, 40), Mode: reshardHalf}
	if r.IntN(2) == 0 {
		f.Mode, f.Amount = reshardComplete, ms(r, 20, 200)
	}
	return f
}

// pausesReshard reports whether pause g touches the reshard rs's shards
// from 100 ms before it starts on: such a pause is not drawn (the
// reshard's locks must see a healthy Cluster).
func pausesReshard(g, rs Fault) bool {
	i := g.Node % ClusterMasters
	return g.Kind == FaultPause && (i == rs.Nodes[0] || i == rs.Nodes[1]) && g.At+g.For > rs.At-100*time.Millisecond
}

// newReshard is the run's reshard, if its schedule drew one.
func newReshard(faults []Fault) *reshard {
	for _, f := range faults {
		if f.Kind == FaultReshard {
			rs := &reshard{f: f, src: f.Nodes[0], dst: f.Nodes[1]}
			tag := "{" + shardKey("k1.", rs.src) + "}m"
			for i := range rs.keys {
				rs.keys[i] = tag + itoa(i)
			}
			return rs
		}
	}
	return nil
}

// in reports whether slot is in the migrating range.
func (rs *reshard) in(slot int) bool { return slot >= rs.f.Slots[0] && slot <= rs.f.Slots[1] }

// lastStep is when the reshard's last step comes (virtual).
func (rs *reshard) lastStep() time.Duration {
	return rs.f.At + rs.f.For + rs.f.Amount
}

// slotRoute is a slot as one node sees it: its owner, and where it
// migrates to (on the source) or is imported from (on the target).
type slotRoute struct{ owner, migratingTo, importingFrom *Node }

// route is slot as node n sees it.
func (w *World) route(n *Node, slot int) slotRoute {
	rt := slotRoute{owner: w.viewMaster(n, masterOfSlot(slot))}
	rs := w.resh
	if rs == nil || !rs.in(slot) {
		return rt
	}
	src, dst := w.masterNode(rs.src), w.masterNode(rs.dst)
	switch rs.phase.Load() {
	case reshardMigrating:
		if n == src {
			rt.migratingTo = dst
		}
		if n == dst {
			rt.importingFrom = src
		}
	case reshardDone:
		rt.owner = dst
	}
	return rt
}

// shardRanges are the slot ranges shard i serves now: its third, less the
// range a completed reshard took from it, or plus the one it gave it.
func (w *World) shardRanges(i int) [][2]int {
	own := masterSlots(i)
	rs := w.resh
	if rs == nil || rs.phase.Load() != reshardDone {
		return [][2]int{own}
	}
	lo, hi := rs.f.Slots[0], rs.f.Slots[1]
	switch i {
	case rs.src:
		var out [][2]int
		if own[0] < lo {
			out = append(out, [2]int{own[0], lo - 1})
		}
		if hi < own[1] {
			out = append(out, [2]int{hi + 1, own[1]})
		}
		return out
	case rs.dst:
		out := [][2]int{own, {lo, hi}}
		if lo < own[0] {
			out[0], out[1] = out[1], out[0]
		}
		return out
	}
	return [][2]int{own}
}

// keyHome is the Cluster node where key lives now: its slot's master, or,
// while the slot migrates, the source if it has the key, else the target.
// (The state check reads a Cluster lock there.)
func (w *World) keyHome(key string) *Node {
	rs := w.resh
	if rs == nil || !rs.in(keySlot(key)) {
		return w.master(key)
	}
	switch rs.phase.Load() {
	case reshardMigrating:
		if src := w.masterNode(rs.src); src.has(key) {
			return src
		}
		return w.masterNode(rs.dst)
	case reshardDone:
		return w.masterNode(rs.dst)
	}
	return w.master(key)
}

// has reports whether key exists on n now (an expired key does not).
func (n *Node) has(key string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.m.SetTime(n.clockLocked())
	return n.m.Exists(key)
}

// reshardActions are the steps of a FaultReshard (nil for any other
// fault).
func (w *World) reshardActions(f Fault) []action {
	if f.Kind != FaultReshard {
		return nil
	}
	rs := w.resh
	src, dst := w.masterNode(rs.src), w.masterNode(rs.dst)
	as := []action{
		{f.At, fmt.Sprintf("%s: SETSLOT %d-%d IMPORTING on %s, MIGRATING on %s", f, f.Slots[0], f.Slots[1], dst.name, src.name), func() { rs.phase.Store(reshardMigrating) }},
		{f.At + f.For, "MIGRATE some keys from " + src.name + " to " + dst.name, func() { rs.migrate(w, false) }},
	}
	if f.Mode == reshardComplete {
		as = append(as, action{rs.lastStep(), "MIGRATE the rest, SETSLOT NODE " + dst.name, func() {
			rs.migrate(w, true)
			rs.phase.Store(reshardDone)
		}})
	}
	return as
}

// migrate moves keys of the range from the source to the target, as
// MIGRATE does (value and remaining TTL; each master's replica gets its
// master's change): all of them, or some (see the top of this file).
func (rs *reshard) migrate(w *World, all bool) {
	src, dst := w.masterNode(rs.src), w.masterNode(rs.dst)
	r := rand.New(rand.NewPCG(w.seed, 0x5e5a))
	src.mu.Lock()
	defer src.mu.Unlock()
	dst.mu.Lock()
	defer dst.mu.Unlock()
	srcNow, dstNow := src.clockLocked(), dst.clockLocked()
	src.m.SetTime(srcNow)
	dst.m.SetTime(dstNow)
	var keys []string
	for _, k := range src.m.Keys() { // sorted
		if !rs.in(keySlot(k)) || !src.m.Exists(k) {
			continue
		}
		move := r.IntN(2) == 0
		switch i := slices.Index(rs.keys[:], k); {
		case all:
			move = true
		case i == 0:
			move = true
		case i == 2:
			move = false
		}
		if move {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		w.hist.logf("reshard: MIGRATE from %s to %s: no key to move", src.name, dst.name)
		return
	}
	states := src.keyStatesLocked(keys)
	for i := range states {
		if !states[i].exp.IsZero() {
			states[i].exp = dstNow.Add(states[i].exp.Sub(srcNow)) // RESTORE's TTL, on the target's clock
		}
	}
	var pre []keyState
	if dst.replica != nil {
		pre = dst.keyStatesLocked(keys)
	}
	dst.applyStatesLocked(states)
	if dst.replica != nil {
		dst.replicateLocked(keys, pre)
	}
	if src.replica != nil {
		pre = src.keyStatesLocked(keys)
	}
	for _, k := range keys {
		src.m.Del(k)
	}
	if src.replica != nil {
		src.replicateLocked(keys, pre)
	}
	w.hist.logf("reshard: MIGRATE %s from %s to %s", strings.Join(keys, " "), src.name, dst.name)
}

// reshardLock is one of the construction's locks through the reshard.
type reshardLock struct {
	h         *probeHold
	stop      func()
	protected bool // valid and held on the source when the migration began
}

// reshardHold is the construction's part in a reshard: it takes the three
// keys of k1's slot shortly before the migration starts, keeps them with
// the construction's watchdog, and checks them (InvReshardKept) three
// TTLs after the migration's last step.
func (cf *clusterFailover) reshardHold(w *World) {
	rs := w.resh
	r := rand.New(rand.NewPCG(w.seed, 0xcf5e9)) // not cf.r: run draws from it meanwhile
	ttl := ms(r, 400, 800)                      // long enough to wait out a topology reload (see the top of this file)
	if w.opts.reshardShortTTL {
		ttl = ms(r, 100, 250)
	}
	jitter := func() time.Duration { return time.Duration(1 + r.IntN(999)) }
	sleep(rs.f.At - ms(r, 20, 60) + jitter() - w.hist.now())
	// A watchdog of their own: kept by the construction's, beside K2 on
	// the failing shard, whose renewals wait out WAIT's timeout while its
	// replica is cut off, these locks are lost although their own masters
	// renewed them (a batch returns no verdict before its slowest master
	// answers: TestFindingSlowMasterHoldsBackBatch).
	wd := cf.wd
	if !w.opts.reshardSharedWatchdog {
		wd = must(renew.New())
		w.onClose(cf.ci, func() { wd.Close() })
	}
	var locks []*reshardLock
	for i, k := range rs.keys {
		ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), cf.ci, jitClusterRepl, 300+i), time.Second)
		lk, err := cf.locker.TryLock(ctx, k, redlease.WithTTL(ttl))
		cancel()
		if err != nil {
			w.hist.logf("c%d construction: TryLock %s before the reshard: %v", cf.ci, k, short(err))
			continue
		}
		locks = append(locks, &reshardLock{h: cf.startHold(w, 10+i, "reshard", k, lk), stop: wd.Keep(lk)})
	}
	sleep(rs.f.At + jitter() - w.hist.now())
	src := w.masterNode(rs.src)
	for _, l := range locks {
		l.protected = l.h.lk.Valid() && src.holds(l.h.hd.Key, l.h.lk.Token())
		w.hist.logf("c%d construction: %s as the migration starts: valid %v, on %s %v", cf.ci, l.h.hd.Key, l.h.lk.Valid(), src.name, l.protected)
	}
	sleep(rs.lastStep() + 3*ttl + jitter() - w.hist.now())
	healthy := w.reshardHealthy(rs.f.At-100*time.Millisecond, w.hist.now())
	for _, l := range locks {
		lk := l.h.lk
		lost := false
		select {
		case <-lk.Lost():
			lost = true
		default:
		}
		valid := lk.Valid()
		home := w.keyHome(l.h.hd.Key)
		w.hist.logf("c%d construction: %s after the reshard (%s): lost=%v valid=%v protected=%v healthy=%v, lives on %s: %v", cf.ci, l.h.hd.Key, rs.f.Mode, lost, valid, l.protected, healthy, home.name, short(lk.Err()))
		if l.protected && healthy {
			w.hist.ex.count(InvReshardKept, 1)
			if lost || !valid {
				w.hist.violation(Violation{Inv: InvReshardKept, At: w.hist.now(), Detail: fmt.Sprintf(
					"c%d's lock on %s (TTL %v, kept by a watchdog) was lost by %.3fms, although the Cluster stayed healthy while slots %d-%d migrated from %s to %s (%s, the last step at %.3fms; the key now on %s): %v",
					cf.ci, l.h.hd.Key, ttl, msf(w.hist.now()), rs.f.Slots[0], rs.f.Slots[1], src.name, w.masterNode(rs.dst).name, rs.f.Mode, msf(rs.lastStep()), home.name, lk.Err())})
			}
		}
		l.stop()
		l.h.end(w)
	}
}

// reshardCheckEnd is the latest moment reshardHold checks its locks
// (virtual): the last step plus three of the longest TTL it draws.
func (w *World) reshardCheckEnd() time.Duration {
	return w.resh.lastStep() + 3*800*time.Millisecond + time.Millisecond
}

// reshardHealthy reports whether the Cluster was healthy for the
// reshard's locks from 'from' to 'to' (virtual): no pause of the source's
// or the target's shard (master or replica) from 100 ms before the
// reshard on (the schedule draws none: pausesReshard), no CLUSTERDOWN
// window, and no node of the Cluster down (the failing shard's master is down from its crash until
// it rejoins; the schedule puts the reshard after that, unless
// Scenario.reshardOverlap). With the construction's client sheltered
// (none of its messages lost or delayed by a fault), nothing stands
// between its watchdog and the two masters but the migration.
func (w *World) reshardHealthy(from, to time.Duration) bool {
	for _, g := range w.faults {
		if pausesReshard(g, w.resh.f) {
			return false
		}
	}
	if w.cfo.down.overlaps(from, to) {
		return false // every node answered CLUSTERDOWN meanwhile (clusterdown.go)
	}
	f := w.cfo.f
	if f.Mode == cfBehindTakeover {
		return true
	}
	down := f.At // healthy: the crash, then the promotion
	if f.Mode == cfBehindCrash {
		down = w.cfo.promoteAt() - w.cfDown()
	}
	return to <= down || from >= w.cfo.promoteAt()+f.For
}
