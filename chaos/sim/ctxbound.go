package sim

import (
	"fmt"
	"time"
)

// InvCtxBound: TryLock, Lock, Extend, ExtendAll and Release, called with
// a ctx deadline, return by that deadline plus boundSlack, whatever the
// nodes do. Checked where the workloads make those calls with a deadline
// (lockClient, wakeClient, the ops clients). No fault excuses it.
const InvCtxBound = "ctx-bound"

// ExCtxAcquire: acquisitions (TryLock, Lock) among the calls checked.
const ExCtxAcquire = InvCtxBound + "/acquire"

func init() {
	examinedIn[InvCtxBound] = func(sc *Scenario) bool {
		return !sc.Barrier && !sc.Watchdog && sc.Client == nil || sc.Wake || sc.Watchdog && sc.Cluster
	}
}

// checkCtx checks ctx-bound for one call of client ci made at start with
// a ctx deadline d later, returned now. acquire: TryLock or Lock, counted
// apart too (ExCtxAcquire).
func (w *World) checkCtx(ci int, what, key string, start, d time.Duration, acquire bool) {
	if acquire {
		w.hist.ex.count(ExCtxAcquire, 1)
	}
	now := w.hist.now()
	w.hist.ex.count(InvCtxBound, 1)
	if now > start+d+boundSlack {
		w.bnd.mu.Lock()
		cte := w.bnd.cte[ci]
		w.bnd.mu.Unlock()
		w.hist.violation(Violation{Inv: InvCtxBound, At: now, Detail: fmt.Sprintf(
			"c%d %s %s called at %.3fms with a ctx of %v returned at %.3fms, %.3fms past its deadline (+ %v; %s, ContextTimeoutEnabled %v)",
			ci, what, key, msf(start), d, msf(now), msf(now-start-d), boundSlack, w.sc.Strategy, cte)})
	}
}

// noteCTE records whether client ci's go-redis clients to the lock nodes
// have ContextTimeoutEnabled, for ctx-bound's report.
func (w *World) noteCTE(ci int, ct bool) {
	b := &w.bnd
	b.mu.Lock()
	if b.cte == nil {
		b.cte = map[int]bool{}
	}
	b.cte[ci] = ct
	b.mu.Unlock()
}
