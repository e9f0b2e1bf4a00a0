package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/internal/renewal"
	"github.com/redlease/redlease/renew"
)

// clusterdown: the simulated Cluster down for a window (cluster-failover,
// one run in two), as a Redis Cluster with cluster-require-full-coverage
// on (the default) goes down while a master is unreachable: every node,
// master or replica, answers every command that names a key with
// "CLUSTERDOWN The cluster is down" (the exact reply of Redis 7's
// clusterRedirectClient, which go-redis's IsClusterDownError
// recognises), after CROSSSLOT and before MOVED, ASK and TRYAGAIN, as
// getNodeByQuery decides them (Node.clusterHook). A script that declares
// no key runs, and each redis.call or redis.pcall of a key in it fails
// with "ERR Script attempted to execute a command while the cluster is
// down" (scriptVerifyClusterState): ExtendMany's local layout gets
// KeyFailed for every key and sends each again on its own, declared,
// which the node refuses with CLUSTERDOWN. Commands without keys answer
// as always: WAIT, PING, INFO, SCRIPT LOAD, and CLUSTER SHARDS, SLOTS and
// NODES (real Redis answers them while down; they list the topology as
// it is).
//
// Not modelled: the cause. No master is down for it (the schedule decides
// the window, not a failure detection: the failover's crash does not take
// the Cluster down, nor does the window promote anything); reads are
// refused as writes (cluster-allow-reads-when-down no, the default).
//
// The window (FaultClusterDown: At, For) is short (10-60 ms, well under
// every lock's TTL) or long (200-600 ms, past the workload's TTLs of
// 60-300 ms) alike. Half the time it comes during the workload, ending
// 150 ms before the failover's cut or crash when there is room; otherwise
// 0-300 ms after the failover's span (its promotion, 450 ms or the old
// master's rejoin, whichever is later, and 150 ms): the failover's
// construction (the cut's probe, K2 and its contender, P after the
// rejoin) never meets it. A reshard may overlap it: reshard-kept then
// judges nothing (reshardHealthy).
//
// The construction (clusterFailover.downHold), on the construction's
// sheltered client with a renew.Watchdog of its own (default options):
// 20-60 ms before At it takes three keys, one per shard ("D<shard>.<n>",
// outside any reshard's range), TTLs sure (long enough that the lock must
// be renewed after the window: (For + 600 ms)/0.89 + 0-200 ms), short
// (60-150 ms: a long window outlasts its Deadline) and any (100-1500 ms);
// the sure one first, on a shard other than the failing one, whose pauses
// near the window the schedule drops; each TryLock's ctx ends 5 ms before
// the window. 1 ms into the window it tries a key Q of the sure lock's
// shard with TryLock (held-kind/down). At the window's end it reads each lock:
//
//   - down-kept: a lock valid and held on its master as the window began,
//     whose Deadline D (as the window ends) leaves time for a renewal
//     (window end + downMargin <= D), on a shard healthy from 100 ms before
//     the window to D (no pause of its master or replica; for the failing
//     shard, no part of its failover), must be Valid and not lost at D +
//     1 ms: its renewals resumed. Examined: such locks.
//   - down-kept/lost: a lock whose Deadline passed before the window
//     ended (by more than boundSlack) must read lost (Lost closed, Valid
//     false) then: a lock that could not be renewed is reported lost by
//     its Deadline. Examined: such locks (registered in examinedIn).
//   - held-kind/down (heldkind.go): every acquisition attempt the
//     Locker's observer saw start and end inside the window (the
//     construction's TryLock of Q, and the workload's in a window during
//     it) is answered ErrUnavailable, never ErrNotObtained ("held"),
//     unless its ctx ended. Examined: those attempts.
//
// A run with the window that examined nothing for down-kept or
// held-kind/down fails (examined-run).

// FaultClusterDown is a window of CLUSTERDOWN on every Cluster node
// (At, For; Mode: downShort or downLong).
const FaultClusterDown = "clusterdown"

// Modes of FaultClusterDown.
const (
	downShort = "short"
	downLong  = "long"
)

// InvDownKept: a lock whose renewals could resume before its Deadline
// after a CLUSTERDOWN window was lost, or one that could not be renewed
// was not reported lost by its Deadline.
const InvDownKept = "down-kept"

// ExDownLost counts down-kept's locks that could not be renewed in time,
// checked for being reported lost.
const ExDownLost = InvDownKept + "/lost"

// ExHeldDown counts acquisition attempts made inside a CLUSTERDOWN window,
// checked for being answered ErrUnavailable.
const ExHeldDown = InvHeldKind + "/down"

func init() {
	cf := func(sc *Scenario) bool { return sc.Strategy == FailoverCluster }
	examinedIn[InvDownKept] = cf
	examinedIn[ExDownLost] = cf
	examinedIn[ExHeldDown] = cf
}

// clusterDown is a run's CLUSTERDOWN window.
type clusterDown struct {
	f    Fault
	on   atomic.Bool // the Cluster is down now (the nodes read it)
	sure int         // the shard of the construction's sure lock
}

// downWindowFault draws cluster-failover's CLUSTERDOWN window (after the
// rest of the schedule, from the same stream) around the failover f, and
// drops the pauses of the sure lock's shard near it.
func downWindowFault(r *rand.Rand, f Fault, fs []Fault) []Fault {
	d := Fault{Kind: FaultClusterDown, Node: -1, Client: -1, Mode: downShort, For: ms(r, 10, 60)}
	if r.IntN(2) == 0 {
		d.Mode, d.For = downLong, ms(r, 200, 600)
	}
	failStart := f.At - 150*time.Millisecond
	if room := failStart - d.For; room >= 150*time.Millisecond && r.IntN(2) == 0 {
		d.At = ms(r, 150, int(room/time.Millisecond))
	} else {
		d.At = cfSpanEnd(f) + ms(r, 0, 300)
	}
	sure := (f.Node + 1 + r.IntN(ClusterMasters-1)) % ClusterMasters
	d.Nodes = []int{sure}
	from, to := d.At-200*time.Millisecond, d.At+d.For+2500*time.Millisecond
	fs = slices.DeleteFunc(fs, func(g Fault) bool {
		return g.Kind == FaultPause && g.Node%ClusterMasters == sure && g.At < to && g.At+g.For > from
	})
	return append(fs, d)
}

// cfSpanEnd is when the failover f's construction is done with it: its
// promotion, plus the old master's rejoin or 450 ms (K2's contender),
// whichever is later, and 150 ms.
func cfSpanEnd(f Fault) time.Duration {
	return f.At + f.Amount + max(f.For, 450*time.Millisecond) + 150*time.Millisecond
}

// newClusterDown is the run's CLUSTERDOWN window, if its schedule drew one.
func newClusterDown(faults []Fault) *clusterDown {
	for _, f := range faults {
		if f.Kind == FaultClusterDown {
			return &clusterDown{f: f, sure: f.Nodes[0]}
		}
	}
	return nil
}

// end is when the window ends (virtual).
func (d *clusterDown) end() time.Duration { return d.f.At + d.f.For }

// overlaps reports whether the window meets [from, to] (virtual).
func (d *clusterDown) overlaps(from, to time.Duration) bool {
	return d != nil && d.f.At < to && d.end() > from
}

// clusterDownActions are the window's start and end.
func (w *World) clusterDownActions(f Fault) []action {
	return []action{
		{f.At, f.String() + ": every Cluster node answers CLUSTERDOWN", func() { w.cfo.down.on.Store(true) }},
		{f.At + f.For, "the Cluster is up", func() { w.cfo.down.on.Store(false) }},
	}
}

// clusterIsDown reports whether the Cluster answers CLUSTERDOWN now.
func (w *World) clusterIsDown() bool {
	cf := w.cfo
	return cf != nil && cf.down != nil && cf.down.on.Load()
}

// downMargin is how long before a kept lock's Deadline a CLUSTERDOWN
// window must end for the lock to be renewed in time, from the library's
// code: the renewal refused at the window's last instant is retried
// renewal.RetryDelay (min(interval/4, 250 ms), the interval being
// renew.DefaultFraction of the TTL) after it returned; that refused call
// and the one that succeeds each take a few round trips on the
// construction's sheltered links (at most 0.5 ms each way: CLUSTER SHARDS,
// the batch's pipeline, the key sent again on its own) and one WAIT,
// which answers within failover.DefaultWaitTimeout: 5 ms plus the WAIT
// timeout per call.
func downMargin(ttl time.Duration) time.Duration {
	interval := time.Duration(float64(ttl) * renew.DefaultFraction)
	return renewal.RetryDelay(interval) + 2*(failover.DefaultWaitTimeout+5*time.Millisecond)
}

// downKey is the first key "D<shard>.<n>" of shard's slots outside the
// run's reshard range.
func (w *World) downKey(shard int) string {
	for n := 0; ; n++ {
		k := "D" + itoa(shard) + "." + itoa(n)
		s := keySlot(k)
		if masterOfSlot(s) == shard && (w.resh == nil || !w.resh.in(s)) {
			return k
		}
	}
}

// downLock is one of the construction's locks through the window.
type downLock struct {
	h       *probeHold
	stop    func()
	shard   int
	ttl     time.Duration
	atStart bool // valid and held on its master as the window began
}

// downHealthy reports whether shard was healthy for a kept lock from
// 'from' to 'to' (virtual): no pause of its master or replica, and, for
// the failing shard, no part of its failover (from 50 ms before the cut or
// crash to 100 ms after the rejoin).
func (w *World) downHealthy(shard int, from, to time.Duration) bool {
	for _, g := range w.faults {
		if g.Kind == FaultPause && g.Node%ClusterMasters == shard && g.At < to && g.At+g.For > from {
			return false
		}
	}
	cf := w.cfo
	if shard == cf.shard {
		f := cf.f
		if f.At-50*time.Millisecond < to && cf.promoteAt()+f.For+100*time.Millisecond > from {
			return false
		}
	}
	return true
}

// downHold is the construction's part in a CLUSTERDOWN window (see the
// top of this file).
func (cf *clusterFailover) downHold(w *World) {
	d := cf.down
	r := rand.New(rand.NewPCG(w.seed, 0xcf5ea)) // not cf.r: run draws from it meanwhile
	jitter := func() time.Duration { return time.Duration(1 + r.IntN(999)) }
	ttls := [3]time.Duration{
		(d.f.For+600*time.Millisecond)*100/89 + ms(r, 0, 200), // sure
		ms(r, 60, 150),   // short
		ms(r, 100, 1500), // any
	}
	others := []int{0, 1, 2}
	others = slices.DeleteFunc(others, func(i int) bool { return i == d.sure })
	if r.IntN(2) == 0 {
		others[0], others[1] = others[1], others[0]
	}
	shards := [3]int{d.sure, others[0], others[1]}
	sleep(d.f.At - ms(r, 20, 60) + jitter() - w.hist.now())
	wd := must(renew.New())
	w.onClose(cf.ci, func() { wd.Close() })
	var locks []*downLock
	for j, sh := range shards {
		k := w.downKey(sh)
		// Done before the window, whatever a paused master holds back.
		ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), cf.ci, jitClusterRepl, 400+j), d.f.At-5*time.Millisecond-w.hist.now())
		lk, err := cf.locker.TryLock(ctx, k, redlease.WithTTL(ttls[j]))
		cancel()
		if err != nil {
			w.hist.logf("c%d construction: TryLock %s before the CLUSTERDOWN: %v", cf.ci, k, short(err))
			continue
		}
		locks = append(locks, &downLock{h: cf.startHold(w, 20+j, "down", k, lk), stop: wd.Keep(lk), shard: sh, ttl: ttls[j]})
	}
	defer func() {
		for _, l := range locks {
			l.stop()
			l.h.end(w)
		}
	}()
	sleep(d.f.At + jitter() - w.hist.now())
	for _, l := range locks {
		lk := l.h.lk
		l.atStart = lk.Valid() && w.master(l.h.hd.Key).holds(l.h.hd.Key, lk.Token())
		w.hist.logf("c%d construction: %s (TTL %v) as the Cluster goes down: held %v, Deadline in %.3fms", cf.ci, l.h.hd.Key, l.ttl, l.atStart, msf(time.Until(lk.Deadline())))
	}
	// An acquisition inside the window: held-kind/down.
	sleep(d.f.At + time.Millisecond + jitter() - w.hist.now())
	q := shardKey("Q.", d.sure) // no pause near the window there
	ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), cf.ci, jitClusterRepl, 410), time.Second)
	start := w.hist.now()
	lk, err := cf.locker.TryLock(ctx, q, redlease.WithTTL(time.Second))
	cancel()
	w.hist.logf("c%d construction: TryLock %s while the Cluster is down (%.3fms): %v", cf.ci, q, msf(w.hist.now()-start), short(err))
	if err == nil {
		h := cf.startHold(w, 30, "down-probe", q, lk)
		h.end(w)
	}

	sleep(d.end() + jitter() - w.hist.now())
	type check struct {
		l  *downLock
		at time.Time // D + 1 ms
	}
	var checks []check
	for _, l := range locks {
		lk := l.h.lk
		dl, now := lk.Deadline(), time.Now()
		margin := downMargin(l.ttl)
		switch {
		case !dl.Add(boundSlack).After(now):
			cf.checkDownLost(w, l)
		case l.atStart && !now.Add(margin).After(dl):
			checks = append(checks, check{l, dl.Add(time.Millisecond)})
			w.hist.logf("c%d construction: %s as the Cluster comes up: Deadline in %.3fms, at least the margin %.3fms: renewed by then", cf.ci, l.h.hd.Key, msf(dl.Sub(now)), msf(margin))
		default:
			w.hist.logf("c%d construction: %s as the Cluster comes up: held at the start %v, Deadline in %.3fms, margin %.3fms: not judged", cf.ci, l.h.hd.Key, l.atStart, msf(dl.Sub(now)), msf(margin))
		}
	}
	slices.SortStableFunc(checks, func(a, b check) int { return a.at.Compare(b.at) })
	for _, c := range checks {
		sleep(time.Until(c.at) + jitter())
		l, lk := c.l, c.l.h.lk
		lost := closed(lk.Lost())
		valid := lk.Valid()
		from := d.f.At - 100*time.Millisecond
		healthy := w.downHealthy(l.shard, from, w.hist.now())
		w.hist.logf("c%d construction: %s at its Deadline after the CLUSTERDOWN: lost=%v valid=%v healthy=%v: %v", cf.ci, l.h.hd.Key, lost, valid, healthy, short(lk.Err()))
		if !healthy {
			continue
		}
		w.hist.ex.count(InvDownKept, 1)
		if lost || !valid {
			w.hist.violation(Violation{Inv: InvDownKept, At: w.hist.now(), Detail: fmt.Sprintf(
				"c%d's lock on %s (TTL %v, kept by a watchdog) was lost by its Deadline %.3fms after a CLUSTERDOWN window (%s, %.3f-%.3fms) that ended at least %.3fms (retry delay, two calls with WAIT) before it: %v",
				cf.ci, l.h.hd.Key, l.ttl, msf(w.hist.now()-time.Millisecond), d.f.Mode, msf(d.f.At), msf(d.end()), msf(downMargin(l.ttl)), lk.Err())})
		}
	}
}

// checkDownLost checks, as the window ends, a lock whose Deadline passed
// during it: it must read lost (down-kept/lost).
func (cf *clusterFailover) checkDownLost(w *World, l *downLock) {
	lk := l.h.lk
	lost := closed(lk.Lost())
	valid := lk.Valid()
	w.hist.logf("c%d construction: %s (TTL %v) as the Cluster comes up: Deadline %.3fms ago: lost=%v valid=%v: %v", cf.ci, l.h.hd.Key, l.ttl, msf(-time.Until(lk.Deadline())), lost, valid, short(lk.Err()))
	w.hist.ex.count(ExDownLost, 1)
	if !lost || valid {
		w.hist.violation(Violation{Inv: InvDownKept, At: w.hist.now(), Detail: fmt.Sprintf(
			"c%d's lock on %s (TTL %v), its Deadline %.3fms past during a CLUSTERDOWN window, reads lost=%v valid=%v",
			cf.ci, l.h.hd.Key, l.ttl, msf(-time.Until(lk.Deadline())), lost, valid)})
	}
}

// downAttempt checks held-kind/down for one acquisition attempt of client
// ci on key that started at t0 (virtual) and was answered err under ctx:
// inside a CLUSTERDOWN window, it must be an outage (ErrUnavailable), not
// "held" nor a grant, unless its ctx ended. It reports whether the attempt
// was inside the window (heldKind checks nothing more then).
func (w *World) downAttempt(ctx context.Context, ci int, key string, t0 time.Duration, err error) bool {
	cf := w.cfo
	if cf == nil || cf.down == nil {
		return false
	}
	d := cf.down
	if t0 < d.f.At || w.hist.now() >= d.end() {
		return false
	}
	w.hist.ex.count(ExHeldDown, 1)
	switch {
	case errors.Is(err, redlease.ErrUnavailable) && !errors.Is(err, redlease.ErrNotObtained):
		return true
	case err != nil && ctx.Err() != nil && errors.Is(err, context.Cause(ctx)):
		return true
	}
	answer := "granted"
	if err != nil {
		answer = err.Error()
	}
	w.hist.violation(Violation{Inv: InvHeldKind, At: w.hist.now(), Detail: fmt.Sprintf(
		"c%d acquire %s at %.3fms, inside the CLUSTERDOWN window %.3f-%.3fms: answered %s, not as an outage (ErrUnavailable)",
		ci, key, msf(t0), msf(d.f.At), msf(d.end()), answer)})
	return true
}
