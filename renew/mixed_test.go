package renew_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/renew"
	"github.com/redlease/redlease/single"
)

// The size of TestMixedStrategiesWithSickNodes. The defaults fit `make test`
// (about 15 s on two cores beside the other packages) and still exercise
// every fault; issue 12's full size is
//
//	go test -race -run Mixed ./renew/ -mixed.locks=10000 -mixed.hold=30s
var (
	mixedLocks = flag.Int("mixed.locks", 1500, "TestMixedStrategiesWithSickNodes: locks kept, a third per strategy")
	mixedHold  = flag.Duration("mixed.hold", 7*time.Second, "TestMixedStrategiesWithSickNodes: how long they are kept once taken; the faults start a quarter of the way in")
	mixedTTL   = flag.Duration("mixed.ttl", 3*time.Second, "TestMixedStrategiesWithSickNodes: the locks' TTL")
	mixedEach  = flag.Bool("mixed.each", false, "TestMixedStrategiesWithSickNodes: log every sick lock's loss, not only the summary")
)

// Issue 12, "Must show 2": one Watchdog keeps locks of three strategies at
// once — single on one node, quorum over five nodes, single on a 3-master
// Cluster — and a quarter of the way into the hold one node of each falls
// sick: the single node and one Cluster master are paused (SIGSTOP), one
// quorum node is black-holed (a proxy that accepts and never answers). Every
// client has go-redis's default options: no ContextTimeoutEnabled, so a call
// to a sick node stays inside go-redis for its 3 s ReadTimeout whatever its
// context says.
//
// Over the hold no healthy lock may be lost (every quorum lock: four of five
// nodes answer; every Cluster lock on the two healthy masters) unless this
// process was measured stalled for half the time its renewal had
// (healthyLoss), every lock on
// a sick node must be reported lost (Lost closed) before its Until unless
// this process was measured unable to run its timers for at least as long as
// the overrun, no sick lock may be reported valid past its deadline (Until
// less the loss margin), and Close, at the end, must return within one
// renewal timeout (plus twice this process's measured stall meanwhile)
// although a renewal call to the paused node is in flight.
func TestMixedStrategiesWithSickNodes(t *testing.T) {
	n, hold, ttl := *mixedLocks, *mixedHold, *mixedTTL
	faultAt := hold / 4
	// The sick locks' last renewal comes at most an interval before the
	// fault; they are lost within a TTL of it, and the end must come after
	// that with room to spare.
	if n < 300 || ttl < time.Second || hold-faultAt < ttl+2*time.Second {
		t.Fatalf("-mixed.locks=%d -mixed.hold=%v -mixed.ttl=%v: need at least 300 locks, a TTL of at least 1s, and three quarters of the hold at least TTL+2s", n, hold, ttl)
	}
	ctx := t.Context()

	// The nodes.
	singleSrv := redistest.Start(t, redistest.Config{})
	quorumSrvs := redistest.StartN(t, 5, redistest.Config{})
	clusterSrvs := redistest.StartCluster(t, 3)
	// A Cluster without replicas stops serving every slot once its masters
	// agree that one of them failed (cluster-node-timeout, 15 s): Redis's
	// rule, not redlease's. Told not to, the healthy masters keep serving
	// their own slots, as they must for this test to mean anything past
	// 15 s of pause.
	for _, srv := range clusterSrvs {
		admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
		err := admin.ConfigSet(ctx, "cluster-require-full-coverage", "no").Err()
		_ = admin.Close()
		require.NoError(t, err, "CONFIG SET on %s", srv.Addr)
	}
	proxy := redistest.NewGate(t, quorumSrvs[0].Addr) // the quorum node to black-hole
	clusterVictim := clusterSrvs[0]

	// The clients, default options all, and a call counter on each client
	// of a node that falls sick.
	var singleCalls, quorumVictimCalls, clusterVictimCalls callCounter
	singleClient := redis.NewClient(&redis.Options{Addr: singleSrv.Addr})
	singleClient.AddHook(&singleCalls)
	var quorumClients []redis.UniversalClient
	for i, srv := range quorumSrvs {
		if i == 0 {
			c := redis.NewClient(&redis.Options{Addr: proxy.Addr})
			c.AddHook(&quorumVictimCalls)
			quorumClients = append(quorumClients, c)
			continue
		}
		quorumClients = append(quorumClients, redis.NewClient(&redis.Options{Addr: srv.Addr}))
	}
	addrs := make([]string, len(clusterSrvs))
	for i, srv := range clusterSrvs {
		addrs[i] = srv.Addr
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	cc.OnNewNode(func(c *redis.Client) {
		if c.Options().Addr == clusterVictim.Addr {
			c.AddHook(&clusterVictimCalls)
		}
	})

	// Quorum's node timeout bounds the healthy nodes' rounds: under -race on
	// two busy cores a wake-up can wait tens of milliseconds (CPU
	// starvation is issue 12's item 5, not this test's business).
	q, err := quorum.New(quorumClients, quorum.WithNodeTimeout(500*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() }) // after the clients are closed: no worker waits out a ReadTimeout
	t.Cleanup(func() {
		_ = cc.Close()
		_ = singleClient.Close()
		for _, c := range quorumClients {
			_ = c.Close()
		}
	})
	w, err := renew.New()
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	t.Cleanup(singleSrv.Resume) // these run first: nothing stays stopped, whatever fails
	t.Cleanup(clusterVictim.Resume)

	// The locks: lock i belongs to groups[i%3], so that every strategy's
	// locks are taken at scattered moments and fall into many batches.
	const canaryKey = "mx:single:long"
	groups := []*mixedGroup{{name: "single"}, {name: "quorum"}, {name: "cluster"}}
	sg, qg, cg := groups[0], groups[1], groups[2]
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("mx:%s:%d", groups[i%3].name, i)
	}
	base := time.Now()
	for i, g := range groups {
		g.base = base
		g.lost = map[string]*atomic.Int64{}
		for k := i; k < n; k += 3 {
			g.lost[keys[k]] = new(atomic.Int64)
		}
	}
	sg.lost[canaryKey] = new(atomic.Int64)
	strategy, err := single.New(singleClient)
	require.NoError(t, err)
	strategy2, err := single.New(cc)
	require.NoError(t, err)
	strategies := []redlease.Strategy{strategy, q, strategy2}
	for i, g := range groups {
		g.locker, err = redlease.New(strategies[i], redlease.WithTTL(ttl), redlease.WithObserver(g))
		require.NoError(t, err)
	}

	// Take the locks and keep them. Lost is asked once per lock: that arms
	// the lock's own timer, which reports it lost at Until minus the loss
	// margin if no renewal comes first.
	locks := make([]*redlease.Lock, n)
	// How late this process runs its timers, and how long the healthy
	// nodes take to answer a PING, from before the first lock to the
	// verdict: what excuses a healthy lock's loss, whenever it came (one
	// came 1 s before the faults at load 20, when the stall probe started
	// only at the faults and had measured nothing of its stretch).
	probe := redistest.StartStallProbe(t)
	defer probe.Stop()
	var healthyAddrs []string
	for _, srv := range quorumSrvs[1:] {
		healthyAddrs = append(healthyAddrs, srv.Addr)
	}
	for _, srv := range clusterSrvs {
		if srv != clusterVictim {
			healthyAddrs = append(healthyAddrs, srv.Addr)
		}
	}
	nodes := startNodeProbe(t, healthyAddrs...)
	takeStart := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				lk, err := groups[i%3].locker.Lock(ctx, keys[i], redlease.WithMaxAttempts(5))
				if !assert.NoError(t, err, "lock %s", keys[i]) {
					return
				}
				lk.Lost()
				w.Keep(lk)
				locks[i] = lk
			}
		})
	}
	wg.Wait()
	require.False(t, t.Failed(), "every lock must be taken")
	taken := time.Since(takeStart)
	holdStart := time.Now()
	holdEnd := holdStart.Add(hold)

	// Which locks fall sick: every single lock, and the Cluster locks whose
	// master is the one to be paused.
	var sick, healthy []*mixedLock
	perMaster := map[string]int{}
	for i, lk := range locks {
		m := &mixedLock{lk: lk, group: groups[i%3], key: keys[i]}
		switch m.group {
		case sg:
			m.sick = true
		case cg:
			node, err := cc.MasterForKey(ctx, m.key)
			require.NoError(t, err)
			addr := node.Options().Addr
			perMaster[addr]++
			m.sick = addr == clusterVictim.Addr
			m.nodes, m.need = []string{addr}, 1
		case qg:
			m.nodes, m.need = healthyAddrs[:len(quorumSrvs)-1], len(quorumSrvs)/2+1
		}
		m.group.total++
		if m.sick {
			m.group.sick++
			sick = append(sick, m)
		} else {
			healthy = append(healthy, m)
		}
	}
	for _, srv := range clusterSrvs {
		require.Positive(t, perMaster[srv.Addr], "Cluster locks on master %s", srv.Addr)
	}
	t.Logf("%d locks taken in %v (TTL %v): single %d, quorum/5 %d, Cluster %d (per master %v; %s is the one to pause)",
		n, taken.Round(time.Millisecond), ttl, sg.total, qg.total, cg.total, perMaster, clusterVictim.Addr)

	// The long lock: one more lock on the single node, with a TTL that
	// outlasts the run, handed to the Watchdog only shortly before Close.
	// Its renewal is then a call to the paused node that go-redis holds for
	// its ReadTimeout: Close is sure to meet a call in flight. Its own timer
	// reports it lost after Close.
	canaryTTL := time.Duration(float64(time.Until(holdEnd)+1200*time.Millisecond) / 0.89)
	canary, err := sg.locker.Lock(ctx, canaryKey, redlease.WithTTL(canaryTTL), redlease.WithMaxAttempts(5))
	require.NoError(t, err)
	canary.Lost()
	sick = append(sick, &mixedLock{lk: canary, group: sg, key: canaryKey, sick: true})
	sg.total++
	sg.sick++

	// The hold. A quarter of the way in, a census of the quorum keys (which
	// nodes hold a copy), then the faults; until the end, the goroutines,
	// sampled.
	sleepUntil(holdStart.Add(faultAt))
	copies := quorumCensus(t, quorumSrvs, healthy, qg)
	grBefore := countGoroutines()
	faultTime := time.Now()
	singleSrv.Pause()
	proxy.BlackHole()
	clusterVictim.Pause()
	grPeak := grBefore
	heldLate := 0
	for range int(hold/(100*time.Millisecond)) + 1 { // bounded: the loop ends at holdEnd−500ms at the latest
		if time.Until(holdEnd) <= 500*time.Millisecond {
			break
		}
		time.Sleep(min(100*time.Millisecond, time.Until(holdEnd)-500*time.Millisecond))
		grPeak = grPeak.max(countGoroutines())
		// The safety half, which no scheduling excuses: a sick lock is
		// never reported held once its deadline (Until less the loss
		// margin) has passed. The time is read before Valid and the
		// deadline after it (an extension only moves it later).
		for _, m := range sick {
			before := time.Now()
			if m.lk.Valid() && !before.Before(m.lk.Deadline()) {
				if heldLate++; heldLate <= 5 {
					t.Errorf("%s lock %s reported valid %v after its deadline", m.group.name, m.key, before.Sub(m.lk.Deadline()))
				}
			}
		}
	}
	assert.Zero(t, heldLate, "sick locks reported valid past their deadline")
	w.Keep(canary)
	sleepUntil(holdEnd)

	// The verdict on the healthy locks, at the end of the hold.
	lostHealthy, excusedHealthy := 0, 0
	for _, m := range healthy {
		at, lost := m.group.lostAt(m.key)
		if m.lk.Valid() && !lost {
			continue
		}
		if ok, why := healthyLossOn(probe, nodes, m.lk, m.nodes, m.need); ok {
			if excusedHealthy++; excusedHealthy <= 3 {
				t.Logf("healthy %s lock %s lost %v after the fault, excused: %s", m.group.name, m.key, at.Sub(faultTime).Round(time.Millisecond), why)
			}
			continue
		}
		lostHealthy++
		if lostHealthy <= 5 {
			where := ""
			if m.group == qg {
				where = fmt.Sprintf(" (before the fault its key was on quorum nodes %v; node 0 is the black-holed one)", copies[m.key])
			}
			_, why := healthyLossOn(probe, nodes, m.lk, m.nodes, m.need)
			t.Errorf("healthy %s lock %s lost %v after the fault%s: %s", m.group.name, m.key, at.Sub(faultTime).Round(time.Millisecond), where, why)
		}
	}
	assert.Zero(t, lostHealthy, "healthy locks lost (of %d) without a measured stall that excuses it (%d excused)", len(healthy), excusedHealthy)
	if excusedHealthy > 0 {
		t.Logf("%d healthy locks lost during a measured stall of this process (excused)", excusedHealthy)
	}

	// Close, with a call to the paused single node in flight.
	inflight := [3]int64{singleCalls.inflight.Load(), clusterVictimCalls.inflight.Load(), quorumVictimCalls.inflight.Load()}
	kept := w.Len()
	stopStart := time.Now()
	w.Close()
	stopTook := time.Since(stopStart)
	grAfterClose := countGoroutines()
	assert.Positive(t, inflight[0], "a renewal call to the paused single node is in flight when Close is called (the long lock's)")
	assertClosedInTime(t, probe, stopStart, stopTook)

	// The verdict on the sick locks: every one reported lost, before its
	// Until.
	select {
	case <-canary.Lost():
	case <-time.After(time.Until(canary.Until()) + time.Second):
	}
	notLost, starvedLosses := 0, 0
	var worstOverrun time.Duration
	var leads, afterFault []time.Duration // per lock: Until − loss, loss − fault
	for _, m := range sick {
		closed := false
		select {
		case <-m.lk.Lost():
			closed = true
		default:
		}
		at, lost := m.group.lostAt(m.key)
		// The Observer hears of a loss just after Lost closes (a slow
		// Observer must not hold the notice back): give it a moment.
		for end := time.Now().Add(time.Second); closed && !lost && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
			at, lost = m.group.lostAt(m.key)
		}
		if !lost || !closed {
			notLost++
			if notLost <= 5 {
				t.Errorf("%s lock %s on a sick node never reported lost (Lost closed %v, valid %v, Until %v after the fault)",
					m.group.name, m.key, closed, m.lk.Valid(), m.lk.Until().Sub(faultTime).Round(time.Millisecond))
			}
			continue
		}
		assert.ErrorIs(t, m.lk.Err(), redlease.ErrLost, "%s lock %s", m.group.name, m.key)
		lead := m.lk.Until().Sub(at)
		if lead <= 0 {
			// Lost closes from a timer set for the lock's deadline, a loss
			// margin before Until: it can close after Until only if this
			// process could not run a timer for longer than that, which no
			// code in it can help (the documented limit). Excused only when
			// the probe measured a stall at least as long as the overrun
			// between the deadline and the report; an expiry timer set
			// late, or an Until moved after the loss, is not.
			stall := probe.Worst(m.lk.Deadline(), at)
			if stall < -lead {
				t.Errorf("%s lock %s on a sick node reported lost %v after its Until, while this process's timers were at most %v late between its deadline and then: %v",
					m.group.name, m.key, -lead, stall, m.lk.Err())
			} else {
				starvedLosses++
				worstOverrun = max(worstOverrun, -lead)
			}
		}
		leads, afterFault = append(leads, lead), append(afterFault, at.Sub(faultTime))
		if *mixedEach {
			t.Logf("  %s %s: lost %v after the fault, %v before its Until", m.group.name, m.key, at.Sub(faultTime).Round(time.Millisecond), lead.Round(time.Millisecond))
		}
	}
	assert.Zero(t, notLost, "sick locks not reported lost (of %d)", len(sick))

	// The figures.
	t.Logf("faults at %s, %v into a %v hold: single node %s paused, quorum node 0 %s black-holed behind %s, Cluster master %s paused",
		faultTime.Format("15:04:05.000"), faultAt, hold, singleSrv.Addr, quorumSrvs[0].Addr, proxy.Addr, clusterVictim.Addr)
	t.Logf("quorum keys before the fault: %s", copiesSummary(copies))
	for _, g := range groups {
		lostSick, lostAll := 0, g.lostCount()
		for _, m := range sick {
			if _, ok := m.group.lostAt(m.key); ok && m.group == g {
				lostSick++
			}
		}
		t.Logf("%-7s %5d locks, %5d on a sick node; losses: %d sick, %d healthy; renewals that failed: %d, the first: %q",
			g.name, g.total, g.sick, lostSick, lostAll-lostSick, g.renewFailed.Load(), g.firstFailures())
	}
	t.Logf("sick locks' loss before their Until: %s", spread(leads))
	t.Logf("sick locks' loss after the fault:    %s", spread(afterFault))
	wakes, worstWake := probe.Summary()
	t.Logf("timers of this process from the first lock on: %d probe wakes, the latest %v late; sick locks reported lost after their Until during a measured stall at least as long: %d (at worst %v after)",
		wakes, worstWake.Round(time.Millisecond), starvedLosses, worstOverrun.Round(time.Millisecond))
	t.Logf("calls to the sick nodes (go-redis, started/failed/in flight at Close): single node %d/%d/%d, Cluster master %d/%d/%d, black-holed quorum node %d/%d/%d",
		singleCalls.calls.Load(), singleCalls.failed.Load(), inflight[0],
		clusterVictimCalls.calls.Load(), clusterVictimCalls.failed.Load(), inflight[1],
		quorumVictimCalls.calls.Load(), quorumVictimCalls.failed.Load(), inflight[2])
	t.Logf("Close returned after %v (renewal timeout %v), %d locks still kept", stopTook.Round(time.Millisecond), renew.DefaultTimeout, kept)
	t.Logf("goroutines (%s): %v before the faults, at most %v during, %v after Close", goroutineClasses, grBefore, grPeak, grAfterClose)
	// Calls to sick nodes are capped per strategy, per node and per Cluster
	// master: what the faults add must not grow with the locks. Not counted:
	// the proxy's goroutines (a black-holed link keeps its own until healed)
	// and the locks' expiry timers (time.AfterFunc runs each on a goroutine
	// of its own for a moment: thousands, when thousands of sick locks expire
	// together).
	assert.LessOrEqual(t, grPeak.rest, grBefore.rest+100, "goroutines must not grow with the locks kept")
}

// quorumCensus returns, for every healthy quorum lock's key, the nodes
// that hold a copy of it (asked directly, not through the proxy).
func quorumCensus(t *testing.T, servers []*redistest.Server, healthy []*mixedLock, qg *mixedGroup) map[string][]int {
	t.Helper()
	var keys []string
	for _, m := range healthy {
		if m.group == qg {
			keys = append(keys, m.key)
		}
	}
	copies := make(map[string][]int, len(keys))
	for i, srv := range servers {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		pipe := c.Pipeline()
		cmds := make([]*redis.IntCmd, len(keys))
		for k, key := range keys {
			cmds[k] = pipe.Exists(t.Context(), key)
		}
		_, err := pipe.Exec(t.Context())
		_ = c.Close()
		require.NoError(t, err, "census on quorum node %d", i)
		for k, key := range keys {
			if cmds[k].Val() == 1 {
				copies[key] = append(copies[key], i)
			}
		}
	}
	return copies
}

// copiesSummary counts the quorum keys by their number of copies, those
// missing per node, and those held by a bare quorum (3) that includes
// node 0, the one to be black-holed.
func copiesSummary(copies map[string][]int) string {
	byCount := map[int]int{}
	missing := make([]int, 5)
	bare := 0
	for _, nodes := range copies {
		byCount[len(nodes)]++
		for i := range missing {
			if !slices.Contains(nodes, i) {
				missing[i]++
			}
		}
		if len(nodes) == 3 && slices.Contains(nodes, 0) {
			bare++
		}
	}
	return fmt.Sprintf("%d keys; by number of copies %v; missing per node %v; on exactly 3 nodes, node 0 one of them: %d",
		len(copies), byCount, missing, bare)
}

// mixedGroup is one strategy's share of the locks, and the Observer of its
// Locker: it records when each of its locks was lost (Held is called under
// the lock's mutex, when Lost is about to close; lock-free, so that
// thousands of locks expiring together do not queue on the test) and counts
// failed renewals.
type mixedGroup struct {
	name        string
	locker      *redlease.Locker
	total, sick int
	base        time.Time
	lost        map[string]*atomic.Int64 // by key: 1 + nanoseconds from base to the loss; read-only once built
	renewFailed atomic.Int64
	mu          sync.Mutex
	failures    []string // the first few failed renewals
}

type mixedLock struct {
	lk    *redlease.Lock
	group *mixedGroup
	key   string
	sick  bool
	// nodes are the healthy nodes a healthy lock's renewal needs need of
	// (its Cluster master; the quorum's nodes but the black-holed one).
	nodes []string
	need  int
}

var _ redlease.Observer = (*mixedGroup)(nil)

func noop(error) {}

// Start counts failed renewals.
func (g *mixedGroup) Start(ctx context.Context, op redlease.Op) (context.Context, func(error)) {
	if op.Name != "extend" {
		return ctx, noop
	}
	return ctx, func(err error) {
		if err != nil && g.renewFailed.Add(1) <= 3 {
			at := time.Now().Format("15:04:05.000")
			g.mu.Lock()
			g.failures = append(g.failures, fmt.Sprintf("%s at %s: %v", op.Key, at, err))
			g.mu.Unlock()
		}
	}
}

// Held records a loss (nil: a release, which this test does not make).
func (g *mixedGroup) Held(op redlease.Op, _ time.Duration, lost error) {
	if lost == nil {
		return
	}
	if at := g.lost[op.Key]; at != nil {
		at.CompareAndSwap(0, int64(time.Since(g.base))+1)
	}
}

// NodeFailed is not needed here.
func (g *mixedGroup) NodeFailed(context.Context, redlease.Op, *redlease.NodeError) {}

func (g *mixedGroup) lostAt(key string) (time.Time, bool) {
	at := g.lost[key]
	if at == nil || at.Load() == 0 {
		return time.Time{}, false
	}
	return g.base.Add(time.Duration(at.Load() - 1)), true
}

func (g *mixedGroup) lostCount() int {
	k := 0
	for _, at := range g.lost {
		if at.Load() != 0 {
			k++
		}
	}
	return k
}

func (g *mixedGroup) firstFailures() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.failures)
}

// callCounter is a go-redis hook that counts the commands and pipelines a
// client sends (each once), those in flight, and those that failed other
// than with an error reply (a timeout, a closed connection).
type callCounter struct {
	calls, failed, inflight atomic.Int64
}

// counted marks a context whose call is already counted: go-redis runs
// nested calls (a new connection's handshake) through the hooks again.
type counted struct{}

func (c *callCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *callCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return c.track(ctx, func(ctx context.Context) error { return next(ctx, cmd) })
	}
}

func (c *callCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return c.track(ctx, func(ctx context.Context) error { return next(ctx, cmds) })
	}
}

func (c *callCounter) track(ctx context.Context, call func(context.Context) error) error {
	if ctx.Value(counted{}) != nil {
		return call(ctx)
	}
	ctx = context.WithValue(ctx, counted{}, true)
	c.calls.Add(1)
	c.inflight.Add(1)
	defer c.inflight.Add(-1)
	err := call(ctx)
	var reply redis.Error
	if err != nil && !errors.As(err, &reply) {
		c.failed.Add(1)
	}
	return err
}

// goroutineCount is the number of goroutines by class.
type goroutineCount struct {
	all, proxy, timers, rest int
}

const goroutineClasses = "all/proxy/timers/rest"

func (a goroutineCount) max(b goroutineCount) goroutineCount {
	return goroutineCount{max(a.all, b.all), max(a.proxy, b.proxy), max(a.timers, b.timers), max(a.rest, b.rest)}
}

func (a goroutineCount) String() string {
	return fmt.Sprintf("%d/%d/%d/%d", a.all, a.proxy, a.timers, a.rest)
}

// goroutineStacks returns the stack of every goroutine, one string each.
func goroutineStacks() []string {
	buf := make([]byte, 1<<20)
	for range 6 { // up to 64 MiB of stacks
		if k := runtime.Stack(buf, true); k < len(buf) {
			buf = buf[:k]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return strings.Split(string(buf), "\n\n")
}

// countGoroutines counts the goroutines: the in-process proxy's, those
// time.AfterFunc started (the locks' expiry timers), and the rest.
func countGoroutines() goroutineCount {
	var c goroutineCount
	for _, g := range goroutineStacks() {
		if !strings.HasPrefix(g, "goroutine ") {
			continue
		}
		c.all++
		switch {
		case strings.Contains(g, "internal/redistest.(*Gate)"):
			c.proxy++
		case strings.Contains(g, "created by time.goFunc"):
			c.timers++
		default:
			c.rest++
		}
	}
	return c
}

func sleepUntil(at time.Time) {
	if d := time.Until(at); d > 0 {
		time.Sleep(d)
	}
}

// spread summarises durations: count, min, median, 99th percentile, max.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("%d locks: min %v, median %v, p99 %v, max %v",
		len(s), r(s[0]), r(s[len(s)/2]), r(s[len(s)*99/100]), r(s[len(s)-1]))
}
