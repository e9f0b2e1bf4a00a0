package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/single"
)

// The fresh-client construction (watchdog-mixed): ctx-bound on the
// Cluster, for a client as a Cluster user builds it, with go-redis's
// routing policies on. Such a client fetches COMMAND (Redis 7's command
// tips) at its first routed command, and with ContextTimeoutEnabled it
// does so on a ctx of its own (context.Background() plus 5 s), not the
// caller's; a library that trusts the client to honour the caller's ctx
// then returns when the fetch gives up, whatever the caller's deadline.
//
// In one seed in two (drawn from a stream of its own, so the seed's other
// draws stay as they were) an extra client (index Clients) builds, while
// the run sets up, a single strategy on a freshClusterClient
// (ContextTimeoutEnabled in two of three), polling (no subscription: one
// call at a time on its client). During the workload, at a drawn instant,
// its links fall silent (World.silence, for longer than go-redis's COMMAND
// fetch) and it calls TryLock on a key of
// its own with a ctx deadline of 50–300 ms: ctx-bound checks that call.
// Examined: ExCtxClusterFresh, such calls.

// commandFetchTimeout is how long go-redis's ClusterClient, with
// ContextTimeoutEnabled, gives its COMMAND fetch (osscluster.go, cmdInfo).
const commandFetchTimeout = 5 * time.Second

// ExCtxClusterFresh: ctx-bound checks of the fresh-client construction.
const ExCtxClusterFresh = InvCtxBound + "/cluster-fresh"

func init() {
	examinedIn[ExCtxClusterFresh] = func(sc *Scenario) bool { return sc.Watchdog && sc.Cluster }
}

// clusterFresh is one seed's fresh-client construction.
type clusterFresh struct {
	ci     int
	cte    bool
	client *redis.ClusterClient
	locker *redlease.Locker
	r      *rand.Rand
}

// clusterFreshSetup draws the construction and, if the seed has it,
// builds its Locker (called while the network is quiet). nil: none.
func (w *World) clusterFreshSetup() *clusterFresh {
	if !w.sc.Watchdog || !w.sc.Cluster {
		return nil
	}
	r := rand.New(rand.NewPCG(w.seed, 0xc1f5))
	if r.IntN(2) != 0 {
		return nil
	}
	cf := &clusterFresh{ci: w.sc.Clients, cte: r.IntN(3) != 0, r: r}
	w.noteCTE(cf.ci, cf.cte)
	w.hist.logf("c%d fresh cluster client ContextTimeoutEnabled=%v", cf.ci, cf.cte)
	cf.client = w.freshClusterClient(cf.ci, cf.cte)
	cf.locker = must(redlease.New(must(single.New(cf.client)), redlease.WithPolling()))
	return cf
}

// run makes the construction's call and checks it (see ExCtxClusterFresh).
func (cf *clusterFresh) run(w *World) {
	const seq = 0
	r := cf.r
	sleep(ms(r, 0, 400))
	d := ms(r, 50, 300)
	key := fmt.Sprintf("f%d", r.IntN(ClusterMasters))
	// Silent past go-redis's own 5 s for the COMMAND fetch: every
	// request of it is lost, whichever masters go-redis picks (with
	// math/rand) and in whatever order, so the seed's history is one.
	w.silence(cf.ci, commandFetchTimeout+time.Second)
	ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), cf.ci, jitClusterFresh, seq), d)
	start := w.hist.now()
	lk, err := cf.locker.TryLock(ctx, key)
	cancel()
	w.hist.ex.count(ExCtxClusterFresh, 1)
	w.hist.logf("c%d#%d fresh cluster client TryLock %s (deadline %v, its links silent): returned after %.3fms: %v", cf.ci, seq, key, d, msf(w.hist.now()-start), short(err))
	w.checkCtx(cf.ci, "TryLock (fresh cluster client, links silent)", key, start, d, true)
	// Closed at once: what the abandoned call and its undo do next on
	// silent links (go-redis retries the fetch on masters it picks with
	// math/rand, dials again) is not the construction's business, and
	// would make the seed's history differ from run to run.
	_ = cf.client.Close()
	if lk != nil {
		w.hist.logf("c%d#%d fresh cluster client granted %s through silent links", cf.ci, seq, key)
	}
}
