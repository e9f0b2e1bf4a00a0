package sim

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/script"
)

// Hazard scopes. A fault outside the strategy's assumptions (Outside,
// FenceOutside) excuses a violation only where it can have caused it:
// each such fault gets a Scope, what it did to which locks, and a
// violation is a hazard only if some Scope covers one of the holds it
// names (Violation.Holds). Everything else is a failure.
//
//   - clock-jump (a node's clock forward by A at T): the locks whose key
//     was on that node at T (their key expired A early there). If the
//     node was down at T, the locks it had when it crashed (a durable
//     restart restores them with TTLs A shorter); if it restarted before
//     T, also those its restart lost (a jump shortens the delayed-restart
//     rule's wait).
//   - clock-skew: the same, for each node of the majority.
//   - restart without the rule (empty, snapshot; OUTSIDE): the locks
//     whose key the node lost (on it at the crash, and not brought back
//     as they were by the snapshot); for fence-order and stale-accepted
//     also the grants the node voted for from its restart on, on a key
//     whose fence counter it lost (it went back). In the failover
//     scenario, the grants of either node: a primary restarted empty
//     empties its replica, which a failover may promote later.
//   - restart under the rule with fences (OUTSIDE-FENCES): the latter
//     only (the rule keeps exclusion), for fence-order and stale-accepted.
//   - failover with a stale replica promoted (OUTSIDE): the locks the old
//     primary granted that were still believed after the replica's
//     snapshot (granted or extended after it: lost or shortened on the
//     new primary), and for the fence invariants the grants of the new
//     primary on a key the old one granted after the snapshot (its fence
//     counter went back).
//   - clock-drift beyond the drift factor (OUTSIDE; drift.go), a node's
//     clock fast from From to To: the locks whose TTL ran on that clock
//     while it was fast, so that they expired early there: those whose
//     key was on the node at From (if it was down, those it had at its
//     crash: a durable restart brings them back onto the fast clock),
//     those it granted from From to To, those it had when it crashed
//     between From and To, and those a restart of the node under the
//     delayed-restart rule lost, if the rule's wait (counted on the
//     node's clock) overlapped the window. A client's clock slow beyond
//     the factor (never drawn: drift.go draws OUTSIDE rates on nodes
//     only) would cover the locks that client was granted before To.
//
// Every scope names its nodes (Nodes; a client's drift: every node). A
// violation that names the nodes its lock was short on (state-valid) is
// excused only by scopes that touched them (see excuse).
//
// A hold is matched by its token's base (the Lock call's id, "<base>" of
// "<base>.<n>"): a node may hold an earlier attempt's token of the call.

// Scope is what one OUTSIDE or OUTSIDE-FENCES fault of a run can have
// affected (see above).
type Scope struct {
	Fault int    // index in the schedule
	Kind  string // the fault's kind
	At    time.Duration
	Nodes []int // the nodes it touched
	// Tokens: the bases of the lock tokens it took from its nodes or made
	// expire early there; a hold with one of them is covered.
	Tokens map[string]bool
	// Fence invariants only: a hold granted with a vote of one of
	// VoteNodes at or after VoteFrom, on a lock key whose fence counter is
	// in FenceKeys, is covered.
	VoteNodes []int
	VoteFrom  time.Duration
	FenceKeys map[string]bool
	// FenceOnly: the fault is outside the assumptions of fence order only
	// (OUTSIDE-FENCES).
	FenceOnly bool
	// Clients: a client's clock drift (its belief outran every node).
	Clients []int
	// Unheld: invariants whose violations name no hold (the idempotency
	// workloads' exclusion invariants, whose locks a Barrier takes) that
	// the scope covers from At on: a stale promotion in idem-failover
	// (its lock lost acknowledged writes; its store did not move).
	Unheld []string
}

// touches reports whether the scope's fault acted on node n (a client's
// drift acts on the client's view of every node).
func (s *Scope) touches(n int) bool {
	return len(s.Clients) > 0 || slices.Contains(s.Nodes, n)
}

// touchesAny reports whether the scope touches one of nodes.
func (s *Scope) touchesAny(nodes []int) bool {
	for _, n := range nodes {
		if s.touches(n) {
			return true
		}
	}
	return false
}

// String describes the scope for a replay's log.
func (s Scope) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s at %.3fms nodes=%v", s.Kind, msf(s.At), s.Nodes)
	if len(s.Clients) > 0 {
		fmt.Fprintf(&b, " clients=%v", s.Clients)
	}
	if len(s.Tokens) > 0 {
		fmt.Fprintf(&b, " locks=%d", len(s.Tokens))
	}
	if len(s.VoteNodes) > 0 {
		fmt.Fprintf(&b, " fence votes of %v from %.3fms on %v", s.VoteNodes, msf(s.VoteFrom), slices.Sorted(maps.Keys(s.FenceKeys)))
	}
	if s.FenceOnly {
		b.WriteString(" (fences only)")
	}
	return b.String()
}

// vote is one Acquire a node granted (a grant, a refresh or a takeover).
type vote struct {
	node       int
	client     int // the workload client whose connection sent it
	key, token string
	at         time.Duration
}

// crashRec is a node's data when it crashed, and the snapshot a restart
// from one would bring back.
type crashRec struct {
	node       int
	at         time.Duration
	data, snap []snapKey
}

// jumpRec is a node's lock keys when its clock jumped (jumps), or when
// it began to run fast beyond the drift factor (drifts).
type jumpRec struct {
	node int
	at   time.Duration
	down bool
	data []snapKey
}

// snapRec is a snapshot a node took.
type snapRec struct {
	node int
	at   time.Duration
}

// scopeRecs is what the nodes recorded for the scopes, under its own
// mutex (a leaf: taken with a node's mutex held).
type scopeRecs struct {
	mu      sync.Mutex
	votes   []vote
	crashes []crashRec
	jumps   []jumpRec
	drifts  []jumpRec
	snaps   []snapRec
	// applied counts the Acquire calls the nodes applied (each node's
	// once per attempt that reached it): the Wake figures' cost per grant.
	applied int
}

// acquireLine splits args if they call the Acquire script: its KEYS and
// ARGV, by the key count the line declares (KEYS[1] the lock key, KEYS[4]
// the line; ARGV[1] the token, ARGV[7..10] a fair attempt's place).
func acquireLine(args []string) (keys, argv []string, ok bool) {
	sha, keys, argv, ok := scriptLine(args)
	if !ok || sha != script.Acquire.Hash() || len(keys) < 4 || len(argv) < 1 {
		return nil, nil, false
	}
	return keys, argv, true
}

// setLine splits args if they call the AcquireSet script (a set of keys
// taken in one step): its lock keys (the first half of KEYS) and its
// token (ARGV[1]).
func setLine(args []string) (keys []string, token string, ok bool) {
	sha, keys, argv, ok := scriptLine(args)
	if !ok || sha != script.AcquireSet.Hash() || len(keys) < 2 || len(keys)%2 != 0 || len(argv) < 1 {
		return nil, "", false
	}
	return keys[:len(keys)/2], argv[0], true
}

// setGranted reports whether an AcquireSet reply is a grant: an array
// whose first element is 1.
func setGranted(reply []byte) bool {
	_, rest, ok := strings.Cut(string(reply), "\r\n")
	return ok && len(reply) > 0 && reply[0] == '*' && strings.HasPrefix(rest, ":1\r\n")
}

// granted reports whether an Acquire reply is a grant (a fence or 0).
func granted(reply []byte) bool {
	return len(reply) >= 3 && reply[0] == ':' && reply[1] != '-'
}

// acquireCall is an Acquire a node is about to apply: its key, token and
// client, and in a Fair scenario what the fifo check reads (fifo.go).
type acquireCall struct {
	key, token string
	client     int
	// set: an AcquireSet call's lock keys (key is the first); a grant is
	// a vote for each.
	set []string
	fairCall
}

// beforeApply runs before node n applies args for c: for an Acquire
// call, it reads what the checks need of the call and, in a Fair
// scenario, of the node's state (fifo.go). Called with n.mu held, the
// node's clock set.
func (w *World) beforeApply(n *Node, c *conn, args []string) *acquireCall {
	if n.sent != nil || !w.sc.Faults {
		return nil
	}
	keys, argv, ok := acquireLine(args)
	if !ok {
		if set, token, ok := setLine(args); ok {
			return &acquireCall{key: set[0], token: token, client: c.client, set: set}
		}
		return nil
	}
	ac := &acquireCall{key: keys[0], token: argv[0], client: c.client}
	if w.sc.Fair {
		w.fifoBefore(n, ac, keys, argv)
	}
	return ac
}

// afterApply runs after node n applied an Acquire call (ac from
// beforeApply) and replied: it records a grant as the node's vote and, in
// a Fair scenario, checks fair mode's line (fifo.go). Called with n.mu
// held.
func (w *World) afterApply(n *Node, ac *acquireCall, reply []byte) {
	if ac == nil {
		return
	}
	w.scope.mu.Lock()
	w.scope.applied++
	switch {
	case ac.set != nil:
		if setGranted(reply) {
			for _, k := range ac.set {
				w.scope.votes = append(w.scope.votes, vote{node: n.id, client: ac.client, key: k, token: ac.token, at: time.Since(w.start)})
			}
		}
	case granted(reply):
		w.scope.votes = append(w.scope.votes, vote{node: n.id, client: ac.client, key: ac.key, token: ac.token, at: time.Since(w.start)})
	}
	w.scope.mu.Unlock()
	if w.sc.Fair {
		w.fifoAfter(n, ac, reply)
	}
}

// noteCrash records node n's data as it crashes (n.atCrash) and the
// snapshot a restart from one would restore. Called with n.mu held.
func (w *World) noteCrash(n *Node) {
	w.scope.mu.Lock()
	w.scope.crashes = append(w.scope.crashes, crashRec{node: n.id, at: time.Since(w.start), data: n.atCrash, snap: n.snapshot})
	w.scope.mu.Unlock()
}

// noteJump records node n's keys as its clock jumps. Called with n.mu
// held, before the jump.
func (w *World) noteJump(n *Node) {
	r := jumpRec{node: n.id, at: time.Since(w.start), down: n.down}
	if !n.down && n.m != nil {
		n.m.SetTime(n.clockLocked())
		r.data = snapshotOf(n.m, n.clockLocked())
	}
	w.scope.mu.Lock()
	w.scope.jumps = append(w.scope.jumps, r)
	w.scope.mu.Unlock()
}

// noteDrift records node n's keys as its clock begins to run fast beyond
// the drift factor (an OUTSIDE clock-drift fault's start).
func (n *Node) noteDrift() {
	n.mu.Lock()
	defer n.mu.Unlock()
	w := n.w
	r := jumpRec{node: n.id, at: time.Since(w.start), down: n.down}
	if !n.down && n.m != nil {
		n.m.SetTime(n.clockLocked())
		r.data = snapshotOf(n.m, n.clockLocked())
	}
	w.scope.mu.Lock()
	w.scope.drifts = append(w.scope.drifts, r)
	w.scope.mu.Unlock()
}

// noteSnapshot records a snapshot node n took. Called with n.mu held.
func (w *World) noteSnapshot(n *Node) {
	w.scope.mu.Lock()
	w.scope.snaps = append(w.scope.snaps, snapRec{node: n.id, at: time.Since(w.start)})
	w.scope.mu.Unlock()
}

// base is a token's Lock call id ("<base>" of "<base>.<n>").
func base(token string) string {
	if i := strings.LastIndexByte(token, '.'); i > 0 {
		return token[:i]
	}
	return token
}

// lockKey reports whether a node key is a lock key (not in the reserved
// namespace: fence counters, boot markers, lines, idempotency records
// are there or are hashes).
func lockKey(k snapKey) bool {
	return k.hash == nil && !strings.HasPrefix(k.key, redlease.ReservedPrefix)
}

// fenceKey reports whether a node key is a fence counter.
func fenceKey(k string) bool { return strings.HasPrefix(k, redlease.ReservedPrefix+"fence:") }

// lostLocks adds to into the bases of the lock tokens in data that a
// restart in mode lost: all of them (empty), those the snapshot does not
// bring back with the same token and at least the same expiry
// (snapshot), none (durable).
func lostLocks(into map[string]bool, c crashRec, mode string) {
	if mode == "durable" {
		return
	}
	kept := map[string]snapKey{}
	if mode == "snapshot" {
		for _, k := range c.snap {
			kept[k.key] = k
		}
	}
	for _, k := range c.data {
		if !lockKey(k) {
			continue
		}
		if s, ok := kept[k.key]; ok && s.val == k.val && (k.exp.IsZero() || (!s.exp.IsZero() && !s.exp.Before(k.exp))) {
			continue
		}
		into[base(k.val)] = true
	}
}

// lostFences returns the fence counters a restart in mode set back.
func lostFences(c crashRec, mode string) map[string]bool {
	out := map[string]bool{}
	if mode == "durable" {
		return out
	}
	kept := map[string]string{}
	if mode == "snapshot" {
		for _, k := range c.snap {
			kept[k.key] = k.val
		}
	}
	for _, k := range c.data {
		if fenceKey(k.key) && k.hash == nil && (kept[k.key] == "" || atoi64(kept[k.key]) < atoi64(k.val)) {
			out[k.key] = true
		}
	}
	return out
}

func atoi64(s string) int64 {
	var n int64
	for _, c := range s {
		if c < '0' || c > '9' {
			return n
		}
		n = n*10 + int64(c-'0')
	}
	return n
}

// crashAt finds node's crash record at at (the fault's start), or the
// latest before it with before.
func (r *scopeRecs) crashAt(node int, at time.Duration, before bool) (crashRec, bool) {
	var out crashRec
	ok := false
	for _, c := range r.crashes {
		if c.node != node {
			continue
		}
		if c.at == at || (before && c.at < at) {
			out, ok = c, true
		}
	}
	return out, ok
}

// restartMode is the mode of the restart fault whose crash is c (empty
// when c is some other crash: a failover's, a blink's).
func (w *World) restartMode(c crashRec) string {
	for _, f := range w.faults {
		if f.Kind == FaultRestart && f.Node == c.node && f.At == c.at {
			return f.Mode
		}
	}
	return ""
}

// scopes computes the Scope of every OUTSIDE and OUTSIDE-FENCES fault of
// the run, from what the nodes recorded and the holds. Call it after the
// workload.
func (w *World) scopes() []Scope {
	r := &w.scope
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Scope
	for i, f := range w.faults {
		if !f.Outside && !f.FenceOutside {
			continue
		}
		s := Scope{Fault: i, Kind: f.Kind, At: f.At, Tokens: map[string]bool{}, FenceOnly: !f.Outside}
		switch f.Kind {
		case FaultClockJump, FaultClockSkew:
			nodes := f.Nodes
			if f.Kind == FaultClockJump {
				nodes = []int{f.Node}
			}
			s.Nodes = nodes
			for _, node := range nodes {
				w.jumpLocks(s.Tokens, node, f.At)
			}
		case FaultRestart:
			s.Nodes = []int{f.Node}
			c, ok := r.crashAt(f.Node, f.At, false)
			if !ok {
				// The node was down already (restarts overlapping): this
				// fault's restart may be the one that brings it back, in
				// its own mode, from the earlier crash.
				if c, ok = r.crashAt(f.Node, f.At, true); !ok {
					break
				}
			}
			if f.Outside {
				lostLocks(s.Tokens, c, f.Mode)
			}
			s.VoteNodes, s.VoteFrom, s.FenceKeys = []int{f.Node}, f.At, lostFences(c, f.Mode)
			if w.sc.Strategy == Failover {
				// A primary restarted empty empties its replica too (it
				// resynchronises from it), which a later failover promotes.
				s.VoteNodes = []int{fPrimary, fReplica}
			}
		case FaultFailover:
			w.staleScope(&s, f)
			if w.sc.plainStore() > 0 {
				s.Unheld = []string{InvHandlerOverlap, InvTwice, InvRecordTaken, InvReplay}
			}
		case FaultDrift:
			w.driftScope(&s, f)
		default:
			// An outside fault of a kind without a scope excuses nothing:
			// its violations are failures until it has one.
		}
		out = append(out, s)
	}
	return out
}

// jumpLocks adds the locks a clock jump of node at at cut short (see the
// Scope kinds above). Called with w.scope.mu held.
func (w *World) jumpLocks(into map[string]bool, node int, at time.Duration) {
	r := &w.scope
	var j *jumpRec
	for i := range r.jumps {
		if r.jumps[i].node == node && r.jumps[i].at == at {
			j = &r.jumps[i]
			break
		}
	}
	last, crashed := r.crashAt(node, at, true)
	if j == nil || j.down {
		if crashed {
			lostLocks(into, last, "empty") // all it had: restored with shorter TTLs, or lost
		}
		return
	}
	for _, k := range j.data {
		if lockKey(k) && !k.exp.IsZero() {
			into[base(k.val)] = true
		}
	}
	if crashed {
		if mode := w.restartMode(last); mode != "" {
			lostLocks(into, last, mode)
		} else {
			lostLocks(into, last, "empty")
		}
	}
}

// driftScope fills the scope of a clock rate beyond the drift factor (see
// the Scope kinds above). Called with w.scope.mu held.
func (w *World) driftScope(s *Scope, f Fault) {
	from, to := f.At, f.At+f.For
	if f.Client >= 0 {
		s.Clients = []int{f.Client}
		for _, v := range w.scope.votes {
			if v.client == f.Client && v.at < to {
				s.Tokens[base(v.token)] = true
			}
		}
		return
	}
	s.Nodes = f.Nodes
	if f.Node >= 0 {
		s.Nodes = []int{f.Node}
	}
	r := &w.scope
	for _, id := range s.Nodes {
		var start *jumpRec
		for i := range r.drifts {
			if r.drifts[i].node == id && r.drifts[i].at == from {
				start = &r.drifts[i]
				break
			}
		}
		switch {
		case start != nil && !start.down:
			for _, k := range start.data {
				if lockKey(k) && !k.exp.IsZero() {
					s.Tokens[base(k.val)] = true
				}
			}
		default:
			// Down at the start (or the run ended first): what it had at
			// its last crash comes back onto the fast clock.
			if c, ok := r.crashAt(id, from, true); ok {
				lostLocks(s.Tokens, c, "empty")
			}
		}
		for _, v := range r.votes {
			if v.node == id && v.at >= from && v.at < to {
				s.Tokens[base(v.token)] = true
			}
		}
		for _, c := range r.crashes {
			if c.node == id && c.at >= from && c.at < to {
				lostLocks(s.Tokens, c, "empty")
			}
		}
		if maxTTL := w.sc.DelayedRestart; maxTTL > 0 {
			for _, rf := range w.faults {
				if rf.Kind != FaultRestart || rf.Node != id || rf.Outside || rf.Mode == "durable" || rf.At >= to || rf.At+rf.For+maxTTL <= from {
					continue
				}
				if c, ok := r.crashAt(id, rf.At, false); ok {
					lostLocks(s.Tokens, c, rf.Mode)
				}
			}
		}
	}
}

// staleScope fills the scope of a failover that promoted a stale replica
// (see the Scope kinds above). Called with w.scope.mu held.
func (w *World) staleScope(s *Scope, f Fault) {
	promote := promoteAt(f)
	s.Nodes = []int{fPrimary, fReplica}
	snapAt := promote - 200*time.Millisecond // the stalest a promotion is
	for _, sn := range w.scope.snaps {
		if sn.node == fReplica && sn.at <= promote {
			snapAt = sn.at
		}
	}
	w.hist.mu.Lock()
	holds := slices.Clone(w.hist.holds)
	w.hist.mu.Unlock()
	byToken := map[string]*Hold{}
	for _, hd := range holds {
		if hd.Token != "" {
			byToken[hd.Token] = hd
		}
	}
	s.FenceKeys = map[string]bool{}
	for _, v := range w.scope.votes {
		if v.node != fPrimary || v.at > promote {
			continue
		}
		if hd, ok := byToken[v.token]; ok && hd.To > snapAt {
			s.Tokens[base(v.token)] = true
		}
		if v.at > snapAt {
			if fk, ok := script.FenceKey(v.key); ok {
				s.FenceKeys[fk] = true
			}
		}
	}
	s.VoteNodes, s.VoteFrom = []int{fReplica}, promote
}

// covers reports whether the scope covers hold hd for invariant inv;
// votes are the run's node votes by token.
func (s *Scope) covers(hd *Hold, inv string, votes map[string][]vote) bool {
	if hd == nil || hd.Token == "" {
		return false
	}
	fenceInv := inv == InvFenceOrder || inv == InvStale
	if s.FenceOnly && !fenceInv {
		return false
	}
	if !s.FenceOnly && s.Tokens[base(hd.Token)] {
		return true
	}
	if !fenceInv || len(s.VoteNodes) == 0 {
		return false
	}
	for _, v := range votes[hd.Token] {
		if !slices.Contains(s.VoteNodes, v.node) || v.at < s.VoteFrom {
			continue
		}
		if fk, ok := script.FenceKey(v.key); ok && s.FenceKeys[fk] {
			return true
		}
	}
	return false
}

// votesByToken indexes the run's votes by token.
func (w *World) votesByToken() map[string][]vote {
	w.scope.mu.Lock()
	defer w.scope.mu.Unlock()
	out := map[string][]vote{}
	for _, v := range w.scope.votes {
		out[v.token] = append(out[v.token], v)
	}
	return out
}
