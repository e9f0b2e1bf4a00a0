package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redlease/redlease"
)

// Two constructions make the situations where the bound invariants
// (bounds.go) matter happen. Both run after a client's own operations in
// an ops seed, drawn (boundsPlan) from a stream of their own so that the
// seed's other draws stay as they were, in half the seeds, by one client:
//
//   - silent release (ops seeds without wake): one Do, on a key of its
//     own, with a TTL past DefaultCallBound on single and failover (1.2–
//     2.5 s), whose fn returns as the client's links to its data nodes
//     fall silent (every message lost for 1–20 ms): the release is lost
//     on its way and the call waits for its bound (ExDoSilent).
//   - dial-close (ops seeds with wake, single and quorum): a
//     subscription connection being dialed to a node that does not
//     answer its handshake when the strategy is closed (see dialClose;
//     ExCloseDialing).

func init() {
	// Not in the fence-expiry scenarios on single and failover: the
	// silent release's TTL (past DefaultCallBound) is longer than their
	// fence TTL, so its acquisition is refused (ErrInvalid).
	examinedIn[ExDoSilent] = func(sc *Scenario) bool { return sc.OpsWork && (!sc.FenceExpiry || sc.Strategy == Quorum) }
	examinedIn[ExCloseDialing] = func(sc *Scenario) bool { return sc.OpsWork && sc.Strategy != Failover }
}

// boundsState is a run's state for the constructions: silences of a
// client's links, dials refused, handshakes held.
type boundsState struct {
	on atomic.Bool // a rule below is set (fate and dials look further)

	mu      sync.Mutex
	silent  map[int]time.Duration // client → its data links lose every message until then (virtual)
	reject  map[[2]int]bool       // (client, node) → its dials refused
	dials   chan time.Duration    // refused dials of the rejected link, as they happen
	arm     map[[2]int]time.Time  // (client, node) → its next dial's handshake answered then
	held    map[*conn]time.Time   // connections whose handshake reply is held until then
	started map[[2]int]bool       // an armed hold began (the dial came)
	cte     map[int]bool          // client → its go-redis clients have ContextTimeoutEnabled (ctxbound.go)
}

func (b *boundsState) refresh() {
	b.on.Store(len(b.silent) > 0 || len(b.reject) > 0 || len(b.arm) > 0 || len(b.held) > 0)
}

// boundsFate is the constructions' share of a message's fate (World.fate
// asks it first): lost in a silence of the client's links, or the reply
// to a held handshake delayed until its time.
func (w *World) boundsFate(c *conn, toNode bool, i uint64, now time.Time) (time.Duration, bool, bool) {
	b := &w.bnd
	if !b.on.Load() || (w.sc.Wake && i == 0) {
		// A handshake in a seed with wake mode is never held or
		// silenced: go-redis's PubSub redials holding its mutex, and the
		// wake hub's reader waits on that mutex, which synctest does not
		// count as durably blocked, so a held HELLO stopped the clock
		// (ops-quorum 36265; World.fate's Wake rule, which this decides
		// before).
		return 0, false, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if until, ok := b.silent[c.client]; ok && c.node.sent == nil {
		if now.Sub(w.start) < until {
			return 0, true, true
		}
		delete(b.silent, c.client)
		b.refresh()
	}
	if at, ok := b.held[c]; ok && !toNode && i == 0 {
		delete(b.held, c)
		b.refresh()
		return max(at.Sub(now), 0), false, true
	}
	return 0, false, false
}

// dialNode is every go-redis client's dial of node n for client ci
// (redisClient's Dialer): refused while the constructions reject that
// link; a connection made while a hold is armed gets its handshake held.
func (w *World) dialNode(ci int, n *Node) (*conn, error) {
	b := &w.bnd
	if !b.on.Load() {
		return n.dial(ci)
	}
	k := [2]int{ci, n.id}
	b.mu.Lock()
	if b.reject[k] {
		ch := b.dials
		b.mu.Unlock()
		select {
		case ch <- w.hist.now():
		default:
		}
		return nil, fmt.Errorf("dial %s: connection refused (dial-close)", n.name)
	}
	b.mu.Unlock()
	c, err := n.dial(ci)
	if err != nil {
		return c, err
	}
	b.mu.Lock()
	if at, ok := b.arm[k]; ok {
		delete(b.arm, k)
		b.held[c] = at
		b.started[k] = true
		w.hist.logf("dial-close: %s's handshake reply held until %.3fms", c.name, msf(at.Sub(w.start)))
	}
	b.refresh()
	b.mu.Unlock()
	return c, nil
}

// silence makes every message between client ci and the data nodes (not
// the Sentinels) lost for d from now.
func (w *World) silence(ci int, d time.Duration) {
	b := &w.bnd
	b.mu.Lock()
	if b.silent == nil {
		b.silent = map[int]time.Duration{}
	}
	b.silent[ci] = w.hist.now() + d
	b.refresh()
	b.mu.Unlock()
	w.hist.event(fmt.Sprintf("silence client=%d for=%v (silent release)", ci, d))
}

// boundsPlan is one seed's draw of the constructions: which client runs
// the silent release (ops seeds without wake) and which the dial-close
// (ops-single and ops-quorum seeds with wake), -1 for none; one seed in
// two has one. Drawn from a stream of its own.
func (w *World) boundsPlan() (silentClient, dialClient int) {
	r := rand.New(rand.NewPCG(w.seed, 0xb0d5))
	silentClient, dialClient = -1, -1
	if w.ops == nil {
		return
	}
	pick := r.IntN(w.sc.Clients)
	if r.IntN(2) == 0 {
		return
	}
	switch {
	case !w.sc.Wake:
		silentClient = pick
	case w.sc.Strategy != Failover:
		dialClient = pick
	}
	return
}

// boundsRand is client ci's PCG for its construction.
func (w *World) boundsRand(ci int) *rand.Rand {
	return rand.New(rand.NewPCG(w.seed, 0xb0d50+uint64(ci)))
}

// opsConstructions runs client ci's construction, if the seed drew one
// for it, after its operations.
func (w *World) opsConstructions(e *opsEnv) {
	silentClient, dialClient := w.boundsPlan()
	switch e.ci {
	case silentClient:
		w.silentRelease(e, w.boundsRand(e.ci))
	case dialClient:
		w.dialClose(e, w.boundsRand(e.ci))
		if e.close != nil {
			// dialClose closed the client's strategy: the outage
			// construction needs one that works.
			e.newStrategy()
		}
	}
	w.outage(e) // outagework.go
}

// silentRelease: one Do on a key of the client's own (kept by its
// watchdog), with a TTL past DefaultCallBound on single and failover
// (quorum: one of the client's TTLs, within the rule's max TTL), whose fn
// works up to a third of the TTL and returns as the client's links to
// its data nodes fall silent for 1–20 ms: the release is lost on its way,
// and Do must still return within the call bound.
func (w *World) silentRelease(e *opsEnv, r *rand.Rand) {
	const seq = 900
	key := fmt.Sprintf("sd%d", e.ci)
	ttl := time.Duration(1200+r.IntN(1301)) * time.Millisecond
	if w.sc.Strategy == Quorum {
		ttl = e.drawTTL(r)
	}
	work := time.Duration(r.Int64N(int64(ttl / 3)))
	quiet := ms(r, 1, 20)
	ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), e.ci, jitOpsDo, seq), 3*time.Second)
	defer cancel()
	var h *opsHold
	var fnRet time.Duration
	var strat redlease.Strategy
	opts := append(e.lockOpts(ttl), retryAtOnce(), redlease.WithMaxAttempts(3))
	err := e.lw.Do(ctx, key, func(fctx context.Context, lk *redlease.Lock) error {
		h = w.opsStart(e, seq, key, "do-silent", ttl, lk)
		strat = lk.Strategy()
		sleepCtx(fctx, work)
		h.end = w.hist.now()
		fnRet = h.end
		w.silence(e.ci, quiet)
		return nil
	}, opts...)
	w.hist.logf("c%d#%d do-silent %s ttl=%v: %v", e.ci, seq, key, ttl, short(err))
	if h == nil {
		w.hist.failed()
		return
	}
	w.checkDo(e.ci, seq, key, strat, ttl, fnRet, true)
	w.opsEnd(e, h)
}

// wakeRetry are internal/wake's pauses between a hub reader's failed
// reads: the first, doubling up to the last (retryMin, retryMax there).
// dialClose checks them against the dials it sees before relying on them.
var wakeRetry = [2]time.Duration{10 * time.Millisecond, time.Second}

// exDialAborted counts dial-close constructions that held nothing (the
// refused dials showed no pause to rely on, or no dial came).
const exDialAborted = InvCloseBound + "/dial-aborted"

// dialCloseMargin is how long before the hub's reader tries again the
// held handshake is answered: the reader must not want the subscription's
// lock while the dial holds it (see dialClose).
const dialCloseMargin = 20 * time.Millisecond

// dialClose closes the client's strategy while one of its subscription
// connections is being dialed to a node that does not answer the
// handshake (the node paused before the dial, in 1c913a3's words): the
// close must still return within its bound (close-bound, ExCloseDialing).
//
// go-redis dials a subscription connection while holding the PubSub's
// mutex, and the wake hub's other goroutine then waits on that mutex: a
// goroutine blocked on a mutex is not durably blocked, so the bubble's
// clock would stop with the handshake's reply still due (the run would
// hang in real time; a Broadcast from outside the bubble to end it is a
// fatal error). So the construction arranges that nobody wants the mutex
// while the dial holds it. The hub's writer dials and its reader waits out
// a retry pause, which it takes after a failed read and doubles while
// reads keep failing: the client's link to node N is cut and its dials
// refused (a node that refuses connections), the reader's refused dials
// are watched until two consecutive gaps show the doubling and the next
// gap will be long enough, then the link accepts again, the next dial's
// handshake is answered only at X, and a new subscription kicks the
// writer, which dials (the reader is in its pause until after X). Close
// comes 1 ms later: X is its bound plus 20–120 ms after it. The reader
// must want the mutex only after X: X is dialCloseMargin before its next
// try. If the dials do not show the pattern (the library changed its
// pauses, say), nothing is held and the Close is not counted as dialing.
func (w *World) dialClose(e *opsEnv, r *rand.Rand) {
	wk, ok := e.strat.(redlease.Waker)
	if !ok || e.close == nil {
		return
	}
	ci := e.ci
	node := w.nodes[r.IntN(max(1, w.sc.Nodes))]
	bound := closeBound(e.strat)
	extra := ms(r, 20, 120)
	const kickWait, settle = time.Millisecond, 100 * time.Microsecond
	need := settle + kickWait + bound + extra + dialCloseMargin
	chA, chB := fmt.Sprintf("dc%da", ci), fmt.Sprintf("dc%db", ci)

	// A subscription that keeps the hub (and its reader) alive.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, stopA, err := wk.Watch(ctx, chA, "")
	cancel()
	if err != nil {
		w.hist.ex.count(exDialAborted, 1)
		w.hist.logf("c%d dial-close: watch: %v", ci, short(err))
		return
	}
	defer stopA(false)
	sleep(10 * time.Millisecond) // every node's confirmation in (a spike aside)

	b := &w.bnd
	k := [2]int{ci, node.id}
	dials := make(chan time.Duration, 64)
	b.mu.Lock()
	if b.reject == nil {
		b.reject, b.arm, b.held, b.started = map[[2]int]bool{}, map[[2]int]time.Time{}, map[*conn]time.Time{}, map[[2]int]bool{}
	}
	b.reject[k], b.dials = true, dials
	b.refresh()
	b.mu.Unlock()
	w.hist.event(fmt.Sprintf("dial-close client=%d node=%d: connections cut, dials refused", ci, node.id))
	w.cut(node.id, ci)
	endReject := func() {
		b.mu.Lock()
		delete(b.reject, k)
		b.refresh()
		b.mu.Unlock()
	}

	var seen []time.Duration
	ready := false
	for len(seen) < 16 && !ready {
		t := time.NewTimer(wakeRetry[1] + 2*time.Second)
		select {
		case d := <-dials:
			t.Stop()
			seen = append(seen, d)
		case <-t.C:
		}
		if len(seen) == 0 || w.hist.now()-seen[len(seen)-1] > time.Millisecond {
			break // no dial came
		}
		if n := len(seen); n >= 3 {
			g1, g2 := seen[n-2]-seen[n-3], seen[n-1]-seen[n-2]
			next := min(2*g2, wakeRetry[1])
			ready = g1 >= wakeRetry[0] && g2 == min(2*g1, wakeRetry[1]) && next >= need
		}
	}
	if !ready {
		endReject()
		w.hist.ex.count(exDialAborted, 1)
		w.hist.logf("c%d dial-close: the refused dials %v show no retry pause to rely on: nothing held", ci, seen)
		return
	}
	sleep(settle) // the reader is in its pause
	n := len(seen)
	next := min(2*(seen[n-1]-seen[n-2]), wakeRetry[1])
	start := time.Now()
	x := start.Add(kickWait + bound + extra)
	b.mu.Lock()
	delete(b.reject, k)
	b.arm[k] = x
	b.refresh()
	b.mu.Unlock()
	w.hist.event(fmt.Sprintf("dial-close client=%d node=%d: dials accepted, the next handshake answered at %.3fms (the hub's reader tries again at %.3fms)",
		ci, node.id, msf(x.Sub(w.start)), msf(seen[n-1]+next)))
	ctx, cancel = context.WithTimeout(context.Background(), kickWait)
	_, stopB, err := wk.Watch(ctx, chB, "") // a new channel: the writer subscribes, and dials
	cancel()
	b.mu.Lock()
	began := b.started[k]
	delete(b.arm, k)
	delete(b.started, k)
	b.refresh()
	b.mu.Unlock()
	if err == nil {
		defer stopB(false)
	}
	if !began {
		w.hist.ex.count(exDialAborted, 1)
		w.hist.logf("c%d dial-close: no dial came after the kick: nothing held", ci)
		return
	}
	at := w.hist.now()
	took := w.closeStrategy(ci, "dial-close", e.strat, e.close)
	if x.Sub(w.start) > at+bound {
		w.hist.ex.count(ExCloseDialing, 1)
	}
	w.hist.logf("c%d dial-close: Close at %.3fms took %.3fms; the handshake was held until %.3fms", ci, msf(at), msf(took), msf(x.Sub(w.start)))
	sleep(time.Until(x) + 5*time.Millisecond) // the hub stops once its dial is answered
}
