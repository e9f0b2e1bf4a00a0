package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/renew"
	"github.com/redlease/redlease/single"
)

// Idempotency workloads (Scenario.Idem): the paths of idempotency.Barrier
// that the barrier scenario never drives (issue 28).
const (
	// IdemStore: every client's Barrier on the store's own lock (node 0).
	IdemStore = "store"
	// IdemQuorum: every client's Barrier on a fenced quorum lock over
	// nodes 0 to Nodes-1 (the store, node 0, among them), WithStrategy.
	IdemQuorum = "quorum"
	// IdemMixed: two lock schemes on one store and prefix: even clients
	// on the store's own lock, odd ones on a fenced quorum whose nodes
	// include the store (a rolling move from one to the other).
	IdemMixed = "mixed"
	// IdemUnfenced: every client but the last on a strategy built
	// WithoutFencing, passed to WithStrategy (single on the store, or a
	// quorum over every node, drawn per seed); the last on the same
	// strategy with fences, so the locks are shared. A Barrier that
	// refuses the unfenced strategy at construction (an error wrapping
	// redlease.ErrInvalid) is the expected outcome: that client sits the
	// run out (counted as ExIdemRefused).
	IdemUnfenced = "unfenced"
	// IdemFailover: every client's Barrier keeps its records on a plain
	// store node (storeNode, not part of the failover pair) and takes its
	// lock through a fenced failover.Strategy over the primary and its
	// replica, with a Watcher over every Sentinel (watchedStrategy),
	// WithStrategy.
	IdemFailover = "failover"
	// IdemMasters: IdemFailover with two Sentinel masters: even clients
	// lock as IdemFailover's do, odd ones through a fenced
	// failover.Strategy on a second primary with its own replica
	// (Scenario.secondMaster), all on one store and prefix. Every
	// client's go-redis client reports the address "FailoverClient" (as
	// redis.NewFailoverClient's does), so the two schemes' placements
	// tell them apart only because the strategies name their master
	// (failover.WithMaster: masterName and master2Name).
	IdemMasters = "masters"
	// master2Name is the master name of IdemMasters' second primary.
	master2Name = "othermaster"
	// IdemLate: IdemStore with handlers that return late in their lease
	// (their work 55-90 % of it, then up to a tenth more), under delay
	// faults alone: completions
	// sent just before the lock's deadline and delayed on the link while
	// another client takes the request over.
	IdemLate = "late"
	// IdemTokens: idempotency.Tokens, issued and consumed over lossy
	// links (tokenwork.go).
	IdemTokens = "tokens"
)

// Invariants of the idempotency workloads.
const (
	// InvDiscarded: a handler returned its outcome while its lock was
	// valid, and the caller was told ErrRunCancelled: an outcome that
	// must be recorded was discarded, and a retry runs the handler again.
	InvDiscarded = "outcome-discarded"
	// InvRecordTaken: a run's handler returned while its lock was valid,
	// the lock was still valid when the run ended, and yet its record
	// had been taken over or deleted (ErrNotOwner, or the record gone).
	InvRecordTaken = "record-taken"
	// InvReplay: every caller told nil for a key (a run recorded, or a
	// replay) got one outcome, of one payload: a replay is the first
	// run's real result, a handler's, with the caller's fingerprint; and
	// no handler starts for a payload other than the recorded one.
	InvReplay = "replay-outcome"
	// InvCut: a handler's ctx ended while it ran and its lock was still
	// valid (more than cutSlack of validity left, not known lost): the
	// Barrier cancels a run only when its lock is lost (or Close's grace
	// ends; the workloads never close a Barrier), never because its
	// caller left. Examined: handler runs.
	InvCut = "handler-cut"
	// ExIdemRefused: unfenced strategies a Barrier refused at
	// construction (IdemUnfenced; zero until the library refuses them).
	ExIdemRefused = "idem/refused"
	// ExIdemLate: runs whose handler returned and whose completion found
	// the record taken over or gone (a completion that landed after its
	// lock ran out, mostly): the late-completion path (a figure).
	ExIdemLate = "idem/late"
	// ExIdemMustRecord: runs whose outcome the Barrier must have recorded
	// whatever their caller was told (idemMustRecord): a run of their
	// key after them is not excused by their caller's error (a figure).
	ExIdemMustRecord = "idem/must-record"
	// ExIdemMustRecordLeft: of those, runs whose caller left while the
	// handler ran and whose lock a Watchdog kept to the run's end: the
	// Barrier must record them however long the store failed (a figure).
	ExIdemMustRecordLeft = "idem/must-record-left"
	// ExIdemCancelled: runs whose handler returned its outcome and whose
	// caller was told ErrRunCancelled (a figure).
	ExIdemCancelled = "idem/cancelled"
	// ExIdemCuts: handlers whose ctx ended while they ran (a figure: the
	// cuts handler-cut judged).
	ExIdemCuts = "idem/cuts"
	// InvAnswerKind: every error a Barrier.Do or Consumer.HandlePayload
	// call returns is of a class their docs name (answerKind): one of the
	// package's errors, the caller's ctx error (its ctx had ended), the
	// handler's own error, or a lock or store failure. A lock refused
	// because another token holds it is ErrInProgress, never the lock's
	// bare ErrNotObtained.
	InvAnswerKind = "answer-kind"
)

func init() {
	idem := func(sc *Scenario) bool { return sc.Idem != "" && sc.Idem != IdemTokens && sc.Idem != IdemHTTP }
	examinedIn[InvDiscarded] = idem
	examinedIn[InvRecordTaken] = idem
	examinedIn[InvReplay] = idem
	examinedIn[InvCut] = idem
	examinedIn[InvAnswerKind] = idem
}

// cutSlack: validity left at a handler's cut that handler-cut excuses (the
// loss notice and the cancellation reach the handler in separate
// goroutines, at one virtual instant).
const cutSlack = time.Millisecond

// idemWorkload runs client ci of an Idem scenario.
func (w *World) idemWorkload(ci int, r *rand.Rand) {
	switch w.sc.Idem {
	case IdemTokens:
		w.tokenClient(ci, r)
		return
	case IdemHTTP:
		w.httpClient(ci, r)
		return
	}
	w.idemClient(ci, r)
}

// idemRunRec is one try of an idempotency client's request: Do or the
// Consumer.
type idemRunRec struct {
	run      effectRun
	key, fp  string
	consumer bool
	t0, end  time.Duration // the call's start and return
	started  bool          // the handler ran
	returned bool          // the handler returned an outcome (nil error)
	result   string
	retAt    time.Duration
	validRet bool           // the lock was valid when the handler returned
	lk       *redlease.Lock // the run's lock, if the client's keeper saw it
	spy      *lockSpy       // the client's keeper, if any
	renewed  bool           // the keeper renews the lock (a renew.Watchdog)
	lease    time.Duration
	err      error
	ctxErr   error // the caller's ctx's error when the call returned
	herr     error // the error the handler returned, if it returned one
	out      idempotency.Outcome
	ack      bool
	// cut: the handler's ctx ended while it ran, at cutAt, with cutLeft
	// of validity left (negative: none) on a lock still valid (cutValid).
	cut      bool
	cutAt    time.Duration
	cutLeft  time.Duration
	cutValid bool
}

// idemState is what the idempotency workloads recorded.
type idemState struct {
	mu      sync.Mutex
	runs    []*idemRunRec
	results map[string]*idemRunRec    // a handler's returned result → its run
	byRun   map[effectRun]*idemRunRec // runs whose handler returned
	starts  []handlerStartRec
	tokens  []tokenRec
	// IdemHTTP (idemhttp.go): every try, and every handler's body.
	http       []*httpRunRec
	httpBodies map[string]httpAnswer
}

type handlerStartRec struct {
	key, fp string
	run     effectRun
	at      time.Duration
}

// lockSpy is a Keeper that remembers the locks it keeps (a client's
// runs: one at a time, and those a Barrier runs on after their caller
// left) and whether each was still valid when the Barrier stopped keeping
// it (after the outcome was recorded, before the release), then keeps
// them with inner.
type lockSpy struct {
	inner redlease.Keeper
	now   func() time.Duration
	mu    sync.Mutex
	live  []*redlease.Lock
	end   map[*redlease.Lock]spyEnd
}

// spyEnd is how a kept lock's run ended: whether the lock was still
// valid, and when.
type spyEnd struct {
	valid bool
	at    time.Duration
}

// Keep remembers lk and keeps it with the inner Keeper.
func (s *lockSpy) Keep(lk *redlease.Lock) (stop func()) {
	s.mu.Lock()
	s.live = append(s.live, lk)
	s.mu.Unlock()
	in := s.inner.Keep(lk)
	return func() {
		e := spyEnd{valid: lk.Valid(), at: s.now()}
		s.mu.Lock()
		if s.end == nil {
			s.end = map[*redlease.Lock]spyEnd{}
		}
		s.end[lk] = e
		s.live = slices.DeleteFunc(s.live, func(l *redlease.Lock) bool { return l == lk })
		s.mu.Unlock()
		in()
	}
}

// current is the kept lock with fence, if exactly one is.
func (s *lockSpy) current(fence uint64) *redlease.Lock {
	s.mu.Lock()
	defer s.mu.Unlock()
	var found *redlease.Lock
	for _, l := range s.live {
		if l.Fence() == fence {
			if found != nil {
				return nil // two runs with one fence (two keys): unknown
			}
			found = l
		}
	}
	return found
}

func (s *lockSpy) endOf(lk *redlease.Lock) (e spyEnd, known bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, known = s.end[lk]
	return e, known
}

// nopKeeper keeps nothing: the lock runs out at its TTL.
type nopKeeper struct{}

// Keep does nothing.
func (nopKeeper) Keep(*redlease.Lock) (stop func()) { return func() {} }

// idemScheme builds client ci's lock strategy for its Barrier (nil: the
// store's own lock), where its locks live (for the state check), and
// whether it is built WithoutFencing. IdemFailover's strategy comes from
// watchedStrategy, whose error (its Watcher never started) is err.
func (w *World) idemScheme(ci int, ct bool, store *redis.Client, r *rand.Rand) (s redlease.Strategy, place lockPlace, unfenced bool, err error) {
	storePlace := lockPlace{nodes: []int{w.sc.storeNode()}, need: 1}
	quorumOf := func(fenced bool) redlease.Strategy {
		var cs []redis.UniversalClient
		var ids []int
		for i, n := range w.nodes[:w.sc.Nodes] {
			cs = append(cs, w.redisClient(ci, n, ct))
			ids = append(ids, i)
		}
		opt := quorum.WithFencing()
		if !fenced {
			opt = quorum.WithoutFencing()
		}
		q := must(quorum.New(cs, opt, quorum.WithFenceTTL(time.Minute)))
		w.onClose(ci, func() { w.closeStrategy(ci, "end of run", q, q.Close) })
		place = lockPlace{nodes: ids, need: len(ids)/2 + 1}
		return q
	}
	switch w.sc.Idem {
	case IdemQuorum:
		return quorumOf(true), place, false, nil
	case IdemMixed:
		if ci%2 == 1 {
			return quorumOf(true), place, false, nil
		}
		return nil, storePlace, false, nil
	case IdemUnfenced:
		unfenced = ci < w.sc.Clients-1
		if w.seed%2 == 0 {
			return quorumOf(!unfenced), place, unfenced, nil
		}
		opts := []single.Option{single.WithFenceTTL(time.Minute)}
		if unfenced {
			opts = []single.Option{single.WithoutFencing()}
		}
		return must(single.New(store, opts...)), storePlace, unfenced, nil
	case IdemMasters:
		if ci%2 == 1 {
			w.noteCTE(ci, ct)
			fc := w.redisClientAs(ci, w.nodes[w.sc.primary2()], ct, failoverClientAddr)
			return must(failover.New(fc, failover.WithMaster(master2Name))), lockPlace{failover: true}, false, nil
		}
		fallthrough
	case IdemFailover:
		w.noteCTE(ci, ct)
		prefer := r.IntN(w.sc.Sentinels)
		poll := []time.Duration{100 * time.Millisecond, 150 * time.Millisecond, 250 * time.Millisecond}[r.IntN(3)]
		fs, err := w.watchedStrategy(ci, ct, prefer, poll) // fenced: failover fences by default
		if err != nil {
			return nil, lockPlace{}, false, err
		}
		return fs, lockPlace{failover: true}, false, nil
	}
	return nil, storePlace, false, nil
}

// idemClient is one client of the IdemStore, IdemQuorum, IdemMixed,
// IdemUnfenced, IdemLate and IdemFailover scenarios: its own Barrier (a lease of 15–60 ms, so that
// takeovers and late completions are common; half the clients kept by
// a renew.Watchdog) and a Consumer on it, sending Ops requests on a few
// shared keys, a third of them through Consumer.HandlePayload (message
// ids "m…", redelivered up to three times when not acked), the rest
// through Do ("p…", retried up to three times). A key's payload is one
// of two (fingerprints "A" and, one time in four, "B"). The caller's ctx
// lasts 10–120 ms, so it often ends while the handler runs. The handler
// works 1 ms to 1.1 leases while its ctx is live (cut short, it returns
// its ctx's error and does nothing), applies its effect to the fenced
// effect store, then finishes 0–15 ms of work that no ctx stops (the
// booking is made, the receipt is written) and returns its result.
func (w *World) idemClient(ci int, r *rand.Rand) {
	wd, err := renew.New(renew.WithFraction(w.keeperFraction(ci)))
	if err != nil {
		panic(fmt.Sprintf("sim: renew.New: %v", err))
	}
	w.onClose(ci, func() { wd.Close() })
	ct := r.IntN(2) == 0
	store := w.redisClient(ci, w.nodes[w.sc.storeNode()], ct)
	lease := ms(r, 15, 60).Truncate(time.Millisecond)
	opts := []idempotency.Option{idempotency.WithLease(lease), idempotency.WithRetention(30 * time.Second)}
	strat, place, unfenced, err := w.idemScheme(ci, ct, store, r)
	if err != nil {
		w.hist.failed()
		w.hist.logf("c%d failover.NewWatcher: %v", ci, short(err))
		return
	}
	if strat != nil {
		opts = append(opts, idempotency.WithStrategy(strat))
	}
	// Half the clients renew their locks (the watchdog). The others keep
	// nothing; on a strategy of their own (WithStrategy) they still get a
	// Keeper that renews nothing, through which the workload sees the
	// lock (a Barrier with its own strategy runs the same steps with a
	// Keeper or without; on the store's own lock it does not).
	var spy *lockSpy
	renews := r.IntN(2) == 0
	if renews || strat != nil {
		var inner redlease.Keeper = nopKeeper{}
		if renews {
			inner = wd
		}
		spy = &lockSpy{now: w.hist.now, inner: trackKeeper{w: w, ci: ci, inner: inner, prefix: "idem:l:", place: place}}
		opts = append(opts, idempotency.WithKeeper(spy))
	}
	b, err := idempotency.New(store, opts...)
	if err != nil {
		if unfenced && errors.Is(err, redlease.ErrInvalid) {
			w.hist.ex.count(ExIdemRefused, 1)
			w.hist.logf("c%d idempotency.New refused the unfenced strategy: %v", ci, short(err))
			return
		}
		panic(fmt.Sprintf("sim: idempotency.New: %v", err))
	}
	w.hist.logf("c%d idem lease=%v renewed=%v strategy=%T unfenced=%v ctxTimeouts=%v", ci, lease, renews, strat, unfenced, ct)
	cons := must(idempotency.NewConsumer(b))
	leaseMs := int(lease / time.Millisecond)
	for seq := range w.sc.Ops {
		consumer := r.IntN(3) == 0
		// A new set of keys every second op: a key is contended until its
		// outcome is recorded, then only replayed.
		k := r.IntN(w.sc.Keys) + seq/2*w.sc.Keys
		key := fmt.Sprintf("p%d", k)
		if consumer {
			key = "m" + key[1:]
		}
		fp := "A"
		if r.IntN(4) == 0 {
			fp = "B"
		}
		for try := range 4 {
			rec := &idemRunRec{run: effectRun{client: ci, seq: seq, try: try}, key: key, fp: fp, consumer: consumer}
			pre := ms(r, 1, leaseMs+leaseMs/10)
			post := ms(r, 0, 15)
			if w.sc.Idem == IdemLate {
				pre, post = ms(r, leaseMs*55/100, leaseMs*90/100), ms(r, 0, leaseMs/10)
			}
			// One handler in two does its work after the effect under its
			// ctx (a receipt written with it): cut there, it returns its
			// ctx's error with the effect made.
			postUnderCtx := r.IntN(2) == 0
			h := func(hctx context.Context, fence uint64) ([]byte, error) {
				w.idemStarted(rec)
				defer w.hist.handlerSpan(hctx, key, rec.run, fence, func() { w.idemCut(rec, spy, fence, lease) })()
				if !sleepCtx(hctx, pre) || hctx.Err() != nil {
					return nil, w.idemFailed(rec, hctx.Err())
				}
				w.hist.effect(key, fence, rec.run)
				if postUnderCtx {
					if !sleepCtx(hctx, post) {
						return nil, w.idemFailed(rec, hctx.Err())
					}
				} else {
					sleep(post)
				}
				res := fmt.Sprintf("%s/%s/%s", rec.run, key, fp)
				valid := false
				var lk *redlease.Lock
				if spy != nil {
					lk = spy.current(fence)
					valid = lk != nil && lk.Valid()
				} else {
					valid = w.hist.now() < rec.t0+lease*8/10-3*time.Millisecond
				}
				w.idemReturned(rec, res, valid, lk)
				return []byte(res), nil
			}
			ctx, cancel := idemCallerCtx(w.jitterCtx(context.Background(), ci, jitBarrier, seq<<2|try), offGrid(r, ms(r, 10, 120)), (seq+try)%2 == 1, w.deadlineSkew(ci, seq<<2|try))
			t0 := w.hist.now()
			rec.t0, rec.lease, rec.spy, rec.renewed = t0, lease, spy, renews
			var (
				ack bool
				out idempotency.Outcome
				err error
			)
			if consumer {
				ack, err = cons.HandlePayload(ctx, key, []byte(fp), h)
			} else {
				out, err = b.Do(ctx, idempotency.Request{Key: key, Fingerprint: fp}, h)
			}
			ctxErr := ctx.Err()
			cancel()
			// The handler may still run (a Barrier that runs it on after
			// its caller's ctx ended): rec's handler fields are written
			// under w.idem.mu, and read when the run is checked.
			w.idemEnded(rec, ack, out, err, ctxErr)
			if consumer {
				w.hist.logf("%s handle %s fp=%s: ack=%v: %v", rec.run, key, fp, ack, short(err))
			} else {
				w.hist.logf("%s do %s fp=%s: replayed=%v fence=%d result=%q: %v", rec.run, key, fp, out.Replayed, out.Fence, out.Result, short(err))
			}
			if (consumer && ack) || (!consumer && err == nil) || idempotency.Permanent(err) {
				break
			}
			sleep(ms(r, 0, 20))
		}
		sleep(ms(r, 0, 10))
	}
}

// idemCut records that rec's handler's ctx ended while it ran, and how
// much validity its lock had left then: as the client's keeper sees the
// lock (Valid, Deadline), or, without a keeper, judged from the call's
// start as validAtEnd does (an estimate that errs towards none left).
func (w *World) idemCut(rec *idemRunRec, spy *lockSpy, fence uint64, lease time.Duration) {
	at := w.hist.now()
	left, valid := time.Duration(-1), false
	if spy != nil {
		if lk := spy.current(fence); lk != nil {
			left, valid = time.Until(lk.Deadline()), lk.Valid()
		}
	} else {
		left = rec.t0 + lease*8/10 - 3*time.Millisecond - at
		valid = left > 0
	}
	w.idem.mu.Lock()
	rec.cut, rec.cutAt, rec.cutLeft, rec.cutValid = true, at, left, valid
	w.idem.mu.Unlock()
	w.hist.logf("%s handler cut, lock valid=%v with %v left", rec.run, valid, left)
}

// idemCallerCtx is a caller's ctx that ends after d: by its deadline, or,
// with cancelled, by a cancel at d (a caller that gives up: a client gone,
// a shutdown), a ctx with no deadline. A client that honours contexts
// (ContextTimeoutEnabled) sets no socket deadline from such a ctx, and
// its call waits for the store's answer past the ctx's end: a lock
// attempt in flight then comes back with the store's real answer ("held
// by another") after ctx ended, which a deadline never lets through.
//
// A ctx with a deadline ends skew (1-999 ns either way, drawn from the
// seed: deadlineSkew) off the deadline it reports: with skew > 0 it
// reports d and ends at d+skew with context.DeadlineExceeded, as a
// context whose timer fires late does (lateCtx); with skew < 0 it reports
// d-skew and its caller cancels it at d. The library copies a caller's
// deadline into contexts of its own (Locker.attempt releases a grant born
// lost under one): a copy and the caller's ctx that ended at one instant
// would end in the Go scheduler's order (idem-masters 7: the Barrier reads
// the caller's ctx as the TryLock that the copy's end returned comes
// back); skew apart, they end in the seed's.
func idemCallerCtx(parent context.Context, d time.Duration, cancelled bool, skew time.Duration) (context.Context, context.CancelFunc) {
	if !cancelled && skew > 0 {
		return newLateCtx(parent, d, skew)
	}
	var ctx context.Context
	var cancel context.CancelFunc
	if cancelled {
		ctx, cancel = context.WithCancel(parent)
	} else {
		ctx, cancel = context.WithTimeout(parent, d-skew)
	}
	t := time.AfterFunc(d, cancel)
	return ctx, func() {
		t.Stop()
		cancel()
	}
}

// deadlineSkew is how far (1-999 ns, either way) the deadline ctx of
// client ci's try seq ends off the deadline it reports (idemCallerCtx),
// drawn from the seed, not from the client's stream.
func (w *World) deadlineSkew(ci, seq int) time.Duration {
	h := mix(mix(w.seed, 0x5ce3), uint64(ci)<<32|uint64(seq))
	x := time.Duration(1 + (h>>1)%999)
	if h&1 == 0 {
		return -x
	}
	return x
}

// lateCtx is a context whose deadline passes before it ends: Deadline
// reports dl, and Done closes, with Err context.DeadlineExceeded, skew
// later (or Canceled, by its cancel, first). Its values are its
// parent's; its parent's end does not end it (the parents it is made
// with never end). Done is an inner cancel ctx's, and AfterFunc
// registers on it, so that a ctx derived from a lateCtx waits for its
// end without a goroutine of its own.
type lateCtx struct {
	parent context.Context
	dl     time.Time
	inner  context.Context // ended by stop, as err is set
	stop   context.CancelFunc
	mu     sync.Mutex
	err    error
}

// newLateCtx returns a lateCtx whose deadline is d from now and which ends
// skew after it, and its cancel.
func newLateCtx(parent context.Context, d, skew time.Duration) (context.Context, context.CancelFunc) {
	c := &lateCtx{parent: parent, dl: time.Now().Add(d)}
	c.inner, c.stop = context.WithCancel(context.Background())
	t := time.AfterFunc(d+skew, func() { c.end(context.DeadlineExceeded) })
	return c, func() {
		t.Stop()
		c.end(context.Canceled)
	}
}

// end ends the ctx with err, unless it has ended: Err and Done change
// together, under mu.
func (c *lateCtx) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
		c.stop()
	}
}

// Deadline reports the deadline, which passes before the ctx ends.
func (c *lateCtx) Deadline() (time.Time, bool) { return c.dl, true }

// Done closes when the ctx ends.
func (c *lateCtx) Done() <-chan struct{} { return c.inner.Done() }

// Err is nil until the ctx ends.
func (c *lateCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// AfterFunc runs f in its own goroutine once the ctx ends (see
// context.AfterFunc), which is how the context package lets a ctx
// derived from this one follow its end.
func (c *lateCtx) AfterFunc(f func()) (stop func() bool) { return context.AfterFunc(c.inner, f) }

// Value is the parent's.
func (c *lateCtx) Value(key any) any { return c.parent.Value(key) }

func (w *World) idemStarted(rec *idemRunRec) {
	at := w.hist.now()
	w.idem.mu.Lock()
	rec.started = true
	w.idem.starts = append(w.idem.starts, handlerStartRec{key: rec.key, fp: rec.fp, run: rec.run, at: at})
	w.idem.mu.Unlock()
}

// idemFailed records the error rec's handler returns, and returns it.
func (w *World) idemFailed(rec *idemRunRec, err error) error {
	w.idem.mu.Lock()
	rec.herr = err
	w.idem.mu.Unlock()
	return err
}

func (w *World) idemReturned(rec *idemRunRec, res string, valid bool, lk *redlease.Lock) {
	at := w.hist.now()
	w.hist.mu.Lock()
	if w.hist.mustRecord == nil {
		w.hist.mustRecord = w.idemMustRecord
	}
	w.hist.mu.Unlock()
	w.idem.mu.Lock()
	if w.idem.byRun == nil {
		w.idem.byRun = map[effectRun]*idemRunRec{}
	}
	w.idem.byRun[rec.run] = rec
	rec.returned, rec.result, rec.retAt, rec.validRet, rec.lk = true, res, at, valid, lk
	if w.idem.results == nil {
		w.idem.results = map[string]*idemRunRec{}
	}
	w.idem.results[res] = rec
	w.idem.mu.Unlock()
	w.hist.logf("%s handler returned %q, lock valid=%v", rec.run, res, valid)
}

// idemMustRecord says whether the Barrier must have recorded run's
// outcome, whatever its caller was told: its handler returned it while
// the lock was valid, the run ended (as the client's keeper saw it, after
// the completion's answer) within half a lease of that return with the
// lock still valid, and no fault of the schedule touched the store
// meanwhile (up to a lease after the return). A completion that the
// store answered in time either stored the outcome or found the record
// taken (record-taken); one that went unanswered (a spike, a fault) is
// tried for up to a lease, and may go unrecorded without a defect —
// unless its caller had left and a Watchdog kept the lock to the run's
// end (keptUnheardLocked): the Barrier then tries for as long as the
// lock holds, so such a run must have been recorded whatever the store
// did.
func (w *World) idemMustRecord(run effectRun) bool {
	w.idem.mu.Lock()
	defer w.idem.mu.Unlock()
	return w.mustRecordLocked(w.idem.byRun[run])
}

func (w *World) mustRecordLocked(rec *idemRunRec) bool {
	if rec == nil || !rec.returned || !rec.validRet || rec.spy == nil || rec.lk == nil {
		return false
	}
	e, ok := rec.spy.endOf(rec.lk)
	if w.keptUnheardLocked(rec) {
		// Nobody can be told that this outcome went unrecorded (its
		// caller left), and the Watchdog kept its lock: the Barrier keeps
		// trying to record it for as long as the lock holds, however long
		// the store fails. A run that stopped keeping a lock still valid
		// gave up on an outcome it could still have recorded.
		return true
	}
	return ok && e.valid && e.at-rec.retAt < rec.lease/2 && !w.storeTroubled(rec.retAt, rec.retAt+rec.lease)
}

// keptUnheardLocked says whether rec's caller left while its handler ran
// and a Watchdog kept its lock valid to the run's end.
func (w *World) keptUnheardLocked(rec *idemRunRec) bool {
	if rec == nil || !rec.returned || !rec.validRet || rec.spy == nil || rec.lk == nil || !rec.renewed || !rec.callerLeft() {
		return false
	}
	e, ok := rec.spy.endOf(rec.lk)
	return ok && e.valid
}

// callerLeft says whether rec's caller returned before its handler did:
// its ctx ended while the handler ran, and the Barrier ran it on.
func (rec *idemRunRec) callerLeft() bool {
	return rec.ctxErr != nil && rec.end != 0 && rec.end <= rec.retAt
}

// storeTroubled reports whether a fault of the schedule touched the
// store's node between from and to (virtual times): a completion then
// may fail for as long as the lock is valid, and the outcome go
// unrecorded without a defect (ErrNotRecorded; a caller that left never
// hears it, which is why the Barrier tries on while a Keeper keeps the
// lock: keptUnheardLocked). An instant fault (cut) counts for a millisecond.
func (w *World) storeTroubled(from, to time.Duration) bool {
	store := w.sc.storeNode()
	for _, f := range w.faults {
		if f.Node != store && !slices.Contains(f.Nodes, store) {
			continue
		}
		if f.At <= to && from <= f.At+max(f.For, time.Millisecond) {
			return true
		}
	}
	return false
}

func (w *World) idemEnded(rec *idemRunRec, ack bool, out idempotency.Outcome, err, ctxErr error) {
	w.hist.runEnded(rec.run, err)
	end := w.hist.now()
	w.idem.mu.Lock()
	rec.ack, rec.out, rec.err, rec.end, rec.ctxErr = ack, out, err, end, ctxErr
	w.idem.runs = append(w.idem.runs, rec)
	w.idem.mu.Unlock()
}

// validAtEnd says whether rec's lock was still valid when its run ended:
// as the client's keeper saw it when the Barrier stopped keeping it, or,
// without one, judged from the time (the call's return, within 0.8 of
// the lease from its start, less 3 ms: the lock was granted after the
// call began, and its validity is the lease less the drift allowance and
// the loss margin, a tenth).
func (rec *idemRunRec) validAtEnd() bool {
	if rec.spy != nil {
		e, _ := rec.spy.endOf(rec.lk)
		return rec.lk != nil && e.valid
	}
	return rec.end < rec.t0+rec.lease*8/10-3*time.Millisecond
}

// recordTaken reports whether err says the run's record was taken over
// or deleted under it (ErrNotOwner, or a completion that found no
// record).
func recordTaken(err error) bool {
	return errors.Is(err, idempotency.ErrNotOwner) || (errors.Is(err, idempotency.ErrNotRecorded) && strings.Contains(err.Error(), "record is gone"))
}

// answerKind reports whether rec's error is of a class the docs of Do
// (and idempotency's doc.go) and Consumer.Handle name: the handler's own
// error (here only its ctx's, wrapped or not); a stored or Final error;
// ErrInProgress, ErrMismatch, ErrNotOwner, ErrResultNotStored,
// ErrRunCancelled, ErrNotRecorded, ErrClosed; a Permanent one (an empty
// key: ErrInvalid); an error that wraps the caller's ctx error, once that
// ctx ended; or a lock or store failure: redlease.ErrUnavailable, a
// *redlease.NodeError, or a store call's own failure (a connection's
// error, a Redis error reply, a timeout) that is not the lock's refusal.
// The lock's refusal (ErrNotObtained with no node failing) means the
// request is held by another run: the docs answer that with ErrInProgress.
func answerKind(rec *idemRunRec) bool {
	err := rec.err
	for _, s := range []error{idempotency.ErrInProgress, idempotency.ErrMismatch, idempotency.ErrNotOwner,
		idempotency.ErrResultNotStored, idempotency.ErrRunCancelled, idempotency.ErrNotRecorded, idempotency.ErrClosed} {
		if errors.Is(err, s) {
			return true
		}
	}
	var (
		stored  *idempotency.StoredError
		final   *idempotency.FinalError
		nodeErr *redlease.NodeError
	)
	switch {
	case errors.As(err, &stored), errors.As(err, &final), idempotency.Permanent(err):
		return true
	case rec.ctxErr != nil && errors.Is(err, rec.ctxErr):
		return true
	case rec.herr != nil && errors.Is(err, rec.herr):
		return true
	case errors.Is(err, redlease.ErrUnavailable), errors.As(err, &nodeErr):
		return true
	case errors.Is(err, redlease.ErrNotObtained):
		return false
	}
	return storeFailure(err)
}

// storeFailure reports whether err is a store call's own failure: a
// connection's error (net.Error, EOF, a closed client or pool, a cut
// simulated connection: errClosed), a Redis error reply, or a call's
// timeout.
func storeFailure(err error) bool {
	var (
		ne net.Error
		re redis.Error
	)
	return errors.As(err, &ne) || errors.As(err, &re) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, redis.ErrClosed) || errors.Is(err, errClosed) || errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, context.DeadlineExceeded)
}

// checkIdem checks the idempotency workloads' invariants (InvAnswerKind, InvDiscarded,
// InvRecordTaken, InvReplay), the tokens' (InvTokenOnce) and IdemHTTP's
// (InvHTTPReplay).
func (w *World) checkIdem() []Violation {
	w.idem.mu.Lock()
	defer w.idem.mu.Unlock()
	var vs []Violation
	ex := &w.hist.ex
	type told struct {
		rec *idemRunRec
		res string // Do: the result; Consumer: ""
	}
	nils := map[string][]told{} // key → the runs told nil, in order of return
	for _, rec := range w.idem.runs {
		if errors.Is(rec.err, idempotency.ErrRunCancelled) && rec.returned {
			ex.count(ExIdemCancelled, 1)
		}
		if recordTaken(rec.err) && rec.returned {
			ex.count(ExIdemLate, 1)
		}
		if w.mustRecordLocked(rec) {
			ex.count(ExIdemMustRecord, 1)
		}
		if w.keptUnheardLocked(rec) {
			ex.count(ExIdemMustRecordLeft, 1)
		}
		if rec.started {
			ex.count(InvCut, 1)
			if rec.cut {
				ex.count(ExIdemCuts, 1)
			}
			if rec.cut && rec.cutValid && rec.cutLeft > cutSlack {
				vs = append(vs, Violation{Inv: InvCut, At: rec.cutAt, Detail: fmt.Sprintf("%s %s fp=%s: the handler's ctx ended at %.3fms while its lock was valid with %v left (the caller was told %v)",
					rec.run, rec.key, rec.fp, msf(rec.cutAt), rec.cutLeft, short(rec.err))})
			}
		}
		if rec.err != nil {
			ex.count(InvAnswerKind, 1)
			if !answerKind(rec) {
				vs = append(vs, Violation{Inv: InvAnswerKind, At: rec.end, Detail: fmt.Sprintf("%s %s fp=%s consumer=%v: the caller (ctx error %v) was told an error of no documented class: %v (%T)",
					rec.run, rec.key, rec.fp, rec.consumer, rec.ctxErr, rec.err, rec.err)})
			}
		}
		if rec.returned && rec.validRet {
			ex.count(InvDiscarded, 1)
			if errors.Is(rec.err, idempotency.ErrRunCancelled) {
				vs = append(vs, Violation{Inv: InvDiscarded, At: rec.end, Detail: fmt.Sprintf("%s %s fp=%s: the handler returned %q at %.3fms while its lock was valid, and the caller was told %v",
					rec.run, rec.key, rec.fp, rec.result, msf(rec.retAt), short(rec.err))})
			}
			if rec.validAtEnd() {
				ex.count(InvRecordTaken, 1)
				if recordTaken(rec.err) {
					vs = append(vs, Violation{Inv: InvRecordTaken, At: rec.end, Detail: fmt.Sprintf("%s %s fp=%s: the handler returned at %.3fms and the run ended at %.3fms with its lock valid throughout, yet its record was taken: %v",
						rec.run, rec.key, rec.fp, msf(rec.retAt), msf(rec.end), short(rec.err))})
				}
			}
		}
		if rec.err == nil && (!rec.consumer || rec.ack) {
			t := told{rec: rec}
			if !rec.consumer {
				t.res = string(rec.out.Result)
				if rec.out.Replayed {
					ex.count(InvReplay, 1)
					src, ok := w.idem.results[t.res]
					switch {
					case !ok:
						vs = append(vs, Violation{Inv: InvReplay, At: rec.end, Detail: fmt.Sprintf("%s %s fp=%s: replayed %q, which no handler returned", rec.run, rec.key, rec.fp, t.res)})
					case src.key != rec.key || src.fp != rec.fp:
						vs = append(vs, Violation{Inv: InvReplay, At: rec.end, Detail: fmt.Sprintf("%s %s fp=%s: replayed %q, the result of %s on %s fp=%s", rec.run, rec.key, rec.fp, t.res, src.run, src.key, src.fp)})
					}
				}
			}
			nils[rec.key] = append(nils[rec.key], t)
		}
	}
	for _, k := range sortedKeys(nils) {
		ts := nils[k]
		first := ts[0]
		for _, t := range ts[1:] {
			ex.count(InvReplay, 1)
			switch {
			case t.rec.fp != first.rec.fp:
				vs = append(vs, Violation{Inv: InvReplay, At: t.rec.end, Detail: fmt.Sprintf("key %s: %s (fp=%s) was told nil after %s (fp=%s) was: one key, two payloads' outcomes", k, t.rec.run, t.rec.fp, first.rec.run, first.rec.fp)})
			case !t.rec.consumer && !first.rec.consumer && t.res != first.res:
				vs = append(vs, Violation{Inv: InvReplay, At: t.rec.end, Detail: fmt.Sprintf("key %s: %s was told %q (replayed=%v) after %s was told %q: two outcomes recorded", k, t.rec.run, t.res, t.rec.out.Replayed, first.rec.run, first.res)})
			}
		}
		// No handler of another payload starts once the key's outcome
		// was recorded (its first caller told nil).
		for _, s := range w.idem.starts {
			if s.key == k && s.at > first.rec.end {
				ex.count(InvReplay, 1)
				if s.fp != first.rec.fp {
					vs = append(vs, Violation{Inv: InvReplay, At: s.at, Detail: fmt.Sprintf("key %s: handler %s of fp=%s started after %s (fp=%s) was told its outcome was recorded", k, s.run, s.fp, first.rec.run, first.rec.fp)})
				}
			}
		}
	}
	vs = append(vs, w.checkTokensLocked()...)
	vs = append(vs, w.checkHTTPLocked()...)
	return vs
}
