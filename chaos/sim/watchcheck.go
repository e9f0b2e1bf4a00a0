package sim

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/redlease/redlease/internal/renewal"
)

// WatchStats are the watchdog-mixed figures of one run (see the package
// doc, "Invariants"): what happened to locks whose key a badkey fault
// overwrote, to healthy locks, and to renewals sent to a node answering
// script calls with a fast error.
type WatchStats struct {
	// Healthy: holds whose key no badkey fault touched while they ran
	// and whose strategy kept a majority of its nodes (single: its node)
	// free of every fault the schedule has (delay, loss, pause,
	// blackhole, cut, errnode, a partition of their client, a hash in
	// their key); HealthyLost: of those, lost while fn ran.
	Healthy, HealthyLost int
	// Bystander: healthy holds that ran while a badkey or errnode fault
	// hit another key or node (or a minority of their own nodes);
	// BystanderLost: of those, lost while fn ran.
	Bystander, BystanderLost int
	// Protected: healthy holds that the network and the faults left the
	// nodes and the time to renew (health.go); ProtectedLost: of those,
	// lost (each a healthy-lost violation). The other healthy holds lost,
	// by class: granted on so few nodes that faults on a minority of the
	// strategy's nodes left too few holding it (LostFew), a renewal
	// message lost on a node they needed while fn ran (LostMsg) or before
	// the grant, within callLinger (LostBefore), a validity at grant shorter than the slowest renewal the
	// noise can draw (LostGrant; LostGrantSpiked: a renewal message of
	// theirs did take a spike), a TTL too short for it (LostTTL,
	// LostTTLSpiked).
	Protected, ProtectedLost                                                         int
	LostFew, LostMsg, LostBefore, LostGrant, LostGrantSpiked, LostTTL, LostTTLSpiked int
	// BadHeld: holds whose token a badkey fault replaced on enough nodes
	// that a quorum no longer held it; BadLost: of those, lost while fn
	// ran; BadWrongType: their Err names WRONGTYPE (a renewal saw the
	// hash).
	BadHeld, BadLost, BadWrongType int
	// BadMinority: holds whose token was replaced on a minority of their
	// nodes only (a quorum lock that should survive); BadMinorityLost: of
	// those, lost while fn ran.
	BadMinority, BadMinorityLost int
	// ErrRenews: renewal calls (extend, extendmany) per lock answered by
	// an errnode fault, timed when the client sent them (a message can be
	// delayed past the next one's send); MaxLockPerSec: the most of them for one lock on
	// one node in one virtual second; MaxNodePerSec: the most script
	// calls one erroring node answered in one virtual second.
	ErrRenews, MaxLockPerSec, MaxNodePerSec int
	// Moved: commands a Cluster master refused as another master's (MOVED,
	// or a script's non-local key). The topology never changes, so any is
	// a key the library or go-redis routed to the wrong master.
	Moved int
	// MinGapRatio: the closest two renewals of one lock to an erroring
	// node came, as a share of the retry delay min(interval/4, 250 ms)
	// (0: no lock was renewed twice there).
	MinGapRatio float64
}

func (s *WatchStats) add(o WatchStats) {
	s.Healthy += o.Healthy
	s.HealthyLost += o.HealthyLost
	s.Bystander += o.Bystander
	s.BystanderLost += o.BystanderLost
	s.BadHeld += o.BadHeld
	s.BadLost += o.BadLost
	s.BadWrongType += o.BadWrongType
	s.BadMinority += o.BadMinority
	s.BadMinorityLost += o.BadMinorityLost
	s.ErrRenews += o.ErrRenews
	s.Protected += o.Protected
	s.ProtectedLost += o.ProtectedLost
	s.LostMsg += o.LostMsg
	s.LostFew += o.LostFew
	s.LostBefore += o.LostBefore
	s.LostGrant += o.LostGrant
	s.LostGrantSpiked += o.LostGrantSpiked
	s.LostTTL += o.LostTTL
	s.LostTTLSpiked += o.LostTTLSpiked
	s.Moved += o.Moved
	s.MaxLockPerSec = max(s.MaxLockPerSec, o.MaxLockPerSec)
	s.MaxNodePerSec = max(s.MaxNodePerSec, o.MaxNodePerSec)
	if o.MinGapRatio > 0 && (s.MinGapRatio == 0 || o.MinGapRatio < s.MinGapRatio) {
		s.MinGapRatio = o.MinGapRatio
	}
}

// checkWatch checks the watchdog workload's holds against the badkey and
// errnode faults (after the run, from the history and the nodes'
// records): a lock whose token was replaced on too many nodes is not
// believed held past the moment a quorum stopped holding it
// (held-past-expiry), and an erroring node gets a lock's renewals no more
// often than the retry delay (renew-busy-retry). Losses of healthy locks
// are counted, not failed: random message loss and delay spikes hit every
// lock, so "healthy" does not promise survival.
func (w *World) checkWatch() ([]Violation, WatchStats) {
	var st WatchStats
	if !w.sc.Watchdog {
		return nil, st
	}
	w.hist.mu.Lock()
	holds := slices.Clone(w.hist.holds)
	w.hist.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	var vs []Violation
	ttlOf := map[string]time.Duration{}
	for _, hd := range holds {
		if hd.Strat == "" {
			continue
		}
		ttlOf[hd.Token] = hd.TTL
		nodes, q := w.holdNodes(hd.Strat, hd.Key)
		lost := hd.LostAt >= 0
		// Badkey: the nodes on which this lock's token was replaced.
		var exps []time.Duration
		seen := map[int]bool{}
		for _, b := range w.badHits {
			if b.key == hd.Key && b.token == hd.Token && !seen[b.node] {
				seen[b.node] = true
				exps = append(exps, b.exp)
			}
		}
		if k := len(exps); k > 0 {
			if len(nodes)-k < q {
				// A quorum holds it while enough replaced nodes' tokens
				// would still be there (the others counted as holding).
				slices.SortFunc(exps, func(a, b time.Duration) int { return cmp.Compare(b, a) })
				real := exps[q-(len(nodes)-k)-1]
				st.BadHeld++
				if lost {
					st.BadLost++
				}
				if hd.WrongType {
					st.BadWrongType++
				}
				if hd.To > real {
					vs = append(vs, Violation{Inv: InvPastExpiry, At: real, Detail: fmt.Sprintf("%s: its token was replaced by a hash on %d of %d nodes; a quorum stopped holding it at %.3fms, but it was believed held until %.3fms (fn ended %.3fms, Lost %.3fms)",
						hd, k, len(nodes), msf(real), msf(hd.To), msf(hd.End), msf(hd.LostAt))})
				}
			} else {
				st.BadMinority++
				if lost {
					st.BadMinorityLost++
				}
			}
			continue
		}
		// Healthy: count the strategy's nodes that any fault touched
		// while fn ran.
		faulted := map[int]bool{}
		other := false
		for _, f := range w.faults {
			var win [2]time.Duration
			switch f.Kind {
			case FaultCut:
				win = [2]time.Duration{f.At, f.At + time.Nanosecond}
			default:
				win = [2]time.Duration{f.At, f.At + f.For}
			}
			if win[1] <= hd.From || win[0] >= hd.End {
				continue
			}
			var hit []int
			switch f.Kind {
			case FaultPartition:
				if f.Client == hd.Client {
					hit = f.Nodes
				}
			case FaultCut:
				if f.Client < 0 || f.Client == hd.Client {
					hit = []int{f.Node}
				}
			case FaultBadKey:
				other = true // its own key: by the hash windows below
			case FaultErrNode:
				other = true
				hit = []int{f.Node}
			default:
				hit = []int{f.Node}
			}
			for _, i := range hit {
				if slices.Contains(nodes, i) {
					faulted[i] = true
				}
			}
		}
		for _, h := range w.hashes {
			if h.key == hd.Key && h.from < hd.End && h.to > hd.From {
				faulted[h.node] = true
			}
		}
		if len(faulted) > len(nodes)-q {
			continue
		}
		st.Healthy++
		class, protected, d := w.healthClass(hd, nodes, q, faulted)
		spiked := d > baseDelay+baseJitter
		if protected {
			st.Protected++
		}
		if lost {
			st.HealthyLost++
			first, steady := renewWindows(hd)
			w.hist.logf("healthy lock lost (%s): %s ttl=%v, renewal windows first %.3fms steady %.3fms (need %.3fms: longest delay %.3fms), faulted nodes %v, held on %v: %s",
				class, hd, hd.TTL, msf(first), msf(steady), msf(needWindow(d)), msf(d), slices.Sorted(maps.Keys(faulted)), hd.HeldOn, hd.Cause)
			switch class {
			case "granted on too few nodes":
				st.LostFew++
			case "message lost":
				st.LostMsg++
			case "message lost before the grant":
				st.LostBefore++
			case "validity at grant short":
				st.LostGrant++
				if spiked {
					st.LostGrantSpiked++
				}
			case "ttl short":
				st.LostTTL++
				if spiked {
					st.LostTTLSpiked++
				}
			default:
				st.ProtectedLost++
				vs = append(vs, Violation{Inv: InvHealthyLost, At: hd.LostAt, Detail: fmt.Sprintf("%s (%s, ttl %v) was lost at %.3fms though protected: faults touched %v of its nodes %v (at most %d may be), it was granted on %v, no message between its client and them was lost, and its renewal windows (first %.3fms, then %.3fms) were at least %.3fms (the longest delay drawn %.3fms): %s",
					hd, hd.Key, hd.TTL, msf(hd.LostAt), slices.Sorted(maps.Keys(faulted)), nodes, len(nodes)-q, hd.HeldOn, msf(first), msf(steady), msf(needWindow(d)), msf(d), hd.Cause)})
			}
		}
		if other {
			st.Bystander++
			if lost {
				st.BystanderLost++
			}
		}
	}
	// Errnode: renewals of one lock to one erroring node.
	type lockAt struct {
		node       int
		key, token string
	}
	calls := map[lockAt][]time.Duration{}
	var order []lockAt
	for _, c := range w.renews {
		k := lockAt{c.node, c.key, c.token}
		if _, ok := calls[k]; !ok {
			order = append(order, k)
		}
		calls[k] = append(calls[k], c.sent)
	}
	st.ErrRenews = len(w.renews)
	for _, k := range order {
		ats := calls[k]
		slices.Sort(ats)
		perSec := map[time.Duration]int{}
		for _, at := range ats {
			perSec[at/time.Second]++
			st.MaxLockPerSec = max(st.MaxLockPerSec, perSec[at/time.Second])
		}
		ttl, ok := ttlOf[k.token]
		if !ok {
			continue
		}
		delay := renewal.RetryDelay(time.Duration(float64(ttl) * renewal.DefaultFraction))
		for i := 1; i < len(ats); i++ {
			if r := float64(ats[i]-ats[i-1]) / float64(delay); st.MinGapRatio == 0 || r < st.MinGapRatio {
				st.MinGapRatio = r
			}
		}
		// The single strategy's node gets one request per renewal call, sent
		// when the call starts: two must be a retry delay apart. A quorum
		// node's requests wait in its fan-out queue while its workers wait
		// for earlier (delayed) replies and then go out bunched (up to four
		// within 2 ms seen in 5,000 seeds, with rounds at their normal
		// pace): for quorum nodes the per-second count is reported
		// (MaxLockPerSec), not failed.
		if k.node < w.sc.Nodes {
			continue
		}
		for i := 1; i < len(ats); i++ {
			if ats[i]-ats[i-1] < delay {
				vs = append(vs, Violation{Inv: InvBusyRetry, At: ats[i], Detail: fmt.Sprintf("node%d %s (token %s, ttl %v): renewals sent at %.3fms and %.3fms, %v apart, both answered with an error by the node; the retry delay is %v",
					k.node, k.key, k.token, ttl, msf(ats[i-1]), msf(ats[i]), ats[i]-ats[i-1], delay)})
				break
			}
		}
	}
	for _, n := range w.errCalls {
		st.MaxNodePerSec = max(st.MaxNodePerSec, n)
	}
	st.Moved = w.moved
	return vs, st
}
