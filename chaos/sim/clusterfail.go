package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
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
// had caught up) and the lock was valid then; the first renewal that
// failed after the promotion (a renewal sent to the dead master waits,
// like any silent master's, up to nine tenths of the time its call has)
// ended at least clusterKeptSlack before the lock's Deadline (Until less
// the loss margin): time for go-redis to learn the new topology (one
// reload, after at most its 200 ms cooldown, having perhaps asked the dead
// master first and spent its dial retries there) and for the watchdog's
// next renewal; and the network lost none of the client's messages from the
// crash to the check (a lost handshake makes go-redis wait out its 3 s
// read timeout, longer than these TTLs). The lock is refused to no one
// else (its key is the construction's own), so only a loss for nothing
// counts. Examined: protected constructions.
const InvClusterKept = "cluster-kept"

// clusterKeptSlack is how long before a protected lock's Deadline the
// first renewal that failed after the promotion must have ended: go-redis's
// reload cooldown (200 ms), the watchdog's longest retry delay (250 ms) and
// a few round trips; plus deadDialCost times the client's dial backoff to
// the dead master, which a reload that asks it first spends in go-redis's
// dial retries (DialerRetries, 5 by default, with the backoff between).
const (
	clusterKeptSlack = 500 * time.Millisecond
	deadDialCost     = 5
)

func init() {
	examinedIn[InvClusterKept] = func(sc *Scenario) bool { return sc.Watchdog && sc.Cluster || sc.Strategy == FailoverCluster }
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

	mu       sync.Mutex
	lk       *redlease.Lock
	promoted time.Time // zero until the promotion
	failed   time.Time // the end of the first renewal that failed after it
	failDL   time.Time // the lock's Deadline then
}

// clusterFailObserver records, for the construction, the first renewal
// that failed after the promotion.
type clusterFailObserver struct{ cf *clusterFail }

func (o clusterFailObserver) Start(ctx context.Context, op redlease.Op) (context.Context, func(error)) {
	if op.Name != "extend" {
		return ctx, noDone
	}
	return ctx, func(err error) {
		cf := o.cf
		cf.mu.Lock()
		defer cf.mu.Unlock()
		if err == nil || cf.promoted.IsZero() || !cf.failed.IsZero() || cf.lk == nil {
			return
		}
		cf.failed, cf.failDL = time.Now(), cf.lk.Deadline()
	}
}

func (clusterFailObserver) Held(redlease.Op, time.Duration, error) {}

func (clusterFailObserver) NodeFailed(context.Context, redlease.Op, *redlease.NodeError) {}

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
	cf.locker = must(redlease.New(must(single.New(w.clusterClient(cf.ci, cte))), redlease.WithKeeper(wd), redlease.WithPolling(), redlease.WithObserver(clusterFailObserver{cf})))
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
	cf.mu.Lock()
	cf.lk = lk
	cf.mu.Unlock()
	stop := cf.wd.Keep(lk)
	defer stop()
	sleep(ms(r, 0, int(cf.ttl/time.Millisecond)/2))
	old, spare := w.masterNode(cf.m), w.spareReplica()
	w.hist.event(fmt.Sprintf("cluster-failover crash master %s", old.name))
	crashAt := w.hist.now()
	old.crash()
	sleep(ms(r, 20, 150))
	had := spare.holds(cf.key, lk.Token())
	spare.promote()
	w.cmaster[cf.m].Store(spare)
	cf.mu.Lock()
	cf.promoted = time.Now()
	cf.mu.Unlock()
	at := w.hist.now()
	w.hist.event(fmt.Sprintf("cluster-failover promote %s (held the lock: %v)", spare.name, had))
	until := lk.Until()
	valid := lk.Valid()
	w.hist.logf("c%d failover construction: %s promoted at %.3fms, replica held the token %v, the lock valid %v, its Deadline %.3fms later", cf.ci, spare.name, msf(at), had, valid, msf(time.Until(lk.Deadline())))
	sleep(time.Until(until) + cf.ttl)
	// Protected: the replica held the token, the lock was valid at the
	// promotion, and the first renewal that failed after it (if any:
	// the dead master's; it tells the library the topology may have
	// changed) ended at least clusterKeptSlack plus the dead master's dial
	// retries before the lock's Deadline.
	cf.mu.Lock()
	failed, failDL := cf.failed, cf.failDL
	cf.mu.Unlock()
	protected := had && valid
	if protected && !failed.IsZero() {
		left := failDL.Sub(failed)
		protected = left >= clusterKeptSlack+deadDialCost*w.dialRetry(cf.ci, uint64(old.id))
		w.hist.logf("c%d failover construction: the first renewal that failed after the promotion ended at %.3fms, %.3fms before the lock's Deadline: protected %v", cf.ci, msf(failed.Sub(w.start)), msf(left), protected)
	}
	lost := false
	select {
	case <-lk.Lost():
		lost = true
	default:
	}
	valid = lk.Valid()
	w.hist.logf("c%d failover construction: %.3fms after the promotion lost=%v valid=%v: %v", cf.ci, msf(w.hist.now()-at), lost, valid, short(lk.Err()))
	if n := w.lostOnLinks(cf.ci, crashAt, w.hist.now()); n > 0 && protected {
		// The network's own losses (inside the assumptions) are another
		// matter: a lost handshake makes go-redis wait out its read
		// timeout, longer than these TTLs.
		protected = false
		w.hist.logf("c%d failover construction: not protected after all: %d of its messages lost after the crash", cf.ci, n)
	}
	if protected {
		w.hist.ex.count(InvClusterKept, 1)
		if lost || !valid {
			w.hist.violation(Violation{Inv: InvClusterKept, At: w.hist.now(), Detail: fmt.Sprintf(
				"c%d's lock on %s (TTL %v) was lost although %s, promoted at %.3fms, held its token, and the first renewal that failed after that ended %v before the lock's Deadline (0: none failed): %v",
				cf.ci, cf.key, cf.ttl, spare.name, msf(at), failDL.Sub(failed).Round(time.Microsecond), lk.Err())})
		}
	}
	rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
	_ = lk.Release(rctx)
	rcancel()
}

// lostOnLinks counts the messages of client ci the network lost in
// [from, to] (World.links: Watchdog scenarios).
func (w *World) lostOnLinks(ci int, from, to time.Duration) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for k, ms := range w.links {
		if k[0] != ci {
			continue
		}
		for _, m := range ms {
			if m.lost && m.at >= from && m.at <= to {
				n++
			}
		}
	}
	return n
}
