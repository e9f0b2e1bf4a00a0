package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/renew"
	"github.com/redlease/redlease/single"
)

// Result is what one seed's run showed.
type Result struct {
	Seed       uint64
	Scenario   string
	Verdict    string // Pass, Hazard or Fail
	Violations []Violation
	Schedule   []Fault
	Warm       []int           // the nodes that started with the library's scripts cached (warm.go)
	Log        []string        // with Run's log on: what happened, in virtual time
	LogAt      []time.Duration // each Log line's exact virtual time (-1: a check's line)
	Grants     int
	Failures   int // lock attempts that failed (expected under faults)
	Messages   int
	Lost       int
	Effects    int           // Barrier: effects the fenced store accepted
	Excused    int           // Barrier: repeated effects after an unknown outcome
	Elapsed    time.Duration // virtual time the run took
	WorkEnd    time.Duration // virtual time the workload ended
	Watch      WatchStats    // watchdog-mixed: badkey, healthy and errnode figures
	Failover   FailoverStats // failover: the watcher's figures
	Wake       WakeStats     // wake-*: handoffs and how long they took
	Fair       FairStats     // fair-*: what the fifo check examined
	// Scopes: what each outside fault of the schedule can have affected
	// (scope.go); a violation is a hazard only inside one.
	Scopes []Scope
	// Examined: what each invariant examined, by name (examined.go).
	Examined map[string]int
}

// maxRun bounds a run in virtual time: a workload still going after it is
// reported stuck.
const maxRun = 120 * time.Second

// leakGrace is how long a run waits, in virtual time, for goroutines that
// end on their own after Close.
const leakGrace = 10 * time.Second

// defaultHorizon is the window in which a schedule's faults start
// (the first three quarters of it), for scenarios that set none.
const defaultHorizon = 1500 * time.Millisecond

// horizon is sc's fault window.
func (sc *Scenario) horizon() time.Duration {
	if sc.Horizon > 0 {
		return sc.Horizon
	}
	return defaultHorizon
}

// Options tune a run without changing its schedule.
type Options struct {
	// Log keeps the run's history line by line in Result.Log.
	Log bool
	// LostFirst calls Lock.Lost on a fresh grant before anything else, as
	// Locker.Do does (the order of TestFindingLostAfterDeadline). Off, the
	// workload calls Valid first.
	LostFirst bool
	// verifyReadings (tests): see World.verifyReadings.
	verifyReadings bool
	// reshardSharedWatchdog (TestFindingSlowMasterHoldsBackBatch): the
	// reshard construction keeps its locks with the construction's
	// watchdog, beside K and K2 on the failing shard, not with one of
	// their own (reshard.go).
	reshardSharedWatchdog bool
	// reshardShortTTL (the findings tests of reshard.go): the reshard
	// construction's locks get a TTL of 100-250 ms, not 400-800 ms.
	reshardShortTTL bool
}

// Run runs scenario sc under seed and checks its history. Call it inside a
// testing/synctest bubble (synctest.Test): the run then takes virtual
// time only, and a goroutine that outlives it fails the bubble.
func Run(sc Scenario, seed uint64, opts Options) *Result {
	w := newWorld(sc, seed, opts)
	sc = w.sc // as the seed's ops options set it (drawOps)
	start := w.start
	if sc.Strategy == Quorum && sc.DelayedRestart > 0 {
		// A deployment that has been up for a while: markers older than
		// the max TTL, so the nodes vote from the start.
		for _, n := range w.nodes {
			n.set(script.BootMarker, script.Marker(start.Add(-2*sc.DelayedRestart).UnixMilli(), n.runID))
		}
	}

	stop := make(chan struct{})
	var driver sync.WaitGroup
	driver.Go(func() { w.drive(stop) })

	var clients sync.WaitGroup
	var lockers [][]doLocker
	var fresh *clusterFresh
	var cfail *clusterFail
	var cfo *clusterFailover
	var cfLockers []*redlease.Locker
	if sc.Strategy == FailoverCluster {
		// As for Watchdog: the clients' Cluster clients warm up on a quiet
		// network (clusterrepl.go).
		w.quiet.Store(true)
		cfo = w.clusterFailoverSetup()
		for ci := range sc.Clients {
			lk, _ := w.clusterFailoverLocker(ci, ci%2 == 1, rand.New(rand.NewPCG(seed, 0xcf00|uint64(ci))))
			cfLockers = append(cfLockers, lk)
		}
		w.quiet.Store(false)
		clients.Go(func() { cfo.run(w) })
	}
	if sc.Watchdog {
		// Every client's strategies first, while the network is quiet
		// (warming: see clusterClient), then the workload.
		w.quiet.Store(true)
		for ci := range sc.Clients {
			lockers = append(lockers, w.doLockers(ci, rand.New(rand.NewPCG(seed, uint64(ci)+1))))
		}
		fresh = w.clusterFreshSetup()
		cfail = w.clusterFailSetup()
		w.quiet.Store(false)
	}
	if fresh != nil {
		clients.Go(func() { fresh.run(w) })
	}
	var lanes sync.WaitGroup
	lanesDone := make(chan struct{})
	if cfail != nil {
		clients.Go(func() { cfail.run(w, lanesDone) })
	}
	for ci := range sc.Clients {
		r := rand.New(rand.NewPCG(seed, uint64(ci)+1))
		if sc.Idem != "" {
			clients.Go(func() { w.idemWorkload(ci, r) })
			continue
		}
		if sc.Barrier {
			clients.Go(func() { w.barrierClient(ci, r) })
			continue
		}
		if sc.Strategy == Failover {
			clients.Go(func() { w.failoverClient(ci, r) })
			continue
		}
		if sc.Strategy == FailoverCluster {
			clients.Go(func() { w.clusterFailoverClient(ci, cfLockers[ci], r) })
			continue
		}
		if w.ops != nil {
			clients.Go(func() { w.opsClient(ci, r, nil) })
			continue
		}
		if sc.Watchdog {
			lanes.Add(1)
			clients.Go(func() {
				defer lanes.Done()
				w.doClient(ci, lockers[ci])
			})
			continue
		}
		locker := w.locker(ci, r)
		if sc.Client != nil {
			clients.Go(func() { sc.Client(w, ci, locker, r) })
			continue
		}
		clients.Go(func() { w.lockClient(ci, locker, r) })
	}
	go func() { lanes.Wait(); close(lanesDone) }()
	finished := make(chan struct{})
	go func() { clients.Wait(); close(finished) }()
	var vs []Violation
	timer := time.NewTimer(maxRun)
	select {
	case <-finished:
		timer.Stop()
	case <-timer.C:
		vs = append(vs, Violation{Inv: InvStuck, At: maxRun, Detail: "the workload was still running after " + maxRun.String()})
	}
	workEnd := time.Since(start)
	close(stop)
	driver.Wait()
	w.heal()
	<-finished
	// What the workload's last instant started in the background (a fair
	// Lock that gave up leaves its line from a goroutine of its own) runs
	// before the closers close the strategies under it, not as the Go
	// scheduler happens to order them.
	time.Sleep(time.Nanosecond)
	slices.SortStableFunc(w.closers, func(a, b closer) int { return a.ci - b.ci })
	for _, c := range w.closers {
		c.f()
	}
	// Under w.mu: a Cluster client's background reload (go-redis's
	// LazyReload) may be making a client of its own meanwhile; one made
	// after this is closed as it is made (redisClientAs).
	w.mu.Lock()
	made := w.clients
	w.clientsClosed = true
	w.mu.Unlock()
	for _, c := range made {
		_ = c.Close()
	}
	for _, n := range w.nodes {
		n.close()
	}
	w.net.close()
	// go-redis may still be backing off between dial retries that began
	// before Close (its dial goroutines wait on timers, up to DialerRetries
	// times); synctest stops the clock once this function returns, so give
	// them virtual time to end. Whatever still runs after it fails the
	// bubble as a leak.
	time.Sleep(leakGrace)

	fenced := sc.fenced()
	if w.ops != nil {
		fenced = w.ops.fencing // single and failover with WithoutFencing
	}
	w.applyRevokes()
	vs = append(vs, w.hist.check(fenced)...)
	vs = append(vs, w.checkRevokes()...)
	vs = append(vs, w.checkElect()...)
	vs = append(vs, w.checkFIFO()...)
	vs = append(vs, w.checkSem()...)
	vs = append(vs, w.checkIdem()...)
	wvs, wst := w.checkWatch()
	vs = append(vs, wvs...)
	fvs, fst := w.checkFailover()
	vs = append(vs, fvs...)
	kvs, kst := w.checkWake()
	vs = append(vs, kvs...)
	res := &Result{
		Seed:       seed,
		Scenario:   sc.Name,
		Violations: vs,
		Schedule:   w.faults,
		Warm:       w.warmNodes(),
		Log:        w.hist.lines,
		LogAt:      w.hist.ats,
		Grants:     len(w.hist.holds),
		Failures:   w.hist.fails,
		Messages:   w.msgs,
		Lost:       w.lost,
		Excused:    w.hist.excused,
		Effects:    w.hist.effectCount(),
		Elapsed:    time.Since(start),
		WorkEnd:    workEnd,
		Watch:      wst,
		Failover:   fst,
		Wake:       kst,
		Fair:       w.fairStats(),
	}
	if cfo != nil {
		w.countFencePromotion()
		res.Violations = append(res.Violations, w.checkClusterFailover(w.examined(res))...)
	}
	res.Scopes = w.scopes()
	excuse(res.Violations, res.Scopes, w.votesByToken())
	res.Verdict = grade(res.Violations)
	res.Examined = w.examined(res)
	for _, n := range w.nodes {
		n.releaseMini()
	}
	return res
}

// newWorld makes a run's world: its schedule, its nodes (Cluster nodes
// announcing their address) and its network goroutine.
func newWorld(sc Scenario, seed uint64, opts Options) *World {
	start := time.Now()
	ops := drawOps(seed, &sc) // the ops scenarios' options (nil elsewhere); may adjust sc
	w := &World{seed: seed, sc: sc, opts: opts, start: start, hist: newHistory(start, opts.Log), ops: ops, verifyReadings: opts.verifyReadings, warmDraw: true}
	if sc.Revoke {
		w.revokeGrants, w.revokeSent = map[string]uint64{}, map[string]bool{}
	}
	w.net = newSched(w.flushState)
	w.faults = makeSchedule(seed, &sc, sc.horizon())
	w.resh = newReshard(w.faults)
	w.afterSchedule() // clock-rate faults, the state check's windows
	if sc.Strategy == Failover {
		w.watchers = map[int]watchInfo{}
		w.setupFailover()
		return w
	}
	for i := range sc.allNodes() {
		n := newNode(w, i, "node"+strconv.Itoa(i))
		if sc.Cluster && i >= sc.clusterBase() {
			n.cluster, n.addr = true, n.name+":"+strconv.Itoa(clusterPort)
		}
		w.nodes = append(w.nodes, n)
	}
	return w
}

// must returns v, and panics on err: a constructor's error in the
// simulation is a bug in the scenario table.
func must[T any](v T, err error) T {
	if err != nil {
		panic(fmt.Sprintf("sim: %v", err))
	}
	return v
}

// fenced reports whether the scenario's strategy hands out rising fences.
func (sc *Scenario) fenced() bool {
	return sc.Fencing || sc.Strategy == Single || sc.Strategy == Failover || sc.Strategy == FailoverCluster
}

// locker builds client ci's strategy and Locker: its own go-redis clients
// to the nodes, unmodified but for the Dialer.
func (w *World) locker(ci int, r *rand.Rand) *redlease.Locker {
	ctxTimeouts := r.IntN(2) == 0
	switch w.sc.Strategy {
	case Single:
		var sopts []single.Option
		if c := w.clientClock(ci); c != nil {
			sopts = append(sopts, single.WithClock(c))
		}
		s := must(single.New(w.redisClient(ci, w.nodes[0], ctxTimeouts), sopts...))
		w.noteCTE(ci, ctxTimeouts)
		if w.sc.Wake || w.sc.SemWake {
			w.onClose(ci, func() { w.closeStrategy(ci, "end of run", s, s.Close) })
		}
		return must(redlease.New(s, w.lockerOptions(ci)...))
	default:
		return w.quorumLocker(ci, r, w.nodes, nil, ctxTimeouts)
	}
}

// lockerOptions are client ci's Locker options: fair mode for every
// client but the last in a Fair scenario, and polling (WithPolling) unless
// the scenario wakes waiters by release notices (Wake).
func (w *World) lockerOptions(ci int) []redlease.Option {
	opts := []redlease.Option{redlease.WithFairness(w.sc.Fair && ci < w.sc.Clients-1)}
	if !w.sc.Wake && !w.sc.SemWake {
		opts = append(opts, redlease.WithPolling())
	}
	if w.sc.Multi || w.sc.Permits > 0 || w.sc.Elect {
		wd := must(renew.New())
		w.onClose(ci, func() { wd.Close() })
		opts = append(opts, redlease.WithKeeper(wd))
	}
	// The state check hears every extension's outcome; a client whose
	// clock drifts judges validity by it (drift.go).
	opts = append(opts, redlease.WithObserver(stateObserver{w, ci}))
	if c := w.clientClock(ci); c != nil {
		opts = append(opts, redlease.WithClock(c))
	}
	return opts
}

// quorumLocker builds client ci's quorum strategy over nodes, and its
// Locker with opt (nil: none).
func (w *World) quorumLocker(ci int, r *rand.Rand, nodes []*Node, opt redlease.Option, ctxTimeouts ...bool) *redlease.Locker {
	ct := r.IntN(2) == 0
	if len(ctxTimeouts) > 0 {
		ct = ctxTimeouts[0]
	}
	{
		var cs []redis.UniversalClient
		for _, n := range nodes {
			cs = append(cs, w.redisClient(ci, n, ct))
		}
		var opts []quorum.Option
		if w.sc.Fencing {
			opts = append(opts, quorum.WithFencing())
		} else {
			opts = append(opts, quorum.WithoutFencing()) // fences are on by default
		}
		if w.sc.DelayedRestart > 0 {
			opts = append(opts, quorum.WithDelayedRestart(w.sc.DelayedRestart))
		}
		if c := w.clientClock(ci); c != nil {
			opts = append(opts, quorum.WithClock(c))
		}
		q, err := quorum.New(cs, opts...)
		if err != nil {
			panic(fmt.Sprintf("sim: quorum.New: %v", err)) // a bug in the scenario table
		}
		w.onClose(ci, func() { w.closeStrategy(ci, "end of run", q, q.Close) })
		lopts := w.lockerOptions(ci)
		if opt != nil {
			lopts = append(lopts, opt)
		}
		return must(redlease.New(q, lopts...))
	}
}
