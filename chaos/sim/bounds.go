package sim

import (
	"fmt"
	"time"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/primary"
	"github.com/redlease/redlease/quorum"
)

// Bound invariants: calls that promise to return within a bound do, on
// the virtual clock, whatever the nodes do meanwhile. No fault excuses a
// bound (a violation names no hold, so no scope covers it).
//
//   - do-bound: Locker.Do returns within its release bound of fn's
//     return: the strategy's call bound (redlease.CallBounder: quorum's
//     node timeout; redlease.DefaultCallBound, 1 s, for a strategy that
//     states none) plus boundSlack.
//   - close-bound: a strategy's Close returns within its documented
//     bound (quorum: two node timeouts; single and failover:
//     primary.CloseWait) plus boundSlack, at the end of a run and where a
//     workload closes a strategy mid-run (opsClose).
//
// Both count what they examined, and the calls that took their whole
// bound (a release or a subscription that did not answer in time); the
// situations where a bound matters are made to happen by constructions
// (boundwork.go).
const (
	InvDoBound    = "do-bound"
	InvCloseBound = "close-bound"
	// ExDoSilent: Do calls whose release was sent into a silence of the
	// client's links (the silent release).
	ExDoSilent = InvDoBound + "/silent"
	// ExCloseDialing: strategy Closes called while a subscription
	// connection of the strategy was being dialed to a node that held its
	// handshake past the Close's bound (dial-close).
	ExCloseDialing = InvCloseBound + "/dialing"
	// ExDoAtBound, ExCloseAtBound: calls that took their whole bound (a
	// release or a hub that did not answer in time).
	ExDoAtBound    = InvDoBound + "/at-bound"
	ExCloseAtBound = InvCloseBound + "/at-bound"
)

// boundSlack is what a bound allows past itself. On the virtual clock a
// bound is exact: the library's timers fire at their instant and every
// step between them (the scheduler's deliveries, the observer's and the
// workload's clock reads, Do's deferred work after fn) takes no virtual
// time, so a call bounded by a timer returns at that timer's instant.
// The millisecond only absorbs a timer that the library rounds or
// restarts.
const boundSlack = time.Millisecond

func init() {
	examinedIn[InvDoBound] = func(sc *Scenario) bool { return sc.Watchdog || sc.Strategy == Failover && sc.Idem == "" || sc.OpsWork }
	examinedIn[InvCloseBound] = func(sc *Scenario) bool {
		return sc.Strategy == Quorum || sc.Strategy == Single && (sc.Wake || sc.OpsWork)
	}
}

// callBound is s's call bound, as Locker.Do's release uses it.
func callBound(s redlease.Strategy) time.Duration {
	if b, ok := s.(redlease.CallBounder); ok && b.CallBound() > 0 {
		return b.CallBound()
	}
	return redlease.DefaultCallBound
}

// stratName is s's name for observers (redlease.Namer), as the Locker reports it.
func stratName(s redlease.Strategy) string {
	if n, ok := s.(redlease.Namer); ok {
		return n.Name()
	}
	return fmt.Sprintf("%T", s)
}

// closeBound is s's documented Close bound.
func closeBound(s redlease.Strategy) time.Duration {
	if q, ok := s.(*quorum.Strategy); ok {
		return 2 * q.CallBound()
	}
	return primary.CloseWait
}

// checkDo checks do-bound for one Do call that ran fn: fn returned at
// fnRet, Do at now. silent: its release was sent into a silence.
func (w *World) checkDo(ci, seq int, key string, s redlease.Strategy, ttl, fnRet time.Duration, silent bool) {
	now := w.hist.now()
	bound := callBound(s)
	w.hist.ex.count(InvDoBound, 1)
	if silent {
		w.hist.ex.count(ExDoSilent, 1)
	}
	took := now - fnRet
	if took >= bound {
		w.hist.ex.count(ExDoAtBound, 1)
	}
	w.hist.logf("c%d#%d do %s: released %.3fms after fn returned (bound %v)", ci, seq, key, msf(took), bound)
	if took > bound+boundSlack {
		w.hist.violation(Violation{Inv: InvDoBound, At: now, Detail: fmt.Sprintf(
			"c%d#%d Do %s (%s, ttl %v): fn returned at %.3fms, Do at %.3fms: its release took %.3fms, past the call bound %v + %v",
			ci, seq, key, stratName(s), ttl, msf(fnRet), msf(now), msf(took), bound, boundSlack)})
	}
}

// closeStrategy calls close, s's Close, and checks close-bound. what
// says where (end of run, mid-run, dial-close).
func (w *World) closeStrategy(ci int, what string, s redlease.Strategy, close func() error) time.Duration {
	start := w.hist.now()
	_ = close()
	took := w.hist.now() - start
	bound := closeBound(s)
	w.hist.ex.count(InvCloseBound, 1)
	if took >= bound {
		w.hist.ex.count(ExCloseAtBound, 1)
	}
	w.hist.logf("c%d %s strategy closed (%s) in %.3fms (bound %v)", ci, stratName(s), what, msf(took), bound)
	if took > bound+boundSlack {
		w.hist.violation(Violation{Inv: InvCloseBound, At: w.hist.now(), Detail: fmt.Sprintf(
			"c%d's %s strategy Close (%s) called at %.3fms took %.3fms, past its bound %v + %v",
			ci, stratName(s), what, msf(start), msf(took), bound, boundSlack)})
	}
	return took
}
