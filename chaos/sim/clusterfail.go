package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/renew"
	"github.com/redlease/redlease/single"
)

// The failover construction (watchdog-mixed): a Cluster master fails over
// to a replica that holds a kept lock, and the lock must survive it.
//
// In one seed in two (drawn from a stream of its own, so the seed's other
// draws stay as they were) the spare replica (the node after the Cluster's
// masters) follows one master from the start, and an extra client (index
// Clients+1, its links untouched by the schedule) with a single strategy
// on a ClusterClient kept by a renew.Watchdog of its own waits for the
// workload's lanes to end, takes a key of that master with a TTL of
// 1.5-3 s and keeps it. After a drawn pause the master crashes; after a
// drawn 20-150 ms (the Cluster's node timeout and election) the spare is
// promoted and serves the master's slots (CLUSTER SLOTS says so; the old
// master stays down). The construction then watches the lock until its
// Until at the promotion plus one TTL.
//
// cluster-kept: a protected lock is neither lost nor invalid by then.
// Protected: the replica held the lock's token when promoted (replication
// had caught up), and the lock's Deadline (Until less the loss margin) was
// at least clusterKeptSlack after the promotion: time for go-redis to
// learn the new topology (one reload, after at most its 200 ms cooldown)
// and for the watchdog's next renewal. The lock is refused to no one
// else (its key is the construction's own), so only a loss for nothing
// counts. Examined: protected constructions.
const InvClusterKept = "cluster-kept"

// clusterKeptSlack is how long after the promotion a protected lock's
// Deadline must be: go-redis's reload cooldown (200 ms), the watchdog's
// longest retry delay (250 ms) and a few round trips.
const clusterKeptSlack = 500 * time.Millisecond

func init() {
	examinedIn[InvClusterKept] = func(sc *Scenario) bool { return sc.Watchdog && sc.Cluster }
}

// clusterFail is one seed's failover construction.
type clusterFail struct {
	ci     int
	m      int // the master that fails over
	key    string
	ttl    time.Duration
	locker *redlease.Locker
	wd     *renew.Watchdog
	r      *rand.Rand
}

// clusterFailSetup draws the construction and, if the seed has it, makes
// the spare replica follow its master and builds its Locker (called while
// the network is quiet). nil: none.
func (w *World) clusterFailSetup() *clusterFail {
	if !w.sc.Watchdog || !w.sc.Cluster {
		return nil
	}
	r := rand.New(rand.NewPCG(w.seed, 0xc1fa))
	if r.IntN(2) != 0 {
		return nil
	}
	cf := &clusterFail{ci: w.sc.Clients + 1, m: r.IntN(ClusterMasters), ttl: ms(r, 1500, 3000), r: r}
	for i := 0; i < 100000; i++ {
		k := "cf" + strconv.Itoa(i)
		if masterOfSlot(keySlot(k)) == cf.m {
			cf.key = k
			break
		}
	}
	cte := r.IntN(2) == 0
	w.spareReplica().follow(w.masterNode(cf.m))
	wd, err := renew.New()
	if err != nil {
		panic(fmt.Sprintf("sim: renew.New: %v", err))
	}
	cf.wd = wd
	w.onClose(cf.ci, func() { wd.Close() })
	cf.locker = must(redlease.New(must(single.New(w.clusterClient(cf.ci, cte))), redlease.WithKeeper(wd), redlease.WithPolling()))
	w.hist.logf("c%d failover construction: %s on master %s, spare %s follows it, ContextTimeoutEnabled=%v", cf.ci, cf.key, w.masterNode(cf.m).name, w.spareReplica().name, cte)
	return cf
}

// run makes the construction (see InvClusterKept), once lanes is closed.
func (cf *clusterFail) run(w *World, lanes <-chan struct{}) {
	<-lanes
	r := cf.r
	ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), cf.ci, jitClusterFail, 0), time.Second)
	lk, err := cf.locker.TryLock(ctx, cf.key, redlease.WithTTL(cf.ttl))
	cancel()
	if err != nil {
		w.hist.logf("c%d failover construction: TryLock %s: %v", cf.ci, cf.key, short(err))
		return
	}
	stop := cf.wd.Keep(lk)
	defer stop()
	sleep(ms(r, 0, int(cf.ttl/time.Millisecond)/2))
	old, spare := w.masterNode(cf.m), w.spareReplica()
	w.hist.event(fmt.Sprintf("cluster-failover crash master %s", old.name))
	old.crash()
	sleep(ms(r, 20, 150))
	had := spare.holds(cf.key, lk.Token())
	spare.promote()
	w.cmaster[cf.m].Store(spare)
	at := w.hist.now()
	w.hist.event(fmt.Sprintf("cluster-failover promote %s (held the lock: %v)", spare.name, had))
	deadline, until := lk.Deadline(), lk.Until()
	protected := had && lk.Valid() && time.Until(deadline) >= clusterKeptSlack
	w.hist.logf("c%d failover construction: %s promoted at %.3fms, replica held the token %v, the lock's Deadline %.3fms later: protected %v", cf.ci, spare.name, msf(at), had, msf(time.Until(deadline)), protected)
	sleep(time.Until(until) + cf.ttl)
	lost := false
	select {
	case <-lk.Lost():
		lost = true
	default:
	}
	valid := lk.Valid()
	w.hist.logf("c%d failover construction: %.3fms after the promotion lost=%v valid=%v: %v", cf.ci, msf(w.hist.now()-at), lost, valid, short(lk.Err()))
	if protected {
		w.hist.ex.count(InvClusterKept, 1)
		if lost || !valid {
			w.hist.violation(Violation{Inv: InvClusterKept, At: w.hist.now(), Detail: fmt.Sprintf(
				"c%d's lock on %s (TTL %v) was lost although %s, promoted at %.3fms, held its token and its Deadline was %v after that: %v",
				cf.ci, cf.key, cf.ttl, spare.name, msf(at), deadline.Sub(w.start.Add(at)).Round(time.Microsecond), lk.Err())})
		}
	}
	rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
	_ = lk.Release(rctx)
	rcancel()
}
