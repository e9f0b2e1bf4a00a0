package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/redlease/redlease"
)

// The Wake scenarios (wake-single, wake-quorum3, and with Fair
// fair-single, fair-quorum3) run Lockers that wait by
// release notices (internal/wake through the strategies' Watch), on one
// hot key, under pub/sub faults only (wakeSchedule): published messages
// lost with the connection up, subscription connections cut, pushes
// slowed. Each client takes the key with Lock (its backoff far longer
// than any TTL, so a wait ends at a notice or at the holder's remaining
// TTL + 1 ms, which the refusal carries: never at a jittered backoff),
// holds it for up to 7/10 of its TTL,
// writes its fence to the register, and releases it with a generous ctx.
// In wake-herd (Waiters 2) each client runs two such loops on its one
// Locker; the invariants below tell them apart (waiter), so a loop's
// release with its sibling waiting counts as a handoff.
//
// Invariants handoff-late and wake-slow, besides overlap, fence-order,
// stale-accepted and release-kept-valid. handoff-late: after a release that returned nil, sent while
// another client was inside Lock for the key and still is at D = the
// holder's grant + its TTL + wakeSlack, some client is granted the key
// by D. Why D: the waiter's wait after its last refusal ends by the
// holder's expiry plus the refusal's delay and 1 ms, whatever the notices
// did (Locker.retry), and its next attempt then finds the key free (the
// release came before the expiry); wakeSlack covers that reply, the
// attempt (a quorum's two phases, with fences) and spikes of the links.
// No fault here touches a command: nodes are never down, paused or
// partitioned, and no message but a push is lost. wake-slow: the same,
// with no pub/sub fault from the first waiter's Lock call to that bound:
// some client is granted the key within wakeFast of the release (the
// notice ended a wait), unless that is later than handoff-late's bound.
//
// The Fair scenarios differ in one way: a fair waiter refused with
// ErrQueued (the key free, another waiter the line's head) has no
// holder's TTL to end its wait at, and its waits ramp up to the max retry
// delay (wakeFairDelay). D then adds that max: the head's last attempt
// and every Queued waiter's were refused by the holder (then as above)
// or Queued (then the next comes within the max), so the head attempts
// by the holder's expiry plus the max, and finds the key free.

// wakeBackoff is the Wake clients' retry delay (min = max): waits are
// drawn from [wakeBackoff/2, wakeBackoff], longer than every TTL.
const wakeBackoff = time.Second

// wakeFairDelay is the Fair scenarios' retry delay, min and max. A fair
// waiter refused with ErrQueued (the key free, another waiter the line's
// head) has no holder's TTL to cut its wait: it ramps from the min delay
// up to the max (Locker.retry). So its wait may end at a backoff, and
// handoff-late's bound in a Fair scenario adds the max: a waiter whose
// last refusal was Queued attempts again within it, and one refused by
// the holder within the holder's TTL.
var wakeFairDelay = [2]time.Duration{5 * time.Millisecond, 100 * time.Millisecond}

// wakeDelay is the Wake clients' retry delay: wakeBackoff (min = max), or
// wakeFairDelay in a Fair scenario.
func (w *World) wakeDelay() (minDelay, maxDelay time.Duration) {
	if w.sc.Fair {
		return wakeFairDelay[0], wakeFairDelay[1]
	}
	return wakeBackoff, wakeBackoff
}

// wakeLateBound is handoff-late's bound past the holder's grant and TTL:
// wakeSlack, and in a Fair scenario the max retry delay (see
// wakeFairDelay).
func (w *World) wakeLateBound() time.Duration {
	if w.sc.Fair {
		return wakeSlack + wakeFairDelay[1]
	}
	return wakeSlack
}

// wakeLockTimeout bounds one Lock call of a Wake client.
const wakeLockTimeout = 2 * time.Second

// wakeSlack: see handoff-late above. A waiter's last refusal's reply
// (maxOneWay), 1 ms, then one acquisition: with fences, two rounds of a
// request and a reply each (4 maxOneWay), a few scheduler instants.
const wakeSlack = 1*time.Millisecond + 5*maxOneWay + 5*time.Millisecond

// InvHandoffLate: after a confirmed release with a client waiting, nobody
// was granted the key within the holder's TTL plus wakeSlack of its grant.
const InvHandoffLate = "handoff-late"

// InvWakeSlow: after a confirmed release with a client waiting, and no
// pub/sub fault from the first waiter's Lock call to the bound, nobody was
// granted the key within wakeFast of the release: the notice did not end
// the wait.
const InvWakeSlow = "wake-slow"

// wakeFast: the release's request and its publish's push (2 maxOneWay),
// then one acquisition, two rounds with fences (4 maxOneWay), a few
// scheduler instants. Without a notice the wait ends at the holder's
// expiry, at least 3/10 of its TTL (18 ms) after a release the workload
// sends by 7/10 of it.
const wakeFast = 6*maxOneWay + 5*time.Millisecond

// wakeWait is one Lock call of a Wake client.
type wakeWait struct {
	client int
	waiter int // the client's Lock loop (Waiters): client*lanes + lane
	// base: a granted call's id in the key's line (its token's base; ""
	// if not granted), which tells apart two calls of one client that
	// overlap (heads.go, leftoverBound).
	base     string
	key      string
	from, to time.Duration
	granted  bool
}

// wakeRelease is one release by a Wake client.
type wakeRelease struct {
	client    int
	waiter    int // as wakeWait's
	key       string
	grant     time.Duration // the hold's grant (Lock returned)
	ttl       time.Duration
	sent, ret time.Duration
	err       error
}

// WakeStats are the Wake scenarios' figures: releases sent while another
// client waited and confirmed, and how long until the next grant.
type WakeStats struct {
	Handoffs  int           // confirmed releases with a client waiting
	Quick     int           // next grant within 5 ms of the release
	NoFault   int           // handoffs with no pub/sub fault from the waiters' Lock calls to the grant
	QuickNF   int           // of those, within 5 ms
	MaxNF     time.Duration // of those, the longest
	MaxFault  time.Duration // the longest with a pub/sub fault in that span
	Late      int           // handoff-late violations
	Slow      int           // wake-slow violations
	Released  int           // releases that returned nil
	Failed    int           // Lock calls that returned an error
	Grants    int
	Fallbacks int // handoffs longer than 5 ms
	// Applied: the Acquire calls the nodes applied (scopeRecs.applied),
	// over Grants the cost of a grant, which waking more waiters than a
	// release frees raises.
	Applied int

	// HeadsDiffer: handoffs during which a node refused a fair attempt
	// as not the head while another node's head differed (heads.go).
	HeadsDiffer int
	// Leftover: wake-slow and handoff-late verdicts a leftover entry
	// excused (heads.go, leftoverBound).
	Leftover int
}

func (s *WakeStats) add(o WakeStats) {
	s.Handoffs += o.Handoffs
	s.Quick += o.Quick
	s.NoFault += o.NoFault
	s.QuickNF += o.QuickNF
	s.MaxNF = max(s.MaxNF, o.MaxNF)
	s.MaxFault = max(s.MaxFault, o.MaxFault)
	s.Late += o.Late
	s.Slow += o.Slow
	s.Released += o.Released
	s.Failed += o.Failed
	s.Grants += o.Grants
	s.Fallbacks += o.Fallbacks
	s.Applied += o.Applied
	s.HeadsDiffer += o.HeadsDiffer
	s.Leftover += o.Leftover
}

// wakeClient is one Wake client (see above).
func (w *World) wakeClient(ci int, locker *redlease.Locker, r *rand.Rand) {
	lanes := w.wakeLanes()
	if lanes == 1 {
		w.wakeLane(ci, 0, locker, r)
		return
	}
	rs := make([]*rand.Rand, lanes) // drawn before any lane runs: the seed alone decides them
	for i := range rs {
		rs[i] = rand.New(rand.NewPCG(r.Uint64(), r.Uint64()))
	}
	var wg sync.WaitGroup
	for lane, lr := range rs {
		wg.Go(func() { w.wakeLane(ci, lane, locker, lr) })
	}
	wg.Wait()
}

// wakeLanes is how many Lock loops each Wake client runs (Waiters, at
// least one).
func (w *World) wakeLanes() int { return max(1, w.sc.Waiters) }

// wakeLane is one Lock loop of Wake client ci (lane of Waiters): its
// holds are numbered from lane*Ops.
func (w *World) wakeLane(ci, lane int, locker *redlease.Locker, r *rand.Rand) {
	waiter := ci*w.wakeLanes() + lane
	sleep(ms(r, 0, 20))
	for op := range w.sc.Ops {
		seq := lane*w.sc.Ops + op
		key := fmt.Sprintf("k%d", r.IntN(w.sc.Keys))
		ttl := w.drawTTL(r)
		from := w.hist.now()
		ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), ci, jitWake, seq), wakeLockTimeout)
		lk, err := locker.Lock(ctx, key, redlease.WithTTL(ttl), redlease.WithRetryDelay(w.wakeDelay()))
		cancel()
		w.checkCtx(ci, "lock", key, from, wakeLockTimeout, true)
		w.mu.Lock()
		wt := wakeWait{client: ci, waiter: waiter, key: key, from: from, to: w.hist.now(), granted: err == nil}
		if err == nil {
			wt.base = base(lk.Token())
		}
		w.wakeWaits = append(w.wakeWaits, wt)
		w.mu.Unlock()
		if err != nil {
			w.hist.failed()
			w.hist.logf("c%d#%d lock %s ttl=%v: %v", ci, seq, key, ttl, short(err))
			continue
		}
		hd := &Hold{Client: ci, Seq: seq, Key: key, Via: "lock", Fence: lk.Fence(), From: w.hist.now(), LostAt: -1, RelSent: -1, Token: lk.Token()}
		w.hist.logf("c%d#%d lock %s ttl=%v granted fence=%d until=+%.3fms", ci, seq, key, ttl, lk.Fence(), msf(time.Until(lk.Until())))
		_ = lk.Valid() // as hold does: Valid before Lost
		live := w.track(ci, fmt.Sprintf("c%d#%d", ci, seq), key, lk, w.placeOf("", key))
		done := make(chan struct{})
		go func() { // owned by this iteration, which waits for it below; Lost closes by Until at the latest
			<-lk.Lost()
			hd.LostAt = w.hist.now()
			close(done)
		}()
		sleep(time.Duration(r.Int64N(int64(ttl * 7 / 10))))
		if lk.Valid() {
			w.hist.write(ci, seq, key, lk.Fence())
		}
		rel := wakeRelease{client: ci, waiter: waiter, key: key, grant: hd.From, ttl: ttl, sent: w.hist.now()}
		hd.RelSent = rel.sent
		ctx, cancel = context.WithTimeout(context.Background(), 500*time.Millisecond)
		rel.err = lk.Release(ctx)
		cancel()
		w.checkCtx(ci, "release", key, rel.sent, 500*time.Millisecond, false)
		rel.ret = w.hist.now()
		w.hist.logf("c%d#%d release %s: %v", ci, seq, key, short(rel.err))
		w.mu.Lock()
		w.wakeRels = append(w.wakeRels, rel)
		w.mu.Unlock()
		<-done
		w.untrack(live)
		hd.Until = lk.Until().Sub(w.start)
		hd.To = min(hd.LostAt, hd.Until)
		w.hist.addHold(hd)
		sleep(ms(r, 0, 20))
	}
}

// checkWake checks handoff-late and gathers the Wake figures.
func (w *World) checkWake() ([]Violation, WakeStats) {
	var st WakeStats
	if !w.sc.Wake {
		return nil, st
	}
	w.mu.Lock()
	waits := slices.Clone(w.wakeWaits)
	rels := slices.Clone(w.wakeRels)
	w.mu.Unlock()
	var grants []time.Duration // per key, sorted
	byKey := map[string][]time.Duration{}
	for _, h := range w.hist.holds {
		byKey[h.Key] = append(byKey[h.Key], h.From)
	}
	for k := range byKey {
		slices.Sort(byKey[k])
	}
	w.scope.mu.Lock()
	st.Applied = w.scope.applied
	w.scope.mu.Unlock()
	for _, wt := range waits {
		if wt.granted {
			st.Grants++
		} else {
			st.Failed++
		}
	}
	var vs []Violation
	for _, rel := range rels {
		if rel.err != nil {
			continue
		}
		st.Released++
		grants = byKey[rel.key]
		i, _ := slices.BinarySearch(grants, rel.sent+1)
		next := time.Duration(-1)
		if i < len(grants) {
			next = grants[i]
		}
		deadline := rel.grant + rel.ttl + w.wakeLateBound()
		var waiting []wakeWait
		for _, wt := range waits {
			if wt.key == rel.key && wt.waiter != rel.waiter && wt.from < rel.sent && wt.to > rel.sent {
				waiting = append(waiting, wt)
			}
		}
		if len(waiting) == 0 {
			continue
		}
		st.Handoffs++
		end := next
		if end < 0 {
			end = w.hist.now()
		}
		took := end - rel.sent
		earliest := rel.sent
		for _, wt := range waiting {
			earliest = min(earliest, wt.from)
		}
		// A fault counts from the first waiter's Lock call to the later
		// of the grant and the bound; a cut's effect lasts until the
		// resubscription, within a few round trips.
		faulted := false
		for _, f := range w.faults {
			if f.Kind == FaultLateJoin && !lateJoinTouches(f, waiting) {
				continue // not a pub/sub fault, and a waiter it leaves alone takes the key: see leftoverBound
			}
			if f.At <= max(end, deadline) && f.At+f.For+4*maxOneWay >= earliest {
				faulted = true
			}
		}
		if took <= 5*time.Millisecond {
			st.Quick++
		} else {
			st.Fallbacks++
		}
		if faulted {
			st.MaxFault = max(st.MaxFault, took)
		} else {
			st.NoFault++
			st.MaxNF = max(st.MaxNF, took)
			if took <= 5*time.Millisecond {
				st.QuickNF++
			}
		}
		if w.headsDiffered(rel.key, rel.sent, end) {
			st.HeadsDiffer++
		}
		stillWaiting := false
		for _, wt := range waiting {
			if wt.to >= deadline {
				stillWaiting = true
			}
		}
		// excused: leftover entries held the key back (heads.go), and
		// the next grant came within their bound.
		excused := func(bound time.Duration) bool {
			lb, why, ok := w.leftoverBound(rel.key, rel.sent, max(end, bound))
			if !ok || next < 0 || next > lb {
				return false
			}
			st.Leftover++
			w.hist.logf("excused by a leftover entry: c%d released %s at %.3fms, next grant at %.3fms, past %.3fms: %s; bound %.3fms (its expiry + %v)",
				rel.client, rel.key, msf(rel.sent), msf(next), msf(bound), why, msf(lb), w.wakeLateBound())
			return true
		}
		if fast := rel.sent + wakeFast; !faulted && (next < 0 || next > fast) && fast < deadline {
			stillWaiting := false
			for _, wt := range waiting {
				if wt.to >= fast {
					stillWaiting = true
				}
			}
			if stillWaiting && !excused(fast) {
				st.Slow++
				vs = append(vs, Violation{Inv: InvWakeSlow, At: fast, Detail: fmt.Sprintf(
					"c%d released %s at %.3fms with %d client(s) waiting and no pub/sub fault; next grant %s, bound %.3fms (release + %v)",
					rel.client, rel.key, msf(rel.sent), len(waiting), fmtAt(next), msf(fast), wakeFast)})
			}
		}
		if (next < 0 || next > deadline) && stillWaiting && !excused(deadline) {
			st.Late++
			vs = append(vs, Violation{Inv: InvHandoffLate, At: deadline, Detail: fmt.Sprintf(
				"c%d released %s at %.3fms (granted at %.3fms, ttl %v) with %d client(s) waiting; next grant %s, bound %.3fms (grant + ttl + %v)",
				rel.client, rel.key, msf(rel.sent), msf(rel.grant), rel.ttl, len(waiting), fmtAt(next), msf(deadline), w.wakeLateBound())})
		}
	}
	return vs, st
}

// lateJoinTouches reports whether late join f may hold back every
// waiter of a handoff (waiting): all of them are f's client (the caller
// checks f's window). Its late Acquires then come up to f.Amount past
// maxOneWay, so wakeFast, which counts round trips of maxOneWay, does not
// bound its next grant; a client f leaves alone takes the key on the nodes
// that are on time. With Waiters the only waiters may be the releaser's
// own (fair-herd 11673: the release to a late node waited behind the late
// Acquires on their connection, that node kept the releaser at the head of
// its line, and the sibling's attempts each had one node late).
func lateJoinTouches(f Fault, waiting []wakeWait) bool {
	for _, wt := range waiting {
		if wt.client != f.Client {
			return false
		}
	}
	return len(waiting) > 0
}

func fmtAt(d time.Duration) string {
	if d < 0 {
		return "none"
	}
	return fmt.Sprintf("at %.3fms", msf(d))
}
