package sim

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redlease/redlease/internal/script"
)

// InvFIFO (fair scenarios): a node granted a free key to a fair attempt
// that was not the head of the key's line on that node.
//
// What fair mode promises (the root package's doc, strategy.go's Queuer):
// fairness only adds refusals; a free key is refused to anyone but the
// head of a non-empty line, after entries past their deadline are purged;
// the order is by the client-chosen ticket, ties by id. The check reads
// it per node, from the node's own state, just before the node applies an
// Acquire of a fair attempt (Lock in fair mode joins or refreshes its
// entry; TryLock in fair mode and a Lock attempt after ErrUnavailable
// only respect the line): the lock key, and the line's entries whose
// deadline (in the node's TIME) has not passed. If the node then grants
// a free key (the key was absent: not a refresh of the same token, not
// the takeover of an earlier attempt of the same Lock call, which skip
// the line by design), the attempt must be the head of those live
// entries, with its own entry (at the ticket it sent, if it joins) among
// them, or there must be none. Any live entry ahead of it is a violation.
//
// What it leaves out, because fair mode does not promise it: attempts
// without fairness (the scenario's last client: it ignores the line,
// counted as Unfair); a line that lost or never got a waiter's entry on
// some node (a join in flight or lost, a restart: lines are not kept by
// snapshots or restarts here) or whose entry expired or was removed
// there: the check reads what the node has, so a waiter missing from the
// node's line is not ahead of anyone there (locks granted that way, with
// that waiter still attempting before and after the grant, are counted as
// Missed: fairness misses the design admits). No fault excuses a
// violation: the rule holds on every node whatever its line holds.
const InvFIFO = "fifo"

// FairStats are the fifo check's figures of one run.
type FairStats struct {
	Grants int // free-key grants nodes applied to fair attempts (each checked)
	Lined  int // of those, with a live entry of another waiter in the node's line
	// Missed: locks granted to fair attempts (holds) with, on one of the
	// nodes that granted them, a waiter of an earlier ticket missing from
	// the node's live line though it attempted before and after that
	// node's grant (a join still in flight or lost, a line lost with a
	// restart, an entry its own grant there removed before an undo).
	Missed    int
	Refreshes int // grants to fair attempts that found the key theirs (refresh, takeover)
	Unfair    int // grants to attempts without fairness
	Queued    int // Queued refusals (the key free, another waiter the head)
	Ahead     int // fifo violations
}

func (s *FairStats) add(o FairStats) {
	s.Grants += o.Grants
	s.Lined += o.Lined
	s.Missed += o.Missed
	s.Refreshes += o.Refreshes
	s.Unfair += o.Unfair
	s.Queued += o.Queued
	s.Ahead += o.Ahead
}

// lineEntry is one waiter in a node's line.
type lineEntry struct {
	id       string
	ticket   float64
	deadline float64 // ms in the node's TIME; 0: no deadline member
}

func (a lineEntry) before(b lineEntry) bool {
	if a.ticket != b.ticket {
		return a.ticket < b.ticket
	}
	return a.id < b.id
}

// fairCall is what the fifo check reads of a fair attempt's Acquire
// (ARGV[7] given: a waiter id) and of the node's state before it.
type fairCall struct {
	fair   bool
	id     string
	ticket float64
	join   bool
	free   bool        // the lock key was absent
	line   []lineEntry // live entries before, in line order
	nowMS  int64
}

// fifoRecs is what the fifo check gathered, under its own mutex (a
// leaf).
type fifoRecs struct {
	mu    sync.Mutex
	stats FairStats
	vs    []Violation
	// grants: the free-key grants to fair attempts, for Missed.
	grants []fifoGrant
	// attempts: per waiter id in line (a fair Lock's), its client, ticket
	// and the times its attempts reached a node.
	attempts map[string]*fifoWaiter
	// heads: per key and node, the head a fair Acquire last read there;
	// queued: the Queued refusals of fair attempts (heads.go).
	heads  map[string]map[int]nodeHead
	queued []queuedRefusal
}

type fifoGrant struct {
	node  int
	at    time.Duration
	w     lineEntry
	live  map[string]bool // ids live in the node's line
	token string
}

type fifoWaiter struct {
	client int
	ticket float64
	ats    []time.Duration
}

// fifoBefore reads a fair attempt's place and the node's lock key and
// live line into ac. Called with n.mu held, the node's clock set.
func (w *World) fifoBefore(n *Node, ac *acquireCall, keys, argv []string) {
	if len(argv) < 10 {
		return // without fairness
	}
	ac.fair, ac.id, ac.join = true, argv[6], argv[8] == "1"
	t, _ := strconv.ParseInt(argv[7], 10, 64)
	ac.ticket = float64(t)
	ac.free = !n.m.Exists(ac.key)
	now := n.clockLocked()
	ac.nowMS = now.UnixMilli()
	ss, err := n.m.SortedSet(keys[3])
	if err != nil {
		return
	}
	for m, score := range ss {
		if strings.HasPrefix(m, "@") || score < 0 {
			continue
		}
		e := lineEntry{id: m, ticket: score}
		if d, ok := ss["@"+m]; ok {
			e.deadline = -d
			if e.deadline <= float64(ac.nowMS) {
				continue // past its deadline: the script purges it
			}
		}
		ac.line = append(ac.line, e)
	}
	slices.SortFunc(ac.line, func(a, b lineEntry) int {
		if a.before(b) {
			return -1
		}
		if b.before(a) {
			return 1
		}
		return 0
	})
}

// fifoAfter checks a fair attempt's free-key grant against the line the
// node had before it (see InvFIFO). Called with n.mu held.
func (w *World) fifoAfter(n *Node, ac *acquireCall, reply []byte) {
	ok := granted(reply)
	r := &w.fifo
	r.mu.Lock()
	defer r.mu.Unlock()
	at := time.Since(w.start)
	if !ac.fair {
		if ok {
			r.stats.Unfair++
		}
		return
	}
	if ac.join {
		if r.attempts == nil {
			r.attempts = map[string]*fifoWaiter{}
		}
		fw := r.attempts[ac.id]
		if fw == nil {
			fw = &fifoWaiter{client: ac.client, ticket: ac.ticket}
			r.attempts[ac.id] = fw
		}
		fw.ats = append(fw.ats, at)
	}
	queued := len(reply) > 1 && string(reply[1:len(reply)-2]) == strconv.FormatInt(script.Queued, 10)
	if queued {
		r.stats.Queued++
	}
	w.noteHeads(n.id, ac, at, queued)
	if !ok {
		return
	}
	if !ac.free {
		r.stats.Refreshes++
		return
	}
	r.stats.Grants++
	me := lineEntry{id: ac.id, ticket: ac.ticket}
	entries := slices.Clone(ac.line)
	inLine := false
	for i, e := range entries {
		if e.id == ac.id {
			inLine = true
			if ac.join {
				entries[i].ticket = ac.ticket // ZADD at the ticket sent
			}
			me = entries[i]
		}
	}
	if !inLine && ac.join && len(entries) > 0 {
		entries = append(entries, me) // it joins (a line that exists)
		inLine = true
	}
	var ahead []lineEntry
	live := map[string]bool{}
	for _, e := range entries {
		live[e.id] = true
		if e.id == ac.id {
			continue
		}
		if !inLine || e.before(me) {
			ahead = append(ahead, e)
		}
	}
	if len(entries) > 1 || (len(entries) == 1 && !inLine) {
		r.stats.Lined++
	}
	r.grants = append(r.grants, fifoGrant{node: n.id, at: at, w: me, live: live, token: ac.token})
	if len(ahead) == 0 {
		return
	}
	r.stats.Ahead++
	var b strings.Builder
	for i, e := range ahead {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "waiter %s ticket %.0f, deadline in %.0fms", e.id, e.ticket-me.ticket, e.deadline-float64(ac.nowMS))
		if fw := r.attempts[e.id]; fw != nil {
			fmt.Fprintf(&b, ", c%d", fw.client)
		}
	}
	how := "Lock, in line"
	switch {
	case !ac.join && !inLine:
		how = "an attempt not in line (TryLock, or a Lock after too few nodes answered)"
	case !ac.join:
		how = "Lock, in line, not refreshing"
	}
	r.vs = append(r.vs, Violation{Inv: InvFIFO, At: at, Detail: fmt.Sprintf("node%d granted free key %s to c%d's attempt %s (%s, waiter %s, ticket %.0f) with %d live entr(ies) ahead in its line: %s (tickets relative to its own)",
		n.id, ac.key, ac.client, ac.token, how, ac.id, me.ticket, len(ahead), b.String())})
}

// checkFIFO returns the fifo violations and counts the misses (see
// FairStats.Missed; logged with the run's log on).
func (w *World) checkFIFO() []Violation {
	if !w.sc.Fair {
		return nil
	}
	held := map[string]bool{}
	w.hist.mu.Lock()
	for _, hd := range w.hist.holds {
		held[hd.Token] = true
	}
	w.hist.mu.Unlock()
	r := &w.fifo
	r.mu.Lock()
	defer r.mu.Unlock()
	missed := map[string]bool{}
	// Waiters in the order of their tickets, then clients, then first
	// attempts: not in map order, nor by id (random tokens), so that the
	// miss a grant is charged with is the seed's.
	ids := slices.Collect(maps.Keys(r.attempts))
	slices.SortFunc(ids, func(a, b string) int {
		x, y := r.attempts[a], r.attempts[b]
		return cmp.Or(cmp.Compare(x.ticket, y.ticket), cmp.Compare(x.client, y.client), cmp.Compare(x.ats[0], y.ats[0]), strings.Compare(a, b))
	})
	for _, g := range r.grants {
		if !held[g.token] || missed[g.token] {
			continue
		}
		for _, id := range ids {
			fw := r.attempts[id]
			// An earlier ticket, strictly: between equal tickets the line
			// orders by id, a random token, which says nothing of who came
			// first.
			if id == g.w.id || g.live[id] || fw.ticket >= g.w.ticket {
				continue
			}
			i, _ := slices.BinarySearchFunc(fw.ats, g.at, cmp.Compare)
			if i > 0 && i < len(fw.ats) {
				r.stats.Missed++
				missed[g.token] = true
				w.hist.logf("fifo miss: node%d granted %s (waiter %s) at %.3fms while waiter %s of c%d, ticket %.0f ms earlier, attempting at %.3fms and %.3fms, was not in its live line",
					g.node, g.token, g.w.id, msf(g.at), id, fw.client, g.w.ticket-fw.ticket, msf(fw.ats[i-1]), msf(fw.ats[i]))
				break
			}
		}
	}
	w.hist.ex.count(InvFIFO, r.stats.Grants)
	return slices.Clone(r.vs)
}

// fairStats returns the run's fifo figures.
func (w *World) fairStats() FairStats {
	w.fifo.mu.Lock()
	defer w.fifo.mu.Unlock()
	return w.fifo.stats
}
