package sim

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/redlease/redlease"
)

// Quorum nodes whose lines have different heads (fair-quorum3).
//
// A fair Lock's attempt joins (or refreshes) its waiter's entry on every
// node it reaches; a grant removes the winner's entry on the nodes that
// granted, a release on every node it reaches. An attempt's request that
// reaches a node after its Lock call was granted and released puts the
// waiter's entry back there, at its first ticket, ahead of every waiter
// that came later, and nobody refreshes or removes it: a leftover. While
// it lives, that node refuses everyone else a free key (Queued); with
// leftovers on a majority, every waiter is refused a majority although
// one node admits them: the nodes' heads differ, and the key stays free
// until the leftovers expire, one LineLifetime after their last refresh
// (docs/fair-mode.md, "Quorum nodes with different heads"). make sim on
// 64fc9f0 met it through two spikes (fair-quorum3 seed 26978: c1's
// attempts sent at 79 and 92 ms reached nodes 1 and 2 at 108 and 118 ms,
// after its grant at 97 ms and release at 107 ms; the key, released at
// 217 ms with two waiters, was next granted at 1172 ms). FaultLateJoin
// makes it on purpose.

// FaultLateJoin: for For, each Acquire of a fair client's Lock attempt
// reaches one node of Nodes (a majority of the quorum), chosen by the
// attempt's token, up to Amount late; its requests to the other nodes are
// on time. An attempt the on-time nodes decide (both refuse) ends without
// the late reply, and its join lands on the late node maybe after the
// Lock call ended; over a few attempts, on more than one node
// (fair-quorum3). It touches no other command, and no other client.
const FaultLateJoin = "latejoin"

// lateJoinFaults draws fair-quorum3's late joins, after wakeSchedule's
// own draws (so that those stay the seed's): one in two seeds gets one,
// on a fair client (every client but the last) and a majority of nodes,
// in the first half of the horizon (the workload's Lock calls).
func lateJoinFaults(r *rand.Rand, sc *Scenario, horizon time.Duration) []Fault {
	if !sc.Fair || sc.Nodes < 3 || r.IntN(2) == 0 {
		return nil
	}
	f := Fault{At: time.Duration(r.Int64N(int64(horizon / 2))), Kind: FaultLateJoin, Node: -1,
		Client: r.IntN(sc.Clients - 1), For: ms(r, 100, 400), Amount: ms(r, 20, 150)}
	f.Nodes = pick(r, sc.Nodes, sc.Nodes/2+1)
	return []Fault{f}
}

// lateJoinDelay is the extra delay a late join adds to a request of c's
// client to c's node sent at (from the run's start): args must be a fair
// Lock attempt's Acquire (one that joins its line), and c's node the one
// of the fault's Nodes its token picks.
func (w *World) lateJoinDelay(c *conn, args []string, at time.Duration, h uint64) time.Duration {
	var extra time.Duration
	for i, f := range w.faults {
		if f.Kind != FaultLateJoin || f.Client != c.client || at < f.At || at >= f.At+f.For {
			continue
		}
		_, argv, ok := acquireLine(args)
		if !ok || len(argv) < 10 || argv[8] != "1" {
			return 0
		}
		if late := f.Nodes[mix(w.seed, contentHash(argv[:1]))%uint64(len(f.Nodes))]; late != c.node.id {
			continue
		}
		extra += time.Duration(unit(mix(h, uint64(40+i))) * float64(f.Amount))
	}
	return extra
}

// queuedRefusal is a node's Queued refusal of a fair attempt: the head
// of the node's live line then, and whether another node's head differed.
type queuedRefusal struct {
	node   int
	key    string
	at     time.Duration
	head   lineEntry
	expiry time.Duration // the head's entry's deadline, on the run's clock
	differ bool          // another node's last read head was not this one
}

// nodeHead is the head a fair Acquire last read from a node's line.
type nodeHead struct {
	id       string
	deadline float64 // node ms
}

// noteHeads records a node's head as a fair Acquire read it and, for a
// Queued refusal, the refusal. Called with w.fifo.mu held.
func (w *World) noteHeads(nodeID int, ac *acquireCall, at time.Duration, queued bool) {
	r := &w.fifo
	if r.heads == nil {
		r.heads = map[string]map[int]nodeHead{}
	}
	byNode := r.heads[ac.key]
	if byNode == nil {
		byNode = map[int]nodeHead{}
		r.heads[ac.key] = byNode
	}
	var head lineEntry
	if len(ac.line) > 0 {
		head = ac.line[0]
	}
	byNode[nodeID] = nodeHead{id: head.id, deadline: head.deadline}
	if !queued {
		return
	}
	// Refused Queued: the head is the first entry ahead of the attempt.
	head = lineEntry{}
	for _, e := range ac.line {
		if e.id != ac.id {
			head = e
			break
		}
	}
	if head.id == "" {
		return
	}
	q := queuedRefusal{node: nodeID, key: ac.key, at: at, head: head,
		expiry: at + time.Duration((head.deadline-float64(ac.nowMS))*float64(time.Millisecond))}
	for m, nh := range byNode {
		if m == nodeID {
			continue
		}
		if nh.id == "" || nh.deadline <= float64(ac.nowMS) || nh.id != head.id {
			q.differ = true
		}
	}
	r.queued = append(r.queued, q)
}

// ExWakeHeads: handoffs (handoff-late's examined) during which a node
// refused a fair attempt as not the head (Queued) while another node's
// head differed.
const ExWakeHeads = InvHandoffLate + "/heads-differ"

// headsDiffered reports whether a node refused a fair attempt on key
// Queued between from and to while another node's head differed.
func (w *World) headsDiffered(key string, from, to time.Duration) bool {
	w.fifo.mu.Lock()
	defer w.fifo.mu.Unlock()
	for _, q := range w.fifo.queued {
		if q.key == key && q.differ && q.at >= from && q.at <= to {
			return true
		}
	}
	return false
}

// leftoverBound is how late the next grant of key after a release at
// from may come when what held it back were leftovers (see above). Take
// the Queued refusals of key from from to to made while another node's
// head differed, whose head was a waiter whose Lock call had ended
// before the refusal (it left: it will neither refresh nor remove that
// entry) and whose entry was last refreshed after that end (a late join
// put it back: an entry its Lock call's own grant, release or leave
// should have removed excuses nothing; the Wake scenarios lose no
// command, so those always arrive); per node, the latest expiry of such
// a head. The key is free of
// leftovers on a majority once the majority-th earliest of those expiries
// (a node with none: 0) has passed; the bound adds wakeLateBound (the new
// head's Queued wait, at most the max retry delay, and one acquisition).
// ok is false when there was no such refusal: a head that is a live
// waiter, or heads that did not differ, excuse nothing.
func (w *World) leftoverBound(key string, from, to time.Duration) (bound time.Duration, why string, ok bool) {
	w.mu.Lock()
	waits := w.wakeWaits
	w.mu.Unlock()
	w.fifo.mu.Lock()
	defer w.fifo.mu.Unlock()
	expiry := make([]time.Duration, w.sc.Nodes)
	whys := make([]string, w.sc.Nodes)
	for _, q := range w.fifo.queued {
		if q.key != key || !q.differ || q.at < from || q.at > to {
			continue
		}
		fw := w.fifo.attempts[q.head.id]
		if fw == nil || len(fw.ats) == 0 {
			continue
		}
		ended := time.Duration(-1)
		for _, wt := range waits {
			if wt.base == q.head.id {
				ended = wt.to // the head's own call, granted
				break
			}
		}
		for _, wt := range waits {
			// Otherwise the client's call that spans the head's first
			// attempt: one call at a time per client, but for Waiters.
			if ended < 0 && wt.client == fw.client && wt.from <= fw.ats[0] && fw.ats[0] <= wt.to {
				ended = wt.to
			}
		}
		if ended < 0 || ended >= q.at {
			continue // a live waiter (or one the simulator cannot place)
		}
		if refreshed := q.expiry - redlease.LineLifetime(wakeFairDelay[1]); refreshed <= ended {
			continue // left in line by its Lock call itself, not put back by a late join
		}
		ok = true
		if q.expiry > expiry[q.node] {
			expiry[q.node] = q.expiry
			whys[q.node] = fmt.Sprintf("node%d refused at %.3fms as not the head: waiter %s of c%d, whose Lock call ended at %.3fms, its entry (last refreshed at %.3fms) expiring at %.3fms",
				q.node, msf(q.at), q.head.id, fw.client, msf(ended), msf(q.expiry-redlease.LineLifetime(wakeFairDelay[1])), msf(q.expiry))
		}
	}
	if !ok {
		return 0, "", false
	}
	nodes := make([]int, w.sc.Nodes)
	for i := range nodes {
		nodes[i] = i
	}
	slices.SortStableFunc(nodes, func(a, b int) int { return cmp.Compare(expiry[a], expiry[b]) })
	clear := nodes[w.sc.Nodes/2] // the majority-th earliest
	if expiry[clear] == 0 {
		return 0, "", false // leftovers on a minority only: they held nothing back
	}
	return expiry[clear] + w.wakeLateBound(), whys[clear], true
}
