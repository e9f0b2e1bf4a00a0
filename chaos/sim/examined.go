package sim

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
)

// An invariant that examined nothing cannot fail: each one counts what it
// examined in a run (Result.Examined, by invariant name), the tally sums
// the counts per scenario, and TestSim fails when an invariant that
// applies to a scenario (examinedIn) examined nothing over the seeds of
// that scenario it ran, if they were at least minExaminedSeeds.

// Counts kept beside an invariant's own, named "<invariant>/<what>":
// registered in examinedIn when they must not stay at zero either.
const (
	// ExFailoverBound: holds failover-kept checked against the watcher
	// bound (still believed when a healthy Sentinel named the last move:
	// FailoverStats.Revoked).
	ExFailoverBound = InvFailoverKept + "/bound"
	// ExStateExempt: checks of a lock believed valid that state-valid
	// left to failover-kept (a grant of a primary a later move replaced),
	// or whose granting node the simulator did not see.
	ExStateExempt = InvStateValid + "/exempt"
	// ExStateLocks: locks state-valid tracked (every grant a workload
	// saw, and the Barrier's locks while a keeper kept them).
	ExStateLocks = InvStateValid + "/locks"
	// ExStateReplicas: checks of a failover lock that read its primary's
	// replica too.
	ExStateReplicas = InvStateValid + "/replicas"
	// exStateStood, exStateStoodWrong: with Options.verifyReadings
	// (tests), node readings state-valid let stand, and those a fresh
	// reading contradicted.
	exStateStood      = InvStateValid + "/stood"
	exStateStoodWrong = InvStateValid + "/stood-wrong"
)

// minExaminedSeeds is how many seeds of a scenario TestSim needs before an
// invariant that examined nothing there fails it.
const minExaminedSeeds = 50

// examinedIn says, per invariant that counts what it examined, to which
// scenarios it applies. An invariant added elsewhere registers here (its
// name and its scenarios) and counts in its check with
// w.hist.ex.count(name, n), or in World.examined from its figures.
var examinedIn = map[string]func(sc *Scenario) bool{
	// Pairs of holds of one key compared.
	InvOverlap: func(sc *Scenario) bool { return !sc.Barrier },
	// Pairs of holds of one key, the second granted after the first
	// ended, whose fences were compared.
	InvFenceOrder: func(sc *Scenario) bool { return !sc.Barrier && sc.fenced() },
	// Accepted register writes compared with the last accepted one of
	// their key (an unfenced strategy's fence, 0, is never accepted).
	InvStale: func(sc *Scenario) bool { return !sc.Barrier && sc.fenced() },
	// Holds whose Release was sent.
	// watchdog-mixed releases through Locker.Do, which the workload does
	// not see.
	InvReleaseKept: func(sc *Scenario) bool { return !sc.Barrier && !sc.Watchdog },
	// Effects the fenced effect store accepted, each checked against the
	// earlier runs of its key.
	InvTwice: func(sc *Scenario) bool { return sc.Barrier },
	// Pairs of handler spans of one key compared.
	InvHandlerOverlap: func(sc *Scenario) bool { return sc.Barrier },
	// Quorum reads of a lock that said it was Valid (checkHeld), and
	// holds whose token badkey replaced on enough nodes that a quorum
	// stopped holding it.
	InvPastExpiry: func(sc *Scenario) bool { return sc.Watchdog },
	// Renewals answered by an errnode fault.
	InvBusyRetry: func(sc *Scenario) bool { return sc.Watchdog },
	// Protected holds.
	InvHealthyLost: func(sc *Scenario) bool { return sc.Watchdog },
	// Confirmed releases with a client waiting.
	InvHandoffLate: func(sc *Scenario) bool { return sc.Wake },
	// Of those, the ones with no pub/sub fault around them.
	InvWakeSlow: func(sc *Scenario) bool { return sc.Wake },
	// Of those, the ones during which a node refused a fair attempt as
	// not the head while another node's head differed (heads.go).
	ExWakeHeads: func(sc *Scenario) bool { return sc.Wake && sc.Fair && sc.Nodes >= 3 },
	// Holds the old primary granted (FailoverStats.examined).
	InvFailoverKept: func(sc *Scenario) bool { return sc.Strategy == Failover && sc.Idem == "" },
	// Of those, the ones checked against the watcher bound.
	ExFailoverBound: func(sc *Scenario) bool { return sc.Strategy == Failover && sc.Idem == "" },
	// Checks of a lock its holder believed valid (statecheck.go): every
	// scenario's workload tracks its locks (the Barrier's through its
	// keeper).
	InvStateValid: func(*Scenario) bool { return true },
	// Of those, checks of a failover lock that read its replica.
	ExStateReplicas: func(sc *Scenario) bool { return sc.Strategy == Failover && sc.Idem == "" },
	// Free-key grants a node applied to a fair attempt (fifo.go).
	InvFIFO: func(sc *Scenario) bool { return sc.Fair },
}

// examinedCounts is a run's counts by invariant, guarded by its own
// mutex (a leaf: taken under history.mu and World.mu).
type examinedCounts struct {
	mu sync.Mutex
	n  map[string]int
}

// count adds n to what invariant inv examined in this run.
func (e *examinedCounts) count(inv string, n int) {
	if n == 0 {
		return
	}
	e.mu.Lock()
	if e.n == nil {
		e.n = map[string]int{}
	}
	e.n[inv] += n
	e.mu.Unlock()
}

// examined returns the run's counts: those the checks counted as they
// went, and those read from the scenarios' figures.
func (w *World) examined(res *Result) map[string]int {
	w.hist.ex.mu.Lock()
	out := maps.Clone(w.hist.ex.n)
	w.hist.ex.mu.Unlock()
	if out == nil {
		out = map[string]int{}
	}
	add := func(inv string, n int) {
		if n > 0 {
			out[inv] += n
		}
	}
	add(InvPastExpiry, res.Watch.BadHeld)
	add(InvBusyRetry, res.Watch.ErrRenews)
	add(InvHealthyLost, res.Watch.Protected)
	add(InvHandoffLate, res.Wake.Handoffs)
	add(InvWakeSlow, res.Wake.NoFault)
	add(ExWakeHeads, res.Wake.HeadsDiffer)
	add(InvFailoverKept, res.Failover.examined())
	add(ExFailoverBound, res.Failover.Revoked)
	st := w.stateResult()
	add(InvStateValid, st.Examined)
	add(ExStateExempt, st.Exempt)
	add(ExStateLocks, st.Locks)
	add(ExStateReplicas, st.Replicas)
	add(exStateStood, st.Stood)
	add(exStateStoodWrong, st.StoodWrong)
	return out
}

// examinedNothing lists, for a scenario that ran at least
// minExaminedSeeds seeds, the invariants that apply to it and examined
// nothing over them.
func examinedNothing(name string, seeds int, counts map[string]int) []string {
	sc, ok := ScenarioByName(name)
	if !ok || seeds < minExaminedSeeds {
		return nil
	}
	var out []string
	for _, inv := range slices.Sorted(maps.Keys(examinedIn)) {
		if examinedIn[inv](&sc) && counts[inv] == 0 {
			out = append(out, inv)
		}
	}
	return out
}

// examinedLine formats counts, invariants sorted by name.
func examinedLine(counts map[string]int) string {
	var b strings.Builder
	for i, inv := range slices.Sorted(maps.Keys(counts)) {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", inv, counts[inv])
	}
	return b.String()
}
