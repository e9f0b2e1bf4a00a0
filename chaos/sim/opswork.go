package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/internal/renewal"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/renew"
	"github.com/redlease/redlease/single"
)

// The ops scenarios (ops-single, ops-quorum, ops-failover) run every
// public lock operation in random sequences, with options drawn per seed
// and per client (opsPlan): TryLock and Lock; Locker.Do kept by a
// renew.Watchdog and by an engine equivalent to Do's process-wide default
// keeper (the default itself belongs to whichever bubble first used it,
// so each client builds the same engine from internal/renewal with the
// default keeper's Config, and hands it to its Locker with WithKeeper);
// Keeper.Keep and its stop; Lock.Extend longer, shorter and equal to the
// TTL last sent, with a ctx too short for the reply at times (undecided);
// redlease.ExtendAll over two locks; Release, with short ctxs; Close of
// the Watchdog, of the engine and (single, quorum) of the strategy while
// a lock is kept; Lost, Valid, Err; and writes to the fenced register,
// some after a pause past Valid.

// opsPlan is one seed's options of an ops scenario. Every client of a
// seed shares what must be shared (fencing and its counter TTL, the
// delayed-restart rule and durable nodes: the nodes' markers and counters
// are common); the rest is per client.
type opsPlan struct {
	factor   float64       // the seed's smallest drift factor
	fencing  bool          // fences on (every client)
	fenceTTL time.Duration // WithFenceTTL (0: none)
	maxTTL   time.Duration // quorum: WithDelayedRestart (0: off)
	durable  bool          // quorum: WithDurableNodes (with maxTTL)
	wake     bool          // waiters woken by release notices (see drawOps)
	clients  []opsClientPlan
}

// opsClientPlan is one client's options.
type opsClientPlan struct {
	factor      float64          // its strategy's drift factor
	ttl         [2]time.Duration // acquisition TTLs
	margin      int              // loss margin: 0 default (ttl/10), 1 none, 2 ttl/4, 3 3 ms
	fair        bool             // WithFairness
	quorum      int              // quorum: WithQuorum (0: a majority)
	nodeTimeout time.Duration    // quorum: WithNodeTimeout (0: default)
	ctxTimeouts bool             // go-redis ContextTimeoutEnabled
}

// factorRange is the smallest and largest drift factor of the seed.
func (p *opsPlan) factorRange() (lo, hi float64) {
	lo, hi = p.factor, p.factor
	for _, c := range p.clients {
		lo, hi = min(lo, c.factor), max(hi, c.factor)
	}
	return lo, hi
}

// opsFactors are the seed's base drift factors, the default among them.
var opsFactors = []float64{0.01, 0.03, 0.05, 0.1, 0.1, 0.15}

// drawOps draws the seed's ops options (nil unless sc is an ops
// scenario) and sets what the rest of the simulator reads from the
// scenario: fencing, the rule's max TTL, durable nodes, the node count
// (quorum: 3, or 5 one seed in three), and Wake. A quarter of the
// ops-single and ops-quorum seeds wake their waiters by release notices;
// pub/sub in the simulator needs a quiet network (no loss of commands, a
// handshake that takes no time, no paused node: see the package doc's
// gaps), so those seeds draw the Wake scenarios' faults (wakeSchedule)
// and the clock-rate faults, never the general ones.
func drawOps(seed uint64, sc *Scenario) *opsPlan {
	if !sc.OpsWork {
		return nil
	}
	r := rand.New(rand.NewPCG(seed, 0x0b5))
	p := &opsPlan{factor: opsFactors[r.IntN(len(opsFactors))]}
	switch sc.Strategy {
	case Quorum:
		p.fencing = r.IntN(4) > 0
		if r.IntN(3) == 0 {
			sc.Nodes = 5
		}
	default:
		p.fencing = r.IntN(8) > 0
	}
	if sc.FenceExpiry {
		p.fencing = true
	}
	if p.fencing && !sc.FenceExpiry && r.IntN(4) == 0 {
		// Outlives the run (a go-redis call without context timeouts can
		// wait 12 s): fences are compared throughout it.
		p.fenceTTL = ms(r, 30000, 60000)
	}
	longest := time.Duration(0)
	for range sc.Clients {
		c := opsClientPlan{factor: p.factor, ctxTimeouts: r.IntN(2) == 0, fair: r.IntN(3) == 0}
		if r.IntN(4) == 0 {
			c.factor += []float64{0.02, 0.05}[r.IntN(2)]
		}
		lo := ms(r, 20, 80).Truncate(time.Millisecond)
		c.ttl = [2]time.Duration{lo, lo + ms(r, 40, 300).Truncate(time.Millisecond)}
		longest = max(longest, c.ttl[1])
		c.margin = r.IntN(4)
		if sc.Strategy == Quorum {
			if r.IntN(4) == 0 {
				c.quorum = sc.Nodes/2 + 1 + r.IntN(sc.Nodes-sc.Nodes/2)
			}
			if r.IntN(3) == 0 {
				c.nodeTimeout = []time.Duration{20 * time.Millisecond, 50 * time.Millisecond, 250 * time.Millisecond}[r.IntN(3)]
			}
		}
		p.clients = append(p.clients, c)
	}
	if sc.FenceExpiry {
		// Counters that expire within the run: at least every TTL the
		// clients acquire with (WithFenceTTL refuses a longer one).
		p.fenceTTL = longest + ms(r, 0, 60).Truncate(time.Millisecond)
	}
	if sc.Strategy == Quorum && r.IntN(3) == 0 {
		// Extensions longer than maxTTL are refused (ErrInvalid): with a
		// maxTTL under three TTLs, some of the workload's are.
		p.maxTTL = longest + ms(r, 0, int(2*longest/time.Millisecond)).Truncate(time.Millisecond)
		p.durable = r.IntN(3) == 0
	}
	if sc.Strategy != Failover && r.IntN(4) == 0 {
		p.wake = true
	}
	sc.Fencing = p.fencing
	sc.DelayedRestart = p.maxTTL
	sc.Durable = p.durable
	if p.wake {
		sc.Wake, sc.Schedule = true, wakeSchedule
	}
	return p
}

// opsEnv is one ops client's strategy, Lockers and keepers.
type opsEnv struct {
	w     *World
	ci    int
	cp    opsClientPlan
	clock redlease.Clock // nil: the system clock
	rcs   []redis.UniversalClient
	strat redlease.Strategy
	close func() error // the strategy's Close (nil: failover, whose Watcher keeps it)
	wd    *renew.Watchdog
	eng   *renewal.Engine[*redlease.Lock]
	lw    *redlease.Locker // kept by wd
	le    *redlease.Locker // kept by eng
}

// defaultKeeperEngine builds the engine Locker.Do uses by default
// (keeper.go's defaultKeeper: ExtendAll, ErrNotHeld, lanes per strategy,
// idle stop, the default fraction, timeout and call slots), in the run's
// bubble; on a client whose clock drifts it reads that clock, as the
// process's default would read a drifting system clock.
func defaultKeeperEngine(clock redlease.Clock) *renewal.Engine[*redlease.Lock] {
	c := renewal.Config[*redlease.Lock]{
		Extend:   redlease.ExtendAll,
		NotHeld:  func(err error) bool { return errors.Is(err, redlease.ErrNotHeld) },
		Lane:     func(lk *redlease.Lock) any { return renewal.LaneKey(lk.Strategy(), lk) },
		IdleStop: true,
	}
	if clock != nil {
		c.Now = clock.Now
	}
	return renewal.New(c)
}

// newOpsEnv builds client ci's go-redis clients, strategy, keepers and
// Lockers (failover: on the strategy failoverClient made).
func (w *World) newOpsEnv(ci int, fs *failover.Strategy) *opsEnv {
	e := &opsEnv{w: w, ci: ci, cp: w.ops.clients[ci], clock: w.clientClock(ci)}
	if fs != nil {
		e.strat = fs
	} else {
		nodes := w.nodes[:max(1, w.sc.Nodes)]
		for _, n := range nodes {
			e.rcs = append(e.rcs, w.redisClient(ci, n, e.cp.ctxTimeouts))
		}
		w.noteCTE(ci, e.cp.ctxTimeouts)
		e.newStrategy()
	}
	e.newWatchdog()
	e.newEngine()
	return e
}

// newStrategy (re)builds the client's single or quorum strategy on its
// go-redis clients, with its options.
func (e *opsEnv) newStrategy() {
	w, p := e.w, e.w.ops
	switch w.sc.Strategy {
	case Single:
		opts := []single.Option{single.WithDriftFactor(e.cp.factor)}
		if !p.fencing {
			opts = append(opts, single.WithoutFencing())
		}
		if p.fenceTTL > 0 {
			opts = append(opts, single.WithFenceTTL(p.fenceTTL))
		}
		if e.clock != nil {
			opts = append(opts, single.WithClock(e.clock))
		}
		s := must(single.New(e.rcs[0], opts...))
		e.strat, e.close = s, s.Close
	default:
		opts := []quorum.Option{quorum.WithDriftFactor(e.cp.factor)}
		if p.fencing {
			opts = append(opts, quorum.WithFencing())
		} else {
			opts = append(opts, quorum.WithoutFencing())
		}
		if p.fenceTTL > 0 {
			opts = append(opts, quorum.WithFenceTTL(p.fenceTTL))
		}
		if p.maxTTL > 0 {
			opts = append(opts, quorum.WithDelayedRestart(p.maxTTL))
			if p.durable {
				opts = append(opts, quorum.WithDurableNodes())
			}
		}
		if e.cp.quorum > 0 {
			opts = append(opts, quorum.WithQuorum(e.cp.quorum))
		}
		if e.cp.nodeTimeout > 0 {
			opts = append(opts, quorum.WithNodeTimeout(e.cp.nodeTimeout))
		}
		if e.clock != nil {
			opts = append(opts, quorum.WithClock(e.clock))
		}
		q := must(quorum.New(e.rcs, opts...))
		e.strat, e.close = q, q.Close
	}
	s, strat := e.close, e.strat
	w.onClose(e.ci, func() { w.closeStrategy(e.ci, "end of run", strat, s) })
	e.lockers()
}

// failoverOptions are client ci's failover strategy options in an ops
// scenario (nil otherwise).
func (w *World) failoverOptions(ci int) []failover.Option {
	if w.ops == nil {
		return nil
	}
	cp := w.ops.clients[ci]
	opts := []failover.Option{failover.WithDriftFactor(cp.factor)}
	if !w.ops.fencing {
		opts = append(opts, failover.WithoutFencing())
	}
	if w.ops.fenceTTL > 0 {
		opts = append(opts, failover.WithFenceTTL(w.ops.fenceTTL))
	}
	if c := w.clientClock(ci); c != nil {
		opts = append(opts, failover.WithClock(c))
	}
	return opts
}

func (e *opsEnv) newWatchdog() {
	var opts []renew.Option
	if e.clock != nil {
		opts = append(opts, renew.WithClock(e.clock))
	}
	wd := must(renew.New(opts...))
	e.wd = wd
	e.w.onClose(e.ci, func() { _ = wd.Close() })
	if e.strat != nil {
		e.lockers()
	}
}

func (e *opsEnv) newEngine() {
	eng := defaultKeeperEngine(e.clock)
	e.eng = eng
	e.w.onClose(e.ci, eng.Close)
	if e.strat != nil {
		e.lockers()
	}
}

// lockers (re)builds the client's two Lockers on its strategy: lw kept by
// the Watchdog, le by the default keeper's engine.
func (e *opsEnv) lockers() {
	if e.wd == nil || e.eng == nil {
		return
	}
	opts := []redlease.Option{redlease.WithFairness(e.cp.fair), redlease.WithObserver(stateObserver{e.w, e.ci})}
	if !e.w.sc.Wake {
		opts = append(opts, redlease.WithPolling())
	}
	if e.clock != nil {
		opts = append(opts, redlease.WithClock(e.clock))
	}
	e.lw = must(redlease.New(e.strat, append(opts, redlease.WithKeeper(e.wd))...))
	e.le = must(redlease.New(e.strat, append(opts, redlease.WithKeeper(e.eng))...))
}

// lockOpts are the options of one acquisition: its TTL and loss margin.
func (e *opsEnv) lockOpts(ttl time.Duration) []redlease.LockOption {
	opts := []redlease.LockOption{redlease.WithTTL(ttl)}
	switch e.cp.margin {
	case 1:
		opts = append(opts, redlease.WithLossMargin(0))
	case 2:
		opts = append(opts, redlease.WithLossMargin(ttl/4))
	case 3:
		opts = append(opts, redlease.WithLossMargin(min(3*time.Millisecond, ttl/2)))
	}
	return opts
}

func (e *opsEnv) drawTTL(r *rand.Rand) time.Duration {
	lo, hi := e.cp.ttl[0], e.cp.ttl[1]
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1)).Truncate(time.Millisecond)
}

// opsHold is one lock of an ops client while it holds it.
type opsHold struct {
	hd   *Hold
	lk   *redlease.Lock
	ttl  time.Duration // the TTL last sent (acquisition or Extend)
	live *liveLock
	done chan struct{}
	stop func() // the keeper's stop, nil when not kept
	end  time.Duration
}

// opsClient is one ops client (single, quorum; failover through
// failoverClient with fs).
func (w *World) opsClient(ci int, r *rand.Rand, fs *failover.Strategy) {
	e := w.newOpsEnv(ci, fs)
	sleep(ms(r, 0, 10))
	for seq := range w.sc.Ops {
		key := fmt.Sprintf("k%d", r.IntN(w.sc.Keys))
		switch k := r.IntN(20); {
		case k < 3:
			w.opsPlain(e, seq, key, r, "trylock")
		case k < 6:
			w.opsPlain(e, seq, key, r, "lock")
		case k < 9:
			w.opsDo(e, seq, key, r, e.lw, "do-wd")
		case k < 12:
			w.opsDo(e, seq, key, r, e.le, "do-eng")
		case k < 16:
			w.opsKeep(e, seq, key, r)
		case k < 18:
			w.opsPair(e, seq, r)
		default:
			w.opsClose(e, seq, key, r)
		}
		sleep(ms(r, 0, 20))
	}
	w.opsConstructions(e) // boundwork.go
}

// acquire takes key with TryLock or Lock (retryAtOnce and a bounded
// number of attempts, as lockClient does).
func (w *World) opsAcquire(e *opsEnv, seq int, key string, r *rand.Rand, via string) (*opsHold, bool) {
	ttl := e.drawTTL(r)
	locker := e.lw
	if r.IntN(2) == 0 {
		locker = e.le
	}
	if via == "" {
		via = []string{"trylock", "lock"}[r.IntN(2)]
	}
	cd := ms(r, 10, 300)
	ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), e.ci, jitOpsLock, seq), cd)
	start := w.hist.now()
	var lk *redlease.Lock
	var err error
	if via == "trylock" {
		lk, err = locker.TryLock(ctx, key, e.lockOpts(ttl)...)
	} else {
		opts := append(e.lockOpts(ttl), retryAtOnce(), redlease.WithMaxAttempts(2+r.IntN(5)))
		lk, err = locker.Lock(ctx, key, opts...)
	}
	cancel()
	w.checkCtx(e.ci, via, key, start, cd, true)
	if err != nil {
		w.hist.failed()
		w.hist.logf("c%d#%d %s %s ttl=%v: %v", e.ci, seq, via, key, ttl, short(err))
		return nil, false
	}
	return w.opsStart(e, seq, key, via, ttl, lk), true
}

// opsStart records a grant: its hold, the state check's tracking, and a
// goroutine that notes when Lost closes.
func (w *World) opsStart(e *opsEnv, seq int, key, via string, ttl time.Duration, lk *redlease.Lock) *opsHold {
	hd := &Hold{Client: e.ci, Seq: seq, Key: key, Via: via, Fence: lk.Fence(), From: w.hist.now(), LostAt: -1, RelSent: -1, Token: lk.Token(), TTL: ttl}
	w.hist.logf("c%d#%d %s %s ttl=%v granted fence=%d until=%.3fms", e.ci, seq, via, key, ttl, lk.Fence(), msf(w.untilV(e.ci, lk)))
	h := &opsHold{hd: hd, lk: lk, ttl: ttl, done: make(chan struct{}), end: -1}
	_ = lk.Valid()
	h.live = w.track(e.ci, fmt.Sprintf("c%d#%d", e.ci, seq), key, lk, w.placeOf("", key))
	go func() { // ends when Lost closes: by Until, or at the release
		<-h.live.lost
		hd.LostAt = w.hist.now()
		close(h.done)
	}()
	return h
}

// opsEnd waits for Lost (the lock was released, or its keeper stopped)
// and records the hold.
func (w *World) opsEnd(e *opsEnv, h *opsHold) {
	if h.stop != nil {
		h.stop()
		h.stop = nil
	}
	<-h.done
	w.untrack(h.live)
	hd := h.hd
	hd.Until = w.untilV(e.ci, h.lk)
	hd.To = min(hd.LostAt, hd.Until)
	if h.end >= 0 {
		hd.End = h.end
		hd.To = min(hd.To, h.end)
	}
	w.hist.logf("c%d#%d end %s: %s (%v)", e.ci, hd.Seq, hd.Key, hd, short(h.lk.Err()))
	w.hist.addHold(hd)
}

// opsRelease releases h, one time in ten not at all (its keeper stopped,
// it expires), with a ctx too short for the reply a quarter of the time.
func (w *World) opsRelease(e *opsEnv, h *opsHold, r *rand.Rand) {
	if h.stop != nil && r.IntN(3) == 0 {
		h.stop() // stop keeping first, then release
		h.stop = nil
	}
	if r.IntN(10) == 0 {
		return
	}
	d := ms(r, 20, 200)
	if r.IntN(4) == 0 {
		d = time.Duration(r.Int64N(int64(3 * time.Millisecond)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	h.hd.RelSent = w.hist.now()
	err := h.lk.Release(ctx)
	cancel()
	w.checkCtx(e.ci, "release", h.hd.Key, h.hd.RelSent, d, false)
	w.hist.logf("c%d#%d release %s: %v (valid after: %v)", e.ci, h.hd.Seq, h.hd.Key, short(err), h.lk.Valid())
}

// opsPlain: TryLock or Lock, a few steps, maybe a keeper for part of
// them, a release.
func (w *World) opsPlain(e *opsEnv, seq int, key string, r *rand.Rand, via string) {
	h, ok := w.opsAcquire(e, seq, key, r, via)
	if !ok {
		return
	}
	w.opsSteps(e, h, r, nil, true)
	w.opsRelease(e, h, r)
	w.opsEnd(e, h)
}

// opsKeep: a lock kept by Keeper.Keep (the Watchdog or the engine) while
// it works and extends, the keeper stopped now and then.
func (w *World) opsKeep(e *opsEnv, seq int, key string, r *rand.Rand) {
	h, ok := w.opsAcquire(e, seq, key, r, "")
	if !ok {
		return
	}
	h.hd.Via += "+keep"
	w.opsKeepWith(e, h, r)
	w.opsSteps(e, h, r, nil, true)
	w.opsRelease(e, h, r)
	w.opsEnd(e, h)
}

func (w *World) opsKeepWith(e *opsEnv, h *opsHold, r *rand.Rand) {
	if r.IntN(2) == 0 {
		h.stop = e.wd.Keep(h.lk)
		w.hist.logf("c%d#%d keep %s (watchdog)", e.ci, h.hd.Seq, h.hd.Key)
	} else {
		h.stop = e.eng.Keep(h.lk)
		w.hist.logf("c%d#%d keep %s (engine)", e.ci, h.hd.Seq, h.hd.Key)
	}
	w.settleInstant(e.ci)
}

// opsDo: Locker.Do kept by the Locker's keeper; fn works in steps until
// its ctx ends.
func (w *World) opsDo(e *opsEnv, seq int, key string, r *rand.Rand, locker *redlease.Locker, via string) {
	ttl := e.drawTTL(r)
	ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), e.ci, jitOpsDo, seq), 3*time.Second)
	var h *opsHold
	var strat redlease.Strategy
	opts := append(e.lockOpts(ttl), retryAtOnce(), redlease.WithMaxAttempts(2+r.IntN(5)))
	err := locker.Do(ctx, key, func(fctx context.Context, lk *redlease.Lock) error {
		h = w.opsStart(e, seq, key, via, ttl, lk)
		strat = lk.Strategy()
		w.settleInstant(e.ci) // the keeper Do started first
		w.opsSteps(e, h, r, fctx, false)
		h.end = w.hist.now()
		return nil
	}, opts...)
	cancel()
	w.hist.logf("c%d#%d %s %s ttl=%v: %v", e.ci, seq, via, key, ttl, short(err))
	if h == nil {
		w.hist.failed()
		return
	}
	w.checkDo(e.ci, seq, key, strat, h.ttl, h.end, false)
	w.opsEnd(e, h) // Do released it (Lost closed) before it returned
}

// opsPair: two locks at once (TryLock on two keys), extended together by
// redlease.ExtendAll, one of them extended alone now and then.
func (w *World) opsPair(e *opsEnv, seq int, r *rand.Rand) {
	a, ok := w.opsAcquire(e, seq, "k0", r, "trylock")
	if !ok {
		return
	}
	b, ok := w.opsAcquire(e, seq+1000, "k1", r, "trylock")
	if !ok {
		w.opsSteps(e, a, r, nil, true)
		w.opsRelease(e, a, r)
		w.opsEnd(e, a)
		return
	}
	a.hd.Via, b.hd.Via = "pair", "pair"
	for range 1 + r.IntN(4) {
		switch r.IntN(4) {
		case 0:
			sleep(time.Duration(r.Int64N(int64(min(a.ttl, b.ttl) * 6 / 10))))
		case 1:
			w.opsExtend(e, []*opsHold{a, b}[r.IntN(2)], r)
		default:
			d := ms(r, 5, 200)
			if r.IntN(4) == 0 {
				d = time.Duration(r.Int64N(int64(3 * time.Millisecond)))
			}
			ctx, cancel := context.WithTimeout(context.Background(), d)
			start := w.hist.now()
			errs := redlease.ExtendAll(ctx, []*redlease.Lock{a.lk, b.lk})
			cancel()
			w.checkCtx(e.ci, "extendall", "k0,k1", start, d, false)
			w.hist.logf("c%d#%d extendall k0,k1: %v, %v", e.ci, seq, short(errs[0]), short(errs[1]))
			w.checkLock(a.live)
			w.checkLock(b.live)
		}
		for _, h := range []*opsHold{a, b} {
			if h.lk.Valid() {
				w.opsWrite(e, h, r)
			}
		}
	}
	w.opsRelease(e, a, r)
	w.opsRelease(e, b, r)
	w.opsEnd(e, a)
	w.opsEnd(e, b)
}

// opsClose closes the Watchdog, the engine or (single, quorum) the
// strategy while a lock is held (kept by the closed keeper), works on,
// and builds a new one for the client's next operations.
func (w *World) opsClose(e *opsEnv, seq int, key string, r *rand.Rand) {
	h, ok := w.opsAcquire(e, seq, key, r, "")
	if !ok {
		return
	}
	what := r.IntN(3)
	if what == 2 && e.close == nil {
		what = r.IntN(2)
	}
	switch what {
	case 0:
		h.stop = e.wd.Keep(h.lk)
		w.settleInstant(e.ci) // the keeper's first renewal reads the TTL before an Extend
		w.opsSteps(e, h, r, nil, false)
		_ = e.wd.Close()
		w.hist.logf("c%d#%d watchdog closed (keeping %s)", e.ci, seq, key)
		h.hd.Via += "+wdclose"
		w.opsSteps(e, h, r, nil, false)
		w.opsRelease(e, h, r)
		w.opsEnd(e, h)
		e.newWatchdog()
	case 1:
		h.stop = e.eng.Keep(h.lk)
		w.settleInstant(e.ci) // the keeper's first renewal reads the TTL before an Extend
		w.opsSteps(e, h, r, nil, false)
		e.eng.Close()
		w.hist.logf("c%d#%d engine closed (keeping %s)", e.ci, seq, key)
		h.hd.Via += "+engclose"
		w.opsSteps(e, h, r, nil, false)
		w.opsRelease(e, h, r)
		w.opsEnd(e, h)
		e.newEngine()
	default:
		w.opsSteps(e, h, r, nil, false)
		w.closeStrategy(e.ci, "mid-run", e.strat, e.close)
		w.hist.logf("c%d#%d strategy closed (holding %s)", e.ci, seq, key)
		h.hd.Via += "+close"
		w.opsSteps(e, h, r, nil, false)
		w.opsRelease(e, h, r)
		w.opsEnd(e, h)
		e.newStrategy()
	}
}

// opsSteps runs one to five steps of a hold: work, a write to the fenced
// register (some after a pause past Valid), an Extend, a look at Lost,
// Valid and Err, and (keepable) a keeper started or stopped. fctx, if
// set, is Do's: the steps stop when it ends, or when Lost closed (Do
// then cancels fctx from a goroutine of its own: after an Extend that
// lost the lock, which closes Lost before it returns, whether fctx had
// ended yet would follow the Go scheduler).
func (w *World) opsSteps(e *opsEnv, h *opsHold, r *rand.Rand, fctx context.Context, keepable bool) {
	for range 1 + r.IntN(5) {
		if fctx != nil && (fctx.Err() != nil || closed(h.live.lost)) {
			return
		}
		switch k := r.IntN(10); {
		case k < 3:
			d := time.Duration(r.Int64N(int64(h.ttl*6/10) + 1))
			if fctx == nil {
				sleep(d)
				break
			}
			sleepCtx(fctx, d)
		case k < 5:
			if h.lk.Valid() {
				w.opsWrite(e, h, r)
			}
		case k < 8:
			w.opsExtend(e, h, r)
		case k < 9:
			select {
			case <-h.live.lost:
				w.hist.logf("c%d#%d %s: lost (valid %v): %v", e.ci, h.hd.Seq, h.hd.Key, h.lk.Valid(), short(h.lk.Err()))
			default:
				w.hist.logf("c%d#%d %s: valid %v, err %v", e.ci, h.hd.Seq, h.hd.Key, h.lk.Valid(), short(h.lk.Err()))
			}
		default:
			if !keepable {
				break
			}
			if h.stop != nil {
				h.stop()
				h.stop = nil
				w.hist.logf("c%d#%d keep %s stopped", e.ci, h.hd.Seq, h.hd.Key)
			} else {
				w.opsKeepWith(e, h, r)
			}
		}
	}
}

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// opsWrite writes h's fence to the fenced register, one time in three
// after a pause of up to 1.5 TTLs past the Valid that preceded it: the
// fences, not the belief intervals, must then refuse a stale write.
func (w *World) opsWrite(e *opsEnv, h *opsHold, r *rand.Rand) {
	if r.IntN(3) == 0 {
		d := time.Duration(r.Int64N(int64(h.ttl*3/2) + 1))
		w.hist.logf("c%d#%d %s: valid, pausing %v before the write", e.ci, h.hd.Seq, h.hd.Key, d)
		sleep(d)
	}
	w.hist.write(e.ci, h.hd.Seq, h.hd.Key, h.lk.Fence())
}

// opsExtend extends h longer (1.2–3 times), shorter (0.3–0.9 times) or
// equal to the TTL last sent, with a ctx too short for the reply a
// quarter of the time, and checks the lock when Extend returns.
func (w *World) opsExtend(e *opsEnv, h *opsHold, r *rand.Rand) {
	var ttl2 time.Duration
	kind := r.IntN(3)
	switch kind {
	case 0:
		ttl2 = time.Duration(float64(h.ttl) * (1.2 + 1.8*r.Float64()))
	case 1:
		ttl2 = time.Duration(float64(h.ttl) * (0.3 + 0.6*r.Float64()))
	default:
		ttl2 = h.ttl
	}
	ttl2 = max(ttl2.Truncate(time.Millisecond), 5*time.Millisecond)
	d := ms(r, 5, 200)
	if r.IntN(4) == 0 {
		d = time.Duration(r.Int64N(int64(3 * time.Millisecond)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	start := w.hist.now()
	err := h.lk.Extend(ctx, ttl2)
	cancel()
	w.checkCtx(e.ci, "extend", h.hd.Key, start, d, false)
	if !errors.Is(err, redlease.ErrInvalid) && !errors.Is(err, redlease.ErrNotHeld) || err == nil {
		h.ttl = ttl2 // sent (its answer maybe unknown)
	}
	w.hist.logf("c%d#%d extend %s %s ttl=%v (ctx %v): %v until=%.3fms", e.ci, h.hd.Seq, h.hd.Key, []string{"longer", "shorter", "equal"}[kind], ttl2, d, short(err), msf(w.untilV(e.ci, h.lk)))
	w.checkLock(h.live)
}
