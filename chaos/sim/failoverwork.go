package sim

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/renew"
)

// Fault kinds of the failover scenario.
const (
	// FaultFailover: Sentinel promotes the replica. Mode "crash": the
	// primary is killed at At, promoted after Amount (down-after), and
	// comes back empty For after the promotion as a replica of the new
	// primary; "switch": the primary is not killed (promoted at once,
	// demoted to a replica For later; meanwhile it serves, and WAIT there
	// answers 0). "+stale": the promoted replica is one that lost its
	// last 20-200 ms of replication (acknowledged writes lost): OUTSIDE.
	FaultFailover = "failover"
	FaultReplSlow = "repl-slow" // the replication link slows
	FaultReplHole = "repl-hole" // the replication link holds everything (both ways) until it ends
	FaultReplCut  = "repl-cut"  // the replication link is cut: in flight lost, resync after For
	// FaultSentinelHung: a Sentinel accepts connections and commands and
	// never answers (a paused process), until the run ends.
	FaultSentinelHung  = "sentinel-hung"
	FaultSentinelDown  = "sentinel-down"  // a Sentinel is down (refuses connections) for For
	FaultSentinelLossy = "sentinel-lossy" // a Sentinel's links lose messages with Prob for For
	// FaultFailback: Sentinel moves the primary back (an operator's
	// SENTINEL FAILOVER once the old primary has rejoined as a replica and
	// resynchronised): at At the old primary, a replica of the failover's
	// promoted node since the failover's For, is promoted (config epoch
	// 3); the node it replaces serves on, WAIT there answering 0, until it
	// rejoins as its replica For later and its client connections close.
	FaultFailback = "failback"
	// FaultSentinelMute: every +switch-master a Sentinel announces from
	// At for For is lost on its way to every subscriber (pub/sub delivers
	// at most once; the subscriptions stay confirmed). Sentinels still
	// answer questions.
	FaultSentinelMute = "sentinel-mute"
)

// failoverNodes: the primary, its replica, then the Sentinels.
const (
	fPrimary   = 0
	fReplica   = 1
	fSentinel0 = 2
)

// failoverClientAddr is the address a redis.NewFailoverClient reports
// (its Options().Addr), whatever master it follows.
const failoverClientAddr = "FailoverClient"

// failoverName is node i's address in the failover scenario.
func failoverName(i int) string {
	if i < fSentinel0 {
		return net.JoinHostPort("127.0.0.1", strconv.Itoa(6379+i))
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(26379+i-fSentinel0))
}

// setupFailover makes the primary, its replica and the Sentinels (and,
// with Idem, the plain store node after them).
func (w *World) setupFailover() {
	for i := range w.sc.Nodes {
		w.nodes = append(w.nodes, newNode(w, i, failoverName(i)))
	}
	for i := range w.sc.Sentinels {
		id := w.sc.Nodes + i
		w.nodes = append(w.nodes, newSentinel(w, id, failoverName(id), failoverName(fPrimary), failoverName(fReplica)))
	}
	if w.sc.plainStore() > 0 {
		id := w.sc.storeNode()
		w.nodes = append(w.nodes, newNode(w, id, net.JoinHostPort("127.0.0.1", "7379")))
	}
	if w.sc.secondMaster() > 0 {
		p2 := w.sc.primary2()
		w.nodes = append(w.nodes, newNode(w, p2, net.JoinHostPort("127.0.0.1", "6479")), newNode(w, p2+1, net.JoinHostPort("127.0.0.1", "6480")))
		w.nodes[p2+1].follow(w.nodes[p2])
	}
	w.nodes[fReplica].follow(w.nodes[fPrimary])
	w.grants = map[string]grantRec{}
	w.closing = map[int]bool{}
}

// byName finds a node by address.
func (w *World) byName(addr string) *Node {
	for _, n := range w.nodes {
		if n.name == addr {
			return n
		}
	}
	return nil
}

// dialer is client ci's Dialer: it reaches nodes and Sentinels by address.
func (w *World) dialer(ci int) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(_ context.Context, _, addr string) (net.Conn, error) {
		n := w.byName(addr)
		if n == nil {
			return nil, fmt.Errorf("dial %s: no such simulated host", addr)
		}
		c, err := n.dial(ci)
		w.mu.Lock()
		closing := w.closing[ci]
		w.mu.Unlock()
		if err == nil && closing {
			c.cut() // see failoverClient's closer
		}
		return c, err
	}
}

// primaryDialer dials the primary as Sentinel prefer names it (or, while
// that one is down or hung, the next one that is up), read from the
// Sentinel's state without a round trip. It stands in for
// redis.NewFailoverClient, which holds a sync.Once and its mutex across
// its network calls to the Sentinels: a goroutine waiting on them is not
// durably blocked, so the bubble's clock stops and the run hangs (seen on
// the first seed). What the failover client does on +switch-master,
// closing its connections to the old primary, the simulator does when the
// old primary is demoted (failoverActions).
func (w *World) primaryDialer(ci, prefer int) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(_ context.Context, _, _ string) (net.Conn, error) {
		k := w.sc.Sentinels
		for i := range k {
			sn := w.nodes[fSentinel0+(prefer+i)%k]
			sn.mu.Lock()
			ok, addr := !sn.down && !sn.paused, sn.sent.addr
			sn.mu.Unlock()
			if !ok {
				continue
			}
			n := w.byName(addr)
			if n == nil {
				return nil, fmt.Errorf("dial %s: no such simulated host", addr)
			}
			return n.dial(ci)
		}
		return nil, fmt.Errorf("dial %s: no Sentinel answered", masterName)
	}
}

func (w *World) sentinelAddrs() []string {
	var as []string
	for _, n := range w.nodes {
		if n.sent != nil {
			as = append(as, n.name)
		}
	}
	return as
}

// noteGrant records which node granted an acquisition (by token): the
// watcher invariant checks the old primary's grants. The token is
// Acquire's ARGV[1], read by the key count the line declares (Acquire has
// four keys since fair mode gave it the line's). Called with n.mu held.
func (w *World) noteGrant(n *Node, args []string, reply []byte) {
	if n.sent != nil || len(reply) < 3 || reply[0] != ':' || reply[1] == '-' {
		return
	}
	sha, _, argv, ok := scriptLine(args)
	if !ok || sha != script.Acquire.Hash() || len(argv) == 0 {
		return
	}
	// The last node to grant a token is the one whose reply the client
	// took: go-redis retries a pipeline whose reply a cut connection lost
	// on a new connection, which may reach the new primary (failover seed
	// 2393: granted by the old primary, WAIT 0, cut at the demotion,
	// granted again by the new one).
	w.mu.Lock()
	w.grants[argv[0]] = grantRec{node: n.id, at: time.Since(w.start)}
	w.mu.Unlock()
}

// grantRec is the last grant of a token: the node and when (virtual time).
type grantRec struct {
	node int
	at   time.Duration
}

// watchInfo is one client's Watcher, for the watcher invariant.
type watchInfo struct {
	poll time.Duration
}

// failoverClient is one failover workload client: a go-redis client to
// the primary (its Dialer dials the primary as a Sentinel names it, see
// primaryDialer), the failover strategy on it, a Watcher over every
// Sentinel (watchedStrategy), and then either the lockClient workload
// (even clients) or the doClient workload with a renew.Watchdog (odd;
// beside it, in a seed with a failback, the long lane: longLane).
func (w *World) failoverClient(ci int, r *rand.Rand) {
	ct := r.IntN(2) == 0
	w.noteCTE(ci, ct)
	prefer := r.IntN(w.sc.Sentinels)
	poll := []time.Duration{100 * time.Millisecond, 150 * time.Millisecond, 250 * time.Millisecond}[r.IntN(3)]
	s, err := w.watchedStrategy(ci, ct, prefer, poll)
	if err != nil {
		w.hist.failed()
		w.hist.logf("c%d failover.NewWatcher: %v", ci, short(err))
		return
	}
	if w.ops != nil {
		w.opsClient(ci, r, s)
		return
	}
	if ci%2 == 0 {
		w.lockClient(ci, must(redlease.New(s, redlease.WithPolling(), redlease.WithObserver(stateObserver{w, ci}))), r)
		return
	}
	wd, err := renew.New()
	if err != nil {
		panic(fmt.Sprintf("sim: renew.New: %v", err)) // a bug in the scenario table
	}
	w.onClose(ci, func() { wd.Close() })
	lk := must(redlease.New(s, redlease.WithKeeper(wd), redlease.WithPolling(), redlease.WithObserver(stateObserver{w, ci})))
	var long sync.WaitGroup
	long.Go(func() { w.longLane(ci, lk, poll) })
	w.doClient(ci, []doLocker{{name: "k", locker: lk}})
	long.Wait()
}

// longLane is an odd failover client's second lane in a seed with a
// failback: from the start of the run until just after failover-kept's
// bound for the failback on its client, it holds a key of its own (L1,
// L3: nobody else takes it) with Locker.Do at the scenario's longest TTL,
// kept by the client's watchdog, and takes it again whenever it was lost
// or revoked. So a hold the first primary granted is alive at the
// failover and one granted before the failback is alive at the failback
// (unless renewals failed for a TTL), whatever the other lanes' holds
// were doing then: the other lanes' holds seldom outlive the bound after
// two moves. In a seed without a failback it does nothing.
func (w *World) longLane(ci int, locker *redlease.Locker, poll time.Duration) {
	m := w.lastMove()
	if m == nil || m.Kind != FaultFailback {
		return
	}
	s, _ := w.firstHealthy(*m)
	if s < 0 {
		s = moveAt(*m) + maxSentinelLag // no bound to check: hold as long
	}
	end := s + watchBound(poll) + longStep
	r := rand.New(rand.NewPCG(w.seed, uint64(ci+1)<<8|0x80)) // apart from doClient's lanes
	// A microsecond after the client's other lane starts: the two share
	// one go-redis client, and two Lock calls leaving at one instant take
	// its pooled connections (or dial) in the Go scheduler's order.
	sleep(time.Microsecond)
	key, ttl := fmt.Sprintf("L%d", ci), w.sc.TTL[1]
	dl := doLocker{name: "L", locker: locker}
	for seq := 100; seq < 120 && w.hist.now() < end; seq++ {
		ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), ci, jitLong, seq), end-w.hist.now()+time.Second)
		ran := false
		var fnRet time.Duration
		var strat redlease.Strategy
		err := locker.Do(ctx, key, func(fctx context.Context, lk *redlease.Lock) error {
			ran = true
			var pauses []time.Duration
			for d := end - w.hist.now(); d > 0; d -= longStep {
				pauses = append(pauses, min(d, longStep))
			}
			w.doHold(ci, seq, key, dl, lk, fctx, pauses, ttl)
			fnRet, strat = w.hist.now(), lk.Strategy()
			return nil
		}, redlease.WithTTL(ttl), retryAtOnce(), redlease.WithMaxAttempts(3))
		cancel()
		if !ran {
			w.hist.failed()
		} else {
			w.checkDo(ci, seq, key, strat, ttl, fnRet, false)
		}
		w.hist.logf("c%d#%d do %s ttl=%v: %v", ci, seq, key, ttl, short(err))
		sleep(ms(r, 1, 30))
	}
}

// longStep is how often the long lane's hold checks Valid and writes.
const longStep = 25 * time.Millisecond

// watchedStrategy builds client ci's failover strategy on a go-redis
// client to the primary (ContextTimeoutEnabled ct, dialling the primary
// as Sentinel prefer names it) and starts its Watcher over every
// Sentinel, polling every poll; the Watcher and the clients close when
// the run ends.
func (w *World) watchedStrategy(ci int, ct bool, prefer int, poll time.Duration) (*failover.Strategy, error) {
	backoff := w.retryBackoff(ci, 1<<16) // the primary, whichever node it is
	addr := masterName
	if w.sc.Idem == IdemMasters {
		addr = failoverClientAddr
	}
	fc := redis.NewClient(&redis.Options{
		Addr:                     addr,
		Dialer:                   w.primaryDialer(ci, prefer),
		ContextTimeoutEnabled:    ct,
		DisableIdentity:          true,
		MinRetryBackoff:          backoff, // see redisClient
		MaxRetryBackoff:          backoff,
		DialerRetryTimeout:       w.dialRetry(ci, 1<<16),
		Protocol:                 2,
		ReadBufferSize:           1024,
		WriteBufferSize:          1024,
		PipelineReadBufferSize:   1024,
		PipelineWriteBufferSize:  1024,
		PoolSize:                 64,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	fc.AddHook(w.orderHookFor(ci, 1<<16))
	w.mu.Lock()
	w.clients = append(w.clients, fc)
	w.mu.Unlock()
	opts := w.failoverOptions(ci)
	if w.sc.Idem == IdemMasters {
		opts = append(opts, failover.WithMaster(masterName))
	}
	s := must(failover.New(fc, opts...))
	var scs []*redis.SentinelClient
	for i, a := range w.sentinelAddrs() {
		sb := w.retryBackoff(ci, 1<<16|uint64(i+1))
		sc := redis.NewSentinelClient(&redis.Options{
			Addr: a, Dialer: w.dialer(ci), ContextTimeoutEnabled: true, DisableIdentity: true, Protocol: 2,
			MinRetryBackoff: sb, MaxRetryBackoff: sb, DialerRetryTimeout: w.dialRetry(ci, 1<<16|uint64(i+1)),
			ReadBufferSize: 1024, WriteBufferSize: 1024, PoolSize: 64,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		sc.AddHook(w.orderHookFor(ci, 1<<16|uint64(i+1)))
		scs = append(scs, sc)
	}
	closeSentinels := func() {
		for _, sc := range scs {
			_ = sc.Close()
		}
	}
	ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), ci, jitWatch, 0), 3*time.Second)
	wt, err := failover.NewWatcher(ctx, s, masterName, poll, scs...)
	cancel()
	if err != nil {
		w.onClose(ci, closeSentinels)
		return nil, err
	}
	w.onClose(ci, func() {
		// go-redis's PubSub.Close takes the mutex its Subscribe holds
		// while it waits for the Sentinel's HELLO reply: a goroutine
		// waiting on a mutex is not durably blocked, so the bubble's clock
		// would stop with the reply still to be delivered (seed 33 hung).
		// Cut this client's Sentinel connections first (no virtual time
		// passes), and hand its Watcher only dead connections from now on
		// (go-redis's PubSub reconnects under that mutex; a refused dial
		// would retry after a sleep): the read returns at once, the
		// reconnection fails at once, and the mutex is free.
		w.mu.Lock()
		w.closing[ci] = true
		w.mu.Unlock()
		for i := range w.sc.Sentinels {
			w.cut(fSentinel0+i, ci)
		}
		_ = wt.Close()
		closeSentinels()
	})
	w.mu.Lock()
	w.watchers[ci] = watchInfo{poll: poll}
	w.mu.Unlock()
	w.hist.logf("c%d watching %s at %s, poll %v", ci, masterName, wt.Primary(), poll)
	return s, nil
}

// makeFailoverFaults draws the failover scenario's own faults: one
// failover, replication-link faults around it, and Sentinel faults (at
// most one Sentinel hung, one down and one lossy, never all of them).
func makeFailoverFaults(r *rand.Rand, sc *Scenario, horizon time.Duration) []Fault {
	var fs []Fault
	at := 60*time.Millisecond + time.Duration(r.Int64N(int64(horizon*3/4)))
	f := Fault{At: at, Kind: FaultFailover, Node: fPrimary, Client: -1}
	if r.IntN(2) == 0 {
		f.Mode, f.Amount, f.For = "crash", ms(r, 30, 80), ms(r, 50, 300)
	} else {
		f.Mode, f.For = "switch", ms(r, 0, 100)
	}
	if r.IntN(8) == 0 {
		f.Mode += "+stale"
		f.Outside, f.Why = true, "the promoted replica lost writes it had acknowledged"
	}
	fs = append(fs, f)
	for range r.IntN(3) {
		g := Fault{At: max(0, at-ms(r, 0, 300)), Node: fPrimary, Client: -1}
		switch r.IntN(3) {
		case 0:
			g.Kind, g.For, g.Amount = FaultReplSlow, ms(r, 20, 300), ms(r, 5, 150)
		case 1:
			g.Kind, g.For = FaultReplHole, ms(r, 20, 300)
		default:
			g.Kind, g.For = FaultReplCut, ms(r, 5, 200)
		}
		fs = append(fs, g)
	}
	k := sc.Sentinels
	perm := r.Perm(k)
	used := 0
	if r.IntN(2) == 0 && used < k-1 { // the issue-12 case
		fs = append(fs, Fault{At: ms(r, 20, int(at/time.Millisecond)+20), Kind: FaultSentinelHung, Node: fSentinel0 + perm[used], Client: -1})
		used++
	}
	if r.IntN(4) == 0 && used < k-1 {
		fs = append(fs, Fault{At: max(0, at-ms(r, 0, 200)), Kind: FaultSentinelDown, Node: fSentinel0 + perm[used], Client: -1, For: ms(r, 20, 400)})
		used++
	}
	if r.IntN(4) == 0 && used < k-1 {
		fs = append(fs, Fault{At: max(0, at-ms(r, 0, 200)), Kind: FaultSentinelLossy, Node: fSentinel0 + perm[used], Client: -1, For: ms(r, 50, 400), Prob: 0.3 + 0.6*r.Float64()})
	}
	// Drawn last, so that the faults above are the ones the same seed drew
	// before failbacks existed: one seed in three (not after a stale
	// promotion) moves the primary back soon after the old one rejoined,
	// and in three of four of those every +switch-master of both moves is
	// lost, so that a Watcher whose polls fall outside the short time the
	// failover's node was primary sees only the first primary again, at a
	// higher config epoch.
	if !f.Outside && r.IntN(3) == 0 {
		b := Fault{At: promoteAt(f) + f.For + ms(r, 1, 40), Kind: FaultFailback, Node: fPrimary, Client: -1, For: ms(r, 0, 50)}
		fs = append(fs, b)
		if r.IntN(4) > 0 {
			fs = append(fs, Fault{At: promoteAt(f), Kind: FaultSentinelMute, Node: -1, Client: -1, For: b.At + maxSentinelLag + time.Millisecond - promoteAt(f)})
		}
	}
	return fs
}

// failoverEnd is when the failover scenario's moves are over: the old
// primary rejoined after the failover, or the other node after the
// failback.
func failoverEnd(fs []Fault) time.Duration {
	var end time.Duration
	for _, f := range fs {
		switch f.Kind {
		case FaultFailover:
			end = max(end, promoteAt(f)+f.For)
		case FaultFailback:
			end = max(end, f.At+f.For)
		}
	}
	return end
}

// muted reports whether a sentinel-mute fault loses the announcements
// Sentinels make now.
func (w *World) muted() bool {
	at := time.Since(w.start)
	for _, f := range w.faults {
		if f.Kind == FaultSentinelMute && at >= f.At && at < f.At+f.For {
			return true
		}
	}
	return false
}

// failoverActions are the timed steps of the failover scenario's own
// faults.
func (w *World) failoverActions(f Fault) []action {
	if w.sc.Strategy != Failover {
		return nil
	}
	old, rep := w.nodes[fPrimary], w.nodes[fReplica]
	switch f.Kind {
	case FaultReplCut:
		return []action{{f.At, f.String(), old.cutRepl}, {f.At + f.For, "repl-reconnect", old.resync}}
	case FaultSentinelHung:
		n := w.nodes[f.Node]
		return []action{{f.At, f.String(), n.pause}}
	case FaultSentinelDown:
		n := w.nodes[f.Node]
		return []action{{f.At, f.String(), n.crash}, {f.At + f.For, fmt.Sprintf("up sentinel node=%d", f.Node), n.sentinelUp}}
	case FaultFailback:
		return w.failbackActions(f)
	case FaultSentinelMute:
		return []action{{f.At, f.String(), func() {}}}
	case FaultFailover:
	default:
		return nil
	}
	var as []action
	promoteAt := f.At + f.Amount
	crash := strings.HasPrefix(f.Mode, "crash")
	if strings.HasSuffix(f.Mode, "+stale") {
		back := time.Duration(20+mix(w.seed, 0x57a1e)%180) * time.Millisecond
		as = append(as, action{max(0, promoteAt-back), fmt.Sprintf("snapshot replica (stale by %v)", back), rep.takeSnapshot})
	}
	if crash {
		as = append(as, action{f.At, f.String(), old.crash})
	}
	as = append(as, action{promoteAt, "promote " + rep.name, func() {
		if strings.HasSuffix(f.Mode, "+stale") {
			rep.mu.Lock()
			rep.m.SetTime(rep.clockLocked())
			rep.m.FlushAll()
			restore(rep.m, rep.snapshot, rep.clockLocked())
			rep.mu.Unlock()
		}
		rep.promote()
	}})
	leader := int(mix(w.seed, 0x1ead) % uint64(w.sc.Sentinels))
	for i := range w.sc.Sentinels {
		sn := w.nodes[fSentinel0+i]
		lag := sentinelLag(w.seed, (i-leader+w.sc.Sentinels)%w.sc.Sentinels)
		as = append(as, action{promoteAt + lag, fmt.Sprintf("sentinel node=%d switches to %s", sn.id, rep.name), func() {
			sn.switchMaster(sentinelSwitch{from: old.name, to: rep.name, replica: old.name, epoch: 2})
		}})
	}
	as = append(as, action{promoteAt + f.For, "old primary " + old.name + " rejoins as a replica", func() {
		if crash {
			old.restart(false, false)
		}
		old.follow(rep)
		if !crash {
			w.cutFault(old.id, -1) // the clients' failover clients drop their connections to it
		}
	}})
	return as
}

// failbackActions are the steps of a failback f: the old primary, a
// replica of the failover's promoted node since it rejoined, is promoted
// (config epoch 3); each Sentinel adopts the configuration that names it
// (the failback's leader at once, the others after their own lag, which
// may come before they adopted the failover's: then they skip epoch 2);
// the node it replaced serves on, WAIT there answering 0, until it
// rejoins as the new primary's replica For later and its client
// connections close.
func (w *World) failbackActions(f Fault) []action {
	old, rep := w.nodes[fPrimary], w.nodes[fReplica]
	as := []action{{f.At, f.String() + ": promote " + old.name, old.promote}}
	leader := int(mix(w.seed, 0x1ead3) % uint64(w.sc.Sentinels))
	for i := range w.sc.Sentinels {
		sn := w.nodes[fSentinel0+i]
		lag := failbackLag(w.seed, (i-leader+w.sc.Sentinels)%w.sc.Sentinels)
		as = append(as, action{f.At + lag, fmt.Sprintf("sentinel node=%d switches back to %s", sn.id, old.name), func() {
			sn.switchMaster(sentinelSwitch{from: rep.name, to: old.name, replica: rep.name, epoch: 3})
		}})
	}
	as = append(as, action{f.At + f.For, rep.name + " rejoins as a replica", func() {
		rep.follow(old)
		w.cutFault(rep.id, -1) // the clients' failover clients drop their connections to it
	}})
	return as
}

// failbackAt is when Sentinel id adopts the failback f's configuration.
func (w *World) failbackAt(f Fault, id int) time.Duration {
	leader := int(mix(w.seed, 0x1ead3) % uint64(w.sc.Sentinels))
	i := id - fSentinel0
	return f.At + failbackLag(w.seed, (i-leader+w.sc.Sentinels)%w.sc.Sentinels)
}

// failbackLag is sentinelLag for the failback, drawn apart.
func failbackLag(seed uint64, i int) time.Duration {
	if i == 0 {
		return 0
	}
	return time.Duration(unit(mix(seed, 0x5e37+uint64(i))) * float64(maxSentinelLag))
}

// promoteAt is when the failover f promotes the replica.
func promoteAt(f Fault) time.Duration { return f.At + f.Amount }

// switchAt is when Sentinel i (node id) adopts the new configuration.
func (w *World) switchAt(f Fault, id int) time.Duration {
	leader := int(mix(w.seed, 0x1ead) % uint64(w.sc.Sentinels))
	i := id - fSentinel0
	return promoteAt(f) + sentinelLag(w.seed, (i-leader+w.sc.Sentinels)%w.sc.Sentinels)
}

// FailoverStats are the failover scenario's figures of one run.
type FailoverStats struct {
	Failovers int // runs with a failover
	Failbacks int // of those, runs with a failback (the primary moved back)
	Muted     int // of those, runs whose moves' +switch-master were all lost
	Unwatched int // runs with no Sentinel healthy enough for the watcher bound
	// OldHolds: holds granted by a primary the run's last move replaced
	// (the old primary; with a failback, either node before it), which
	// failover-kept examined.
	OldHolds int
	// Revoked: of those, still believed held when a healthy Sentinel
	// named the last move's configuration, and so checked against the
	// bound; MaxLate: the latest such end, after that Sentinel switched.
	Revoked int
	MaxLate time.Duration
}

// examined is what failover-kept examined in a run, read by the
// examined-count framework (examined.go): the holds the old primary
// granted.
func (s FailoverStats) examined() int { return s.OldHolds }

func (s *FailoverStats) add(o FailoverStats) {
	s.Failovers += o.Failovers
	s.Failbacks += o.Failbacks
	s.Muted += o.Muted
	s.Unwatched += o.Unwatched
	s.OldHolds += o.OldHolds
	s.Revoked += o.Revoked
	s.MaxLate = max(s.MaxLate, o.MaxLate)
}

// watchSlack covers a healthy Sentinel's answer delayed by the links'
// 40 ms spikes (two round trips per question).
const watchSlack = 100 * time.Millisecond

// watchBound is how long after a healthy Sentinel adopts the new
// configuration a Watcher polling every poll has revoked its locks: the
// next poll starts within poll; a poll waits for its slowest Sentinel (a
// hung one) until its ask timeout, min(3/4 poll, 1 s) (failover/watch.go's
// askTimeout), before it acts; and a healthy Sentinel still busy with the
// previous poll's question (its answer late by a spike) is left out of one
// poll: one more poll. Plus watchSlack.
func watchBound(poll time.Duration) time.Duration {
	return 2*poll + min(poll-poll/4, time.Second) + watchSlack
}

// lastMove is the run's last change of primary: the failback if there is
// one, else the failover (nil: neither).
func (w *World) lastMove() *Fault {
	var ff, fb *Fault
	for i := range w.faults {
		switch w.faults[i].Kind {
		case FaultFailover:
			ff = &w.faults[i]
		case FaultFailback:
			fb = &w.faults[i]
		}
	}
	if fb != nil {
		return fb
	}
	return ff
}

// moveAt is when the move m promotes a node, and adoptAt when Sentinel id
// adopts the configuration that names it.
func moveAt(m Fault) time.Duration {
	if m.Kind == FaultFailback {
		return m.At
	}
	return promoteAt(m)
}

func (w *World) adoptAt(m Fault, id int) time.Duration {
	if m.Kind == FaultFailback {
		return w.failbackAt(m, id)
	}
	return w.switchAt(m, id)
}

// oldGrant reports whether a grant at g belongs to a configuration the
// move m replaced: without a failback, any grant by the old primary (a
// grant it made after the promotion cannot stand: WAIT there answers 0);
// with one, any grant made before the failback's promotion, by either
// node (the first primary's before and during the failover, the
// failover's node's while it was primary).
func oldGrant(m Fault, g grantRec) bool {
	if m.Kind == FaultFailback {
		return g.at < m.At
	}
	return g.node == fPrimary
}

// firstHealthy is the first moment S a healthy Sentinel (never hung, and
// neither down nor lossy within the longest watcher bound of its switch)
// adopts the configuration of the move m, and that Sentinel's node id;
// -1, -1 if no Sentinel is healthy.
func (w *World) firstHealthy(m Fault) (time.Duration, int) {
	maxBound := watchBound(250 * time.Millisecond)
	first, named := time.Duration(-1), -1
	for i := range w.sc.Sentinels {
		id := fSentinel0 + i
		s := w.adoptAt(m, id)
		ok := true
		for _, f := range w.faults {
			if f.Node != id {
				continue
			}
			switch f.Kind {
			case FaultSentinelHung:
				ok = false
			case FaultSentinelDown, FaultSentinelLossy:
				if f.At < s+maxBound && f.At+f.For > s-maxBound {
					ok = false
				}
			}
		}
		if ok && (first < 0 || s < first) {
			first, named = s, id
		}
	}
	return first, named
}

// checkFailover checks the watcher invariant, failover-kept: let the
// run's last move be the failover or, in a run with a failback, the
// failback, and S the first moment a healthy Sentinel (never hung, and
// neither down nor lossy within the longest bound of its switch) names
// the configuration of that move. Every hold whose grant belongs to a
// configuration the move replaced (oldGrant) stops claiming validity by
// max(S, its grant) + watchBound(poll) on its client. With a failback
// whose announcements were lost, a Watcher may never see the failover's
// node named at all: its next poll names the first primary again, at a
// higher config epoch, which must revoke as any move does.
func (w *World) checkFailover() ([]Violation, FailoverStats) {
	var st FailoverStats
	if w.sc.Strategy != Failover {
		return nil, st
	}
	m := w.lastMove()
	if m == nil {
		return nil, st
	}
	st.Failovers = 1
	what := "the failover"
	if m.Kind == FaultFailback {
		st.Failbacks = 1
		what = "the failback"
		for _, f := range w.faults {
			if f.Kind == FaultSentinelMute {
				st.Muted = 1
				what = "the failback (every +switch-master of both moves lost)"
			}
		}
	}
	w.hist.mu.Lock()
	holds := slices.Clone(w.hist.holds)
	w.hist.mu.Unlock()
	// Holds are recorded as they end, those ending at one instant in the
	// Go scheduler's order: the check's lines go by end, client and seq.
	slices.SortStableFunc(holds, func(a, b *Hold) int {
		return cmp.Or(cmp.Compare(a.To, b.To), cmp.Compare(a.Client, b.Client), cmp.Compare(a.Seq, b.Seq))
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	first, named := w.firstHealthy(*m)
	if first < 0 {
		st.Unwatched = 1
		w.checkLog("failover-kept: no Sentinel healthy enough for the watcher bound of %s; nothing checked", what)
		return nil, st
	}
	promoted := w.nodes[fReplica].name
	if m.Kind == FaultFailback {
		promoted = w.nodes[fPrimary].name
	}
	var vs []Violation
	for _, hd := range holds {
		g, ok := w.grants[hd.Token]
		if !ok || !oldGrant(*m, g) {
			continue
		}
		st.OldHolds++
		granted := fmt.Sprintf("granted by %s at %.3fms", w.nodes[g.node].name, msf(g.at))
		wi, ok := w.watchers[hd.Client]
		if !ok || hd.To <= first {
			w.checkLog("%s: %s, ended before a healthy Sentinel named the configuration of %s", hd, granted, what)
			continue
		}
		bound := max(first, hd.From) + watchBound(wi.poll)
		st.Revoked++
		st.MaxLate = max(st.MaxLate, hd.To-max(first, hd.From))
		w.checkLog("%s: %s, believed until %.3fms, bound %.3fms (poll %v)", hd, granted, msf(hd.To), msf(bound), wi.poll)
		if hd.To > bound {
			vs = append(vs, Violation{Inv: InvFailoverKept, At: bound, Detail: fmt.Sprintf("%s: %s; after %s, Sentinel node=%d (healthy) named %s at %.3fms, yet it was believed held until %.3fms (bound %.3fms: poll %v)",
				hd, granted, what, named, promoted, msf(first), msf(hd.To), msf(bound), wi.poll)})
		}
	}
	w.checkLog("failover-kept examined %d holds granted under a configuration %s replaced, %d of them still believed when a healthy Sentinel named %s at %.3fms", st.OldHolds, what, st.Revoked, promoted, msf(first))
	return vs, st
}

// checkLog adds a line of the failover check to the history printed on
// replay (with -seed), after the run's own lines and without a time of
// its own.
func (w *World) checkLog(format string, args ...any) {
	if !w.hist.keep {
		return
	}
	line := "    check   " + fmt.Sprintf(format, args...)
	w.hist.mu.Lock()
	w.hist.lines = append(w.hist.lines, line)
	w.hist.ats = append(w.hist.ats, -1)
	w.hist.mu.Unlock()
}
