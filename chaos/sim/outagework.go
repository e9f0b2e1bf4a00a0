package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/internal/fanout"
)

// InvOutageBound: a Lock or Do without a ctx deadline, whose client's links
// to every data node are silent from before the call until past its bound,
// ends with an error that errors.Is redlease.ErrUnavailable within its
// Locker's outage limit, or the bound of its first attempt if that is
// longer (see redlease.WithOutageLimit), plus boundSlack. A held key may
// be waited for as long as the caller likes; an outage may not (issue 29).
//
// The outage construction makes it happen: after its operations, one
// client of an ops seed in two (drawn from a stream of its own, so the
// seed's other draws stay as they were) silences its links (World.silence)
// for the whole bound and calls Lock or Do on a key of its own with
// context.Background() and an outage limit of 50–400 ms. Examined: such
// calls. No fault excuses it.
const InvOutageBound = "outage-bound"

func init() {
	examinedIn[InvOutageBound] = func(sc *Scenario) bool { return sc.OpsWork }
}

// attemptBound is the longest one attempt of s may take with a ctx
// without a deadline: the call bound (quorum's node timeout, whose round
// deadline a round shares with rounds started up to fanout.DeadlineSlack
// later; single's redlease.DefaultCallBound), plus the WAIT timeout on
// failover (WAIT runs in the same round trip; the simulator keeps the
// default).
func (w *World) attemptBound(s redlease.Strategy) time.Duration {
	b := callBound(s)
	switch w.sc.Strategy {
	case Quorum:
		// An acquisition by a strategy that has not identified its nodes
		// (a new one, or one whose nodes did not all answer) first asks
		// them, for at most a quarter of the node timeout (the
		// CallBound): quorum.identify.
		b += b/4 + fanout.DeadlineSlack(b)
	case Failover:
		b += failover.DefaultWaitTimeout
	}
	return b
}

// outagePlan reports whether client ci runs the outage construction.
func (w *World) outagePlan(ci int) bool {
	if w.ops == nil {
		return false
	}
	r := rand.New(rand.NewPCG(w.seed, 0x07a9e))
	return r.IntN(2) == 0 && r.IntN(w.sc.Clients) == ci
}

// outage runs the outage construction for e's client (see
// InvOutageBound).
func (w *World) outage(e *opsEnv) {
	if !w.outagePlan(e.ci) {
		return
	}
	const seq = 950
	r := rand.New(rand.NewPCG(w.seed, 0x07a90+uint64(e.ci)))
	key := fmt.Sprintf("ou%d", e.ci)
	limit := ms(r, 50, 400)
	locker := e.lw
	if r.IntN(2) == 0 {
		locker = e.le
	}
	s := e.strat
	bound := max(limit, w.attemptBound(s))
	ttl := e.drawTTL(r)
	via := []string{"lock", "do"}[r.IntN(2)]
	opts := append(e.lockOpts(ttl), retryAtOnce(), redlease.WithOutageLimit(limit))
	w.silence(e.ci, bound+50*time.Millisecond)
	ctx := w.jitterCtx(context.Background(), e.ci, jitOpsLock, seq) // no deadline
	start := w.hist.now()
	var err error
	ran := false
	if via == "lock" {
		var lk *redlease.Lock
		lk, err = locker.Lock(ctx, key, opts...)
		if lk != nil {
			ran = true
		}
	} else {
		err = locker.Do(ctx, key, func(context.Context, *redlease.Lock) error {
			ran = true
			return nil
		}, opts...)
	}
	now := w.hist.now()
	w.hist.ex.count(InvOutageBound, 1)
	w.hist.logf("c%d#%d outage %s %s (limit %v, bound %v): returned after %.3fms: %v", e.ci, seq, via, key, limit, bound, msf(now-start), short(err))
	if ran || !errors.Is(err, redlease.ErrUnavailable) || now > start+bound+boundSlack {
		w.hist.violation(Violation{Inv: InvOutageBound, At: now, Detail: fmt.Sprintf(
			"c%d %s %s (%s) without a deadline, its links silent, outage limit %v: returned at %.3fms, %.3fms after its call (bound %v + %v), granted %v, error %v",
			e.ci, via, key, stratName(s), limit, msf(now), msf(now-start), bound, boundSlack, ran, err)})
	}
}
