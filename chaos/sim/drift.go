package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/drift"
)

// FaultDrift: a clock runs at the wrong rate for a while. On a node
// (Node, or Nodes: failover's primary and replica together) its clock
// runs at rate 1+Rate: key TTLs run out 1/(1+Rate) as fast in virtual
// time. On a client (Client) the redlease.Clock its Locker, strategy and
// keepers read runs at rate 1−Rate. A positive Rate is the dangerous
// direction on both (a node that expires keys early, a client that
// believes longer). Inside the assumptions while the fastest node's Rate
// plus the slowest client's Rate stays within the drift factor of every
// strategy of the seed (drawn up to 0.9 of the smallest); a rate beyond
// it is OUTSIDE.
const FaultDrift = "clock-drift"

// rateWin is one window of a clock's rate: from, to (virtual time since
// the run's start) and the rate's excess rho (the clock advances 1+rho
// per virtual second).
type rateWin struct {
	from, to time.Duration
	rho      float64
	outside  bool // a rate beyond the drift factor (OUTSIDE)
}

// skewAt is how far a clock with windows ws is ahead of the virtual clock
// at v: the sum of rho·(time spent in each window by v).
func skewAt(ws []rateWin, v time.Duration) time.Duration {
	var s float64
	for _, w := range ws {
		if v <= w.from {
			continue
		}
		s += w.rho * float64(min(v, w.to)-w.from)
	}
	return time.Duration(s)
}

// invertAt returns the virtual time v ≥ v0 at which a clock with windows
// ws reads target (its reading at v is v + skewAt(ws, v)); v0 if it
// already did. The clock is piecewise linear and strictly increasing
// (every rate is positive), so one walk over the windows' edges finds it.
func invertAt(ws []rateWin, v0, target time.Duration) time.Duration {
	cur := v0
	val := float64(v0 + skewAt(ws, v0))
	t := float64(target)
	if t <= val {
		return v0
	}
	var edges []time.Duration
	for _, w := range ws {
		if w.from > cur {
			edges = append(edges, w.from)
		}
		if w.to > cur {
			edges = append(edges, w.to)
		}
	}
	slices.Sort(edges)
	for _, e := range edges {
		slope := 1.0
		for _, w := range ws {
			if w.from <= cur && cur < w.to {
				slope += w.rho
			}
		}
		if next := val + slope*float64(e-cur); next >= t {
			return cur + time.Duration((t-val)/slope)
		} else {
			val, cur = next, e
		}
	}
	return cur + time.Duration(t-val)
}

// driftPlan is a run's clock rates: per node and per client, their
// windows (client windows hold −Rate: the client clock runs at 1−Rate).
type driftPlan struct {
	node   map[int][]rateWin
	client map[int][]rateWin
}

// nodeSkew is node id's clock's lead over the virtual clock from its
// rate windows (its jumps are its offset) at now.
func (w *World) nodeSkew(id int, now time.Time) time.Duration {
	ws := w.drift.node[id]
	if ws == nil {
		return 0
	}
	return skewAt(ws, now.Sub(w.start))
}

// nodeVirtualAfter is the virtual time (since the start) at which node
// id's clock, read at v, has advanced by d: when a key with d left there
// expires. It foresees the rate windows inside the assumptions, and of
// those OUTSIDE only the ones begun by v: a violation an OUTSIDE fault
// causes is seen once the fault began (each window's start is an action,
// after which every lock is checked), so that it is graded a hazard. Jumps
// (OUTSIDE) are the node's offset: the check after a jump sees its effect.
func (w *World) nodeVirtualAfter(id int, v, d time.Duration) time.Duration {
	ws := w.drift.node[id]
	if ws == nil {
		return v + d
	}
	for _, win := range ws {
		if win.outside && win.from > v {
			ws = slices.DeleteFunc(slices.Clone(ws), func(x rateWin) bool { return x.outside && x.from > v })
			break
		}
	}
	return invertAt(ws, v, v+skewAt(ws, v)+d)
}

// simClock is a client's clock with rate windows: the redlease.Clock its
// Locker, strategy and keepers read.
type simClock struct {
	w  *World
	ci int
}

// Now is the virtual clock plus the client's skew.
func (c simClock) Now() time.Time {
	now := time.Now()
	return now.Add(skewAt(c.w.drift.client[c.ci], now.Sub(c.w.start)))
}

// clientClock is client ci's clock, or nil if its rate never changes in
// this run (it then keeps the system clock, as before the drift faults).
func (w *World) clientClock(ci int) redlease.Clock {
	if w.drift.client[ci] == nil {
		return nil
	}
	return simClock{w, ci}
}

// clientVirtual is the virtual time (since the start) at which client
// ci's clock reads t: a lock's Until, say, as the simulator's time.
func (w *World) clientVirtual(ci int, t time.Time) time.Duration {
	ws := w.drift.client[ci]
	if ws == nil {
		return t.Sub(w.start)
	}
	now := time.Since(w.start)
	target := t.Sub(w.start)
	if target <= now+skewAt(ws, now) {
		// Already passed: walk back from the start (rare: a past Until).
		return invertAt(ws, 0, target)
	}
	return invertAt(ws, now, target)
}

// untilV is lk's Until as virtual time since the start, read through
// client ci's clock.
func (w *World) untilV(ci int, lk *redlease.Lock) time.Duration {
	return w.clientVirtual(ci, lk.Until())
}

// driftAllowed reports whether sc's seeds draw clock-rate faults: those
// that draw every general fault kind (no Kinds, no schedule of their
// own), those whose Kinds name FaultDrift, and the ops scenarios.
func (sc *Scenario) driftAllowed() bool {
	if !sc.Faults {
		return false
	}
	if sc.OpsWork {
		return true
	}
	if sc.Schedule != nil {
		return false
	}
	return sc.Kinds == nil || slices.Contains(sc.Kinds, FaultDrift)
}

// driftFaults draws a seed's clock-rate faults, from a stream of its own
// (the other faults stay what the seed drew before these existed). fmin
// and fmax are the smallest and largest drift factors the seed's
// strategies use. Half the seeds get none. Otherwise a budget B = 0.9
// fmin is split between the nodes (a share of it, the fastest node's
// bound) and the clients (the rest, the slowest client's bound), so that
// for every client and node the two rates add up to at most B: inside
// the assumptions. One to three windows, on distinct nodes or clients,
// each at 50–100 % of its side's share, fast (the dangerous direction)
// three times in four; half of them last to the end of the run; a node
// window covers a majority of the nodes one time in three (a quorum lock
// then drifts with them). One drift seed in eight also gets a node rate
// of 1.2–3 times fmax: OUTSIDE.
func driftFaults(seed uint64, sc *Scenario, fmin, fmax float64) []Fault {
	if !sc.driftAllowed() {
		return nil
	}
	r := rand.New(rand.NewPCG(seed, 0xd71f7))
	if r.IntN(2) == 0 {
		return nil
	}
	horizon := sc.horizon()
	budget := 0.9 * fmin
	var share float64 // the nodes' share of the budget
	switch k := r.IntN(10); {
	case k < 5:
		share = 1
	case k < 7:
		share = 0
	default:
		share = r.Float64()
	}
	nodes := sc.faultNodes()
	window := func(f *Fault) {
		f.At = time.Duration(r.Int64N(int64(horizon * 3 / 4)))
		if r.IntN(2) == 0 {
			f.For = maxRun // to the end of the run
		} else {
			f.For = ms(r, 100, max(101, int(horizon/time.Millisecond)))
		}
	}
	target := func(f *Fault, node int) {
		f.Node, f.Client = node, -1
		if sc.Strategy == Failover {
			// Primary and replica share one rate: a replicated key's
			// absolute expiry means the same moment on both (see the
			// package doc's gaps).
			f.Node, f.Nodes = -1, []int{fPrimary, fReplica}
		}
	}
	var fs []Fault
	usedNode, usedClient := map[int]bool{}, map[int]bool{}
	for range 1 + r.IntN(3) {
		f := Fault{Kind: FaultDrift}
		window(&f)
		onNode := share == 1 || (share > 0 && r.IntN(2) == 0)
		mag := 0.5 + 0.5*r.Float64()
		sign := 1.0
		if r.IntN(4) == 0 {
			sign = -1
		}
		if onNode {
			n := r.IntN(nodes)
			if sc.Strategy == Failover {
				n = 0
			}
			if usedNode[n] {
				continue
			}
			usedNode[n] = true
			target(&f, n)
			if nodes >= 3 && r.IntN(3) == 0 {
				f.Node, f.Nodes = -1, pick(r, nodes, nodes/2+1)
				for _, i := range f.Nodes {
					if usedNode[i] && i != n {
						f.Nodes = nil
						break
					}
				}
				if f.Nodes == nil {
					continue
				}
				for _, i := range f.Nodes {
					usedNode[i] = true
				}
			}
			f.Rate = sign * mag * share * budget
		} else {
			c := r.IntN(sc.Clients)
			if usedClient[c] {
				continue
			}
			usedClient[c] = true
			f.Node, f.Client = -1, c
			f.Rate = sign * mag * (1 - share) * budget
		}
		if f.Rate == 0 {
			continue
		}
		fs = append(fs, f)
	}
	if r.IntN(8) == 0 {
		f := Fault{Kind: FaultDrift}
		window(&f)
		target(&f, r.IntN(nodes))
		f.Rate = fmax * (1.2 + 1.8*r.Float64())
		f.Outside, f.Why = true, fmt.Sprintf("a node's clock ran %.2f%% fast, beyond the drift factor %.2f", 100*f.Rate, fmin)
		fs = append(fs, f)
	}
	return fs
}

// planDrift turns the schedule's clock-rate faults into rate windows.
func (w *World) planDrift() {
	for _, f := range w.faults {
		if f.Kind != FaultDrift {
			continue
		}
		win := rateWin{from: f.At, to: f.At + f.For, rho: f.Rate, outside: f.Outside}
		if f.Client >= 0 {
			if w.drift.client == nil {
				w.drift.client = map[int][]rateWin{}
			}
			win.rho = -f.Rate
			w.drift.client[f.Client] = append(w.drift.client[f.Client], win)
			continue
		}
		ids := f.Nodes
		if f.Node >= 0 {
			ids = []int{f.Node}
		}
		for _, id := range ids {
			if w.drift.node == nil {
				w.drift.node = map[int][]rateWin{}
			}
			w.drift.node[id] = append(w.drift.node[id], win)
		}
	}
}

// driftFactors are the smallest and largest drift factors of the seed's
// strategies: the ops scenarios draw theirs, every other scenario uses
// the default.
func (w *World) driftFactors() (fmin, fmax float64) {
	if w.ops != nil {
		return w.ops.factorRange()
	}
	return drift.DefaultFactor, drift.DefaultFactor
}

// sortFaults orders a schedule by start time, as makeSchedule does.
func sortFaults(fs []Fault) {
	slices.SortStableFunc(fs, func(a, b Fault) int { return int(a.At - b.At) })
}
