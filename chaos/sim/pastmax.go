package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/redlease/redlease"
)

// The quorum3-pastmax scenario aims at the delayed-restart rule's bound on
// extensions (8a56ae8: quorum's Extend and ExtendBatch refuse a TTL above
// WithDelayedRestart's max TTL). Without the bound, a double grant needs
// every one of these at once, which quorum3-extend's generic draws lined
// up at seed 9,814 and 15,455 of earlier trees, and in none of seeds
// 1–20,000 at 562bfdf:
//
//   - a grant that landed on a bare majority (the third node missed it);
//   - an extension past the max TTL, accepted by that majority;
//   - a node of that majority restarting empty soon after the extension,
//     and a client's acquire reaching it soon after it came back (its
//     first contact starts its sit-out of one max TTL);
//   - the holder not told the lock is gone (its next extensions get no
//     answer from the third node, so they are undecided, not refused);
//   - another client trying again after the sit-out, while the extended
//     lock is still believed held, and reaching the restarted node and the
//     one that missed the grant.
//
// So here the schedule draws, for each client with probability 2/3, a
// partition from one node over most of the run (a client partitioned from
// a node that wins the lock holds it on a bare majority, and its
// extensions cannot hear a refusal from that node), one or two empty
// restarts with a short downtime inside the holds, and sometimes a lossy
// link; the workload keeps the lock contended for the whole run: whoever
// holds it extends it every few milliseconds, mostly past the max TTL
// (1.1–2.5 times it), while the others try again every 2–20 ms. Every draw
// comes from the seed (the schedule's PCG, each client's PCG). Every
// fault is inside the assumptions: an empty restart under the rule keeps
// exclusion (see the package doc, Grading), partitions and loss are
// ordinary faults. With the bound in place, each extension past the max
// TTL is refused and the lock runs out at its last accepted TTL.

// scheduleFunc draws a scenario's faults from r (Scenario.Schedule).
type scheduleFunc func(r *rand.Rand, sc *Scenario, horizon time.Duration) []Fault

// clientFunc is a scenario's workload client (Scenario.Client), as
// lockClient is.
type clientFunc func(w *World, ci int, locker *redlease.Locker, r *rand.Rand)

// pastMaxSchedule draws quorum3-pastmax's faults (see above). Like
// makeSchedule, it depends only on the seed and the scenario.
func pastMaxSchedule(r *rand.Rand, sc *Scenario, horizon time.Duration) []Fault {
	n := sc.allNodes()
	var fs []Fault
	for ci := range sc.Clients {
		if r.IntN(3) == 0 {
			continue
		}
		at := time.Duration(r.Int64N(int64(horizon / 10)))
		fs = append(fs, Fault{At: at, Kind: FaultPartition, Node: -1, Nodes: []int{r.IntN(n)}, Client: ci, For: horizon - at})
	}
	for range 1 + r.IntN(2) {
		f := Fault{At: horizon/10 + time.Duration(r.Int64N(int64(horizon*3/4-horizon/10))), Kind: FaultRestart, Node: r.IntN(n), Client: -1, For: ms(r, 0, 15), Mode: "empty"}
		f.Outside, f.FenceOutside, f.Why = sc.restartOutside(f.Mode)
		fs = append(fs, f)
	}
	if r.IntN(3) == 0 {
		fs = append(fs, Fault{At: time.Duration(r.Int64N(int64(horizon * 3 / 4))), Kind: FaultLoss, Node: r.IntN(n), Client: -1, For: ms(r, 20, 200), Prob: 0.1 + 0.5*r.Float64()})
	}
	slices.SortStableFunc(fs, func(a, b Fault) int { return int(a.At - b.At) })
	return fs
}

// pastMaxClient is one quorum3-pastmax client: until the scenario's
// horizon (and at most Ops attempts), it tries the one key with TryLock
// (or Lock, a few attempts at once) every 2–20 ms, and holds what it gets
// with pastMaxHold.
func (w *World) pastMaxClient(ci int, locker *redlease.Locker, r *rand.Rand) {
	end := w.sc.horizon()
	for seq := range w.sc.Ops {
		if w.hist.now() >= end {
			return
		}
		key := "k0"
		ttl := w.drawTTL(r)
		via := "trylock"
		ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), ci, jitPastMax, seq), ms(r, 10, 60))
		var lk *redlease.Lock
		var err error
		if r.IntN(4) == 0 {
			// Retry at once, a bounded number of attempts: see
			// lockClient.
			via = "lock"
			lk, err = locker.Lock(ctx, key, redlease.WithTTL(ttl), retryAtOnce(), redlease.WithMaxAttempts(2+r.IntN(3)))
		} else {
			lk, err = locker.TryLock(ctx, key, redlease.WithTTL(ttl))
		}
		cancel()
		if err != nil {
			w.hist.failed()
			w.hist.logf("c%d#%d %s %s ttl=%v: %v", ci, seq, via, key, ttl, short(err))
			sleep(ms(r, 2, 20))
			continue
		}
		w.pastMaxHold(ci, seq, key, via, ttl, lk, r)
		sleep(ms(r, 0, 15))
	}
}

// pastMaxHold runs one grant to its end and records its belief interval,
// as hold does; it extends every 3–30 ms, three times in four past the
// max TTL.
func (w *World) pastMaxHold(ci, seq int, key, via string, ttl time.Duration, lk *redlease.Lock, r *rand.Rand) {
	hd := &Hold{Client: ci, Seq: seq, Key: key, Via: via, Fence: lk.Fence(), From: w.hist.now(), LostAt: -1, RelSent: -1, Token: lk.Token()}
	w.hist.logf("c%d#%d %s %s ttl=%v granted fence=%d until=+%.3fms", ci, seq, via, key, ttl, lk.Fence(), msf(time.Until(lk.Until())))
	_ = lk.Valid() // as hold does, unless -lostfirst
	lost, perr := safeLost(lk)
	if perr != nil {
		w.hist.violation(Violation{Inv: InvPanic, At: w.hist.now(), Detail: fmt.Sprintf("c%d#%d %s: Lock.Lost panicked: %v", ci, seq, key, perr)})
		c := make(chan struct{})
		close(c)
		lost = c
	}
	done := make(chan struct{})
	go func() { // owned by this call, which waits for it below; Lost closes by Until at the latest
		<-lost
		hd.LostAt = w.hist.now()
		close(done)
	}()
	live := w.track(ci, fmt.Sprintf("c%d#%d", ci, seq), key, lk, w.placeOf("", key))
	defer w.untrack(live)
	maxTTL := w.sc.DelayedRestart
	for range 1 + r.IntN(w.sc.holdSteps()) {
		sleep(ms(r, 3, 30))
		if !lk.Valid() {
			break
		}
		w.hist.write(ci, seq, key, lk.Fence())
		ttl2 := max(w.drawTTL(r), time.Until(lk.Until())+time.Millisecond) // never shorter (see hold)
		if r.IntN(4) > 0 {
			ttl2 = maxTTL + time.Duration(r.Int64N(int64(maxTTL*3/2))).Truncate(time.Millisecond) + maxTTL/10
		}
		ctx, cancel := context.WithTimeout(context.Background(), ms(r, 5, 100))
		err := lk.Extend(ctx, ttl2)
		cancel()
		w.hist.logf("c%d#%d extend %s ttl=%v: %v", ci, seq, key, ttl2, short(err))
		w.checkLock(live)
	}
	if r.IntN(10) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), ms(r, 5, 100))
		hd.RelSent = w.hist.now()
		err := lk.Release(ctx)
		cancel()
		w.hist.logf("c%d#%d release %s: %v (valid after: %v)", ci, seq, key, short(err), lk.Valid())
	}
	<-done
	hd.Until = lk.Until().Sub(w.start)
	hd.To = min(hd.LostAt, hd.Until)
	w.hist.logf("c%d#%d end %s: %s (%v)", ci, seq, key, hd, short(lk.Err()))
	w.hist.addHold(hd)
}
