package sim

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/drift"
)

// InvStateValid: a lock its holder believed valid (Lost open, its clock
// before its Deadline) was not held, until its Until less drift.Fixed, by
// the nodes that make it valid: a majority of the quorum's nodes, the
// single strategy's node, the Cluster master serving its key, the
// failover primary that granted it.
const InvStateValid = "state-valid"

// stateStats are the state-valid figures of one run, read by the
// examined-count framework (examined.go: state-valid, and its /exempt and
// /locks counts).
type stateStats struct {
	Locks    int // locks tracked (every grant a workload saw)
	Examined int // checks of a lock its holder believed valid
	// Exempt: checks of a failover lock granted by the old primary after
	// the promotion (failover-kept bounds those), or whose granting node
	// the simulator did not see.
	Exempt int
	// Replicas: checks of a failover lock that read its primary's replica
	// as well (failover: a replica holds what WAIT acknowledged).
	Replicas int
	// With World.verifyReadings: node readings a check took as they stood,
	// and those a fresh reading contradicted (held long enough or not).
	Stood, StoodWrong int
}

// liveLock is one lock a workload holds, from its grant until its hold
// ended, as the state check sees it.
type liveLock struct {
	ci       int
	name     string // the workload's name for the hold, c<client>#<seq>
	lk       *redlease.Lock
	lost     <-chan struct{}
	key      string // on the nodes
	token    string
	nodes    []int         // the nodes that make it valid (failover: none, see grantor)
	need     int           // how many of them
	failover bool          // the failover primary that granted it makes it valid
	cluster  bool          // the Cluster master serving key now makes it valid (lockPlace)
	from     time.Duration // when the workload saw the grant (virtual)
	// reported: the nodes (bits by index in nodes) a violation already
	// named; a lock is reported again only when another node falls short,
	// so that a shortfall a fault's scope excuses cannot hide a later one
	// it does not.
	reported uint64
	// seen: what each of nodes held when last read (nil: not read yet).
	// A node's reading changes only when it applies a command on the key
	// (flushState rereads that node) or a fault acts on it (every node
	// is reread): expiry is foreseen in exp.
	seen []nodeHold
}

// stateCheck is the state-valid invariant's state. Lock order: mu, then a
// Lock's mutex, a node's mutex, World.mu, the history's mutex; dmu is a
// leaf (taken with a node's mutex held).
type stateCheck struct {
	mu    sync.Mutex
	live  map[string][]*liveLock
	stats stateStats
	// revoked: tokens an operator's forced release was sent for
	// (revokework.go).
	revoked map[string]bool
	// sitOut: per node, the windows (virtual time) in which it counts as
	// holding every lock because it cannot vote for another holder: from
	// a restart fault that lost its data under the delayed-restart rule
	// until the rule's max TTL (on its clock) after it came back.
	sitOut map[int][][2]time.Duration
	// moves: failover only, when each change of primary (the failover,
	// a failback) promoted its node. A grant made before a move is left to
	// failover-kept from the move on: the new primary may lack it, and
	// the Watcher's bound covers it.
	moves []time.Duration

	dmu   sync.Mutex
	dirty []touched // keys commands touched since the last flush
	spare []touched // the last flush's slice, emptied, for dirty's next
	flag  atomic.Bool
}

// touched is a key a command touched on a node.
type touched struct {
	node int
	key  string
}

// afterSchedule completes a run's schedule before its nodes exist: the
// clock-rate faults (drawn apart, see driftFaults) and their rate
// windows, and the state check's exemption windows.
func (w *World) afterSchedule() {
	fmin, fmax := w.driftFactors()
	if df := driftFaults(w.seed, &w.sc, fmin, fmax); len(df) > 0 {
		w.faults = append(w.faults, df...)
		sortFaults(w.faults)
	}
	w.planDrift()
	st := &w.state
	st.live = map[string][]*liveLock{}
	maxTTL := w.sc.DelayedRestart
	for i, f := range w.faults {
		switch {
		case f.Kind == FaultFailover, f.Kind == FaultFailback:
			st.moves = append(st.moves, moveAt(w.faults[i]))
		case f.Kind == FaultRestart && maxTTL > 0 && !f.Outside && f.Mode != "durable":
			if st.sitOut == nil {
				st.sitOut = map[int][][2]time.Duration{}
			}
			end := w.nodeVirtualAfter(f.Node, f.At+f.For, maxTTL)
			st.sitOut[f.Node] = append(st.sitOut[f.Node], [2]time.Duration{f.At, end})
		}
	}
}

// lockPlace is where a lock lives: the nodes that make it valid and how
// many of them, or the failover primary that granted it.
type lockPlace struct {
	nodes    []int
	need     int
	failover bool
	// cluster (cluster-failover): the master serving the key now makes
	// it valid, whichever node that is (a promoted replica must hold what
	// it acknowledged).
	cluster bool
}

// placeOf is where a lock of strategy strat on key lives: "q", "s", "c"
// as holdNodes names the watchdog-mixed strategies, "k" or "" for the
// scenario's own strategy.
func (w *World) placeOf(strat, key string) lockPlace {
	switch {
	case strat == "q" || strat == "s" || strat == "c":
		ids, q := w.holdNodes(strat, key)
		return lockPlace{nodes: ids, need: q}
	case w.sc.Strategy == Failover:
		return lockPlace{failover: true}
	case w.sc.Strategy == FailoverCluster:
		return lockPlace{cluster: true, need: 1}
	case w.sc.Strategy == Single:
		return lockPlace{nodes: []int{0}, need: 1}
	}
	ids := make([]int, w.sc.Nodes)
	for i := range ids {
		ids[i] = i
	}
	return lockPlace{nodes: ids, need: w.sc.Nodes/2 + 1}
}

// track starts checking lk (granted to client ci, on key as sent to the
// nodes) and checks it once: a grant the client saw return.
func (w *World) track(ci int, name, key string, lk *redlease.Lock, pl lockPlace) *liveLock {
	e := &liveLock{ci: ci, name: name, lk: lk, lost: lk.Lost(), key: key, token: lk.Token(), nodes: pl.nodes, need: pl.need, failover: pl.failover, cluster: pl.cluster, from: time.Since(w.start)}
	st := &w.state
	st.mu.Lock()
	if st.live == nil {
		st.live = map[string][]*liveLock{}
	}
	st.live[key] = append(st.live[key], e)
	st.stats.Locks++
	w.checkLockLocked(e, readAll)
	st.mu.Unlock()
	return e
}

// untrack stops checking e (its hold ended).
func (w *World) untrack(e *liveLock) {
	if e == nil {
		return
	}
	st := &w.state
	st.mu.Lock()
	ls := st.live[e.key]
	for i, x := range ls {
		if x == e {
			ls = append(ls[:i], ls[i+1:]...)
			break
		}
	}
	if len(ls) == 0 {
		delete(st.live, e.key)
	} else {
		st.live[e.key] = ls
	}
	st.mu.Unlock()
}

// checkLock checks e now: an operation of its client returned. The
// client's belief changed, not the nodes: their last readings stand.
func (w *World) checkLock(e *liveLock) {
	if e == nil {
		return
	}
	w.state.mu.Lock()
	w.checkLockLocked(e, readNone)
	w.state.mu.Unlock()
}

// checkClientKey checks client ci's locks on key (a renewal's outcome,
// reported by the client's Observer), on the nodes' last readings.
func (w *World) checkClientKey(ci int, key string) {
	st := &w.state
	st.mu.Lock()
	for _, e := range st.live[key] {
		if e.ci == ci {
			w.checkLockLocked(e, readNone)
		}
	}
	st.mu.Unlock()
}

// touch records the keys a command node applied touched (a script's
// declared keys, another command's first argument). Called with the
// node's mutex held; the check runs after it is released (flushState).
func (w *World) touch(node int, args []string) {
	if len(args) < 2 {
		return
	}
	st := &w.state
	st.dmu.Lock()
	cmd := args[0]
	if len(args) > 3 && (strings.EqualFold(cmd, "evalsha") || strings.EqualFold(cmd, "eval")) {
		if nk, err := strconv.Atoi(args[2]); err == nil && nk >= 0 && 3+nk <= len(args) {
			for _, k := range args[3 : 3+nk] {
				st.dirty = append(st.dirty, touched{node, k})
			}
			if w.sc.Revoke && nk >= 1 && 3+nk < len(args) {
				w.mu.Lock()
				w.revokeSent[args[3]+"\x00"+args[3+nk]] = true
				w.mu.Unlock()
			}
		}
	} else {
		st.dirty = append(st.dirty, touched{node, args[1]})
	}
	st.dmu.Unlock()
	st.flag.Store(true)
}

// touchKeys records keys a script on node wrote without declaring them
// (see Node.scriptKeys), as touch does for a command's keys.
func (w *World) touchKeys(node int, keys []string) {
	st := &w.state
	st.dmu.Lock()
	for _, k := range keys {
		st.dirty = append(st.dirty, touched{node, k})
	}
	st.dmu.Unlock()
	st.flag.Store(true)
}

// flushState checks the locks on every key a command touched since the
// last flush. The scheduler runs it after each event (every delivery,
// so after every command a node applied), with no node's mutex held.
func (w *World) flushState() {
	st := &w.state
	if !st.flag.Load() {
		return
	}
	st.dmu.Lock()
	keys := st.dirty
	st.dirty, st.spare = st.spare, nil
	st.flag.Store(false)
	st.dmu.Unlock()
	defer func() {
		st.dmu.Lock()
		st.spare = keys[:0]
		st.dmu.Unlock()
	}()
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.live) == 0 {
		return
	}
	for i, k := range keys {
		ls := st.live[k.key]
		if len(ls) == 0 {
			continue
		}
		dup := false
		for _, p := range keys[:i] {
			if p == k {
				dup = true
				break
			}
		}
		if dup {
			continue
		}
		for _, e := range ls {
			w.checkLockLocked(e, k.node)
		}
	}
}

// checkAllState checks every live lock: after a fault's action (a
// restart, a promotion, a resume that applied a queue) changed nodes
// wholesale.
func (w *World) checkAllState() {
	w.flushState()
	st := &w.state
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, ls := range st.live {
		for _, e := range ls {
			w.checkLockLocked(e, readAll)
		}
	}
}

// nodeHold is what the state check read of a lock key on a node.
type nodeHold struct {
	read bool          // a reading (false: none yet, read it)
	held bool          // the token is there (or counts as there)
	exp  time.Duration // when it expires there, virtual time (held only)
	what holdKind      // for the report
}

type holdKind uint8

const (
	holdDown holdKind = iota
	holdNoTTL
	holdExpires
	holdBadKey
	holdAbsent
	holdNotString
	holdOther
)

// String says what the node held, for a violation's report.
func (h nodeHold) String() string {
	switch h.what {
	case holdDown:
		return "down"
	case holdNoTTL:
		return "no ttl"
	case holdExpires:
		return fmt.Sprintf("expires %.3fms", msf(h.exp))
	case holdBadKey:
		return fmt.Sprintf("badkey, token would expire %.3fms", msf(h.exp))
	case holdAbsent:
		return "absent"
	case holdNotString:
		return "not a string"
	}
	return "another token"
}

// forever is an expiry beyond every run.
const forever = time.Duration(1<<63 - 1)

// stateOf reads key on n: whether it holds token, and until when in
// virtual time (its TTL read on its clock, converted through its rate
// windows). A node that is down counts as holding it (it comes back with
// its data, or a restart that loses data is OUTSIDE, or the
// delayed-restart rule keeps it from voting: see sitOut). A token a
// badkey fault replaced counts as held until it would have expired (the
// hash outlives it; see watchcheck.go).
func (n *Node) stateOf(key, token string, nowV time.Duration) nodeHold {
	h := n.readKey(key, token, nowV)
	h.read = true
	return h
}

func (n *Node) readKey(key, token string, nowV time.Duration) nodeHold {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.down {
		return nodeHold{held: true, exp: forever, what: holdDown}
	}
	n.m.SetTime(n.clockLocked())
	v, err := n.m.Get(key)
	if err == nil && v == token {
		ttl := n.m.TTL(key)
		if ttl <= 0 {
			return nodeHold{held: true, exp: forever, what: holdNoTTL}
		}
		return nodeHold{held: true, exp: n.w.nodeVirtualAfter(n.id, nowV, ttl), what: holdExpires}
	}
	if bk, ok := n.badKeys[key]; ok && bk.token == token && time.Now().Before(bk.exp) {
		return nodeHold{held: true, exp: bk.exp.Sub(n.w.start), what: holdBadKey}
	}
	switch {
	case errors.Is(err, miniredis.ErrKeyNotFound):
		return nodeHold{what: holdAbsent}
	case err != nil:
		return nodeHold{what: holdNotString}
	}
	return nodeHold{what: holdOther}
}

// sittingOut reports whether node id cannot vote at nowV under the
// delayed-restart rule after a restart that lost its data.
func (st *stateCheck) sittingOut(id int, nowV time.Duration) bool {
	for _, win := range st.sitOut[id] {
		if nowV >= win[0] && nowV < win[1] {
			return true
		}
	}
	return false
}

// Which nodes checkLockLocked reads again: every one, or none (beyond
// those not read yet); a node id reads that one.
const (
	readAll  = -1
	readNone = -2
)

// checkLockLocked is the state-valid check of one lock, with st.mu held.
// A lock its holder no longer believes valid (Lost closed, or its clock
// at or past its Deadline) is skipped. It reads node only (a command
// there touched the key), every node (readAll), or none (readNone), and
// takes the others' last readings. A reading stands until the node
// applies a command on the key (flushState reads it again) or a fault
// acts on the node (checkAllState reads every node): it foresees the
// key's expiry. With verifyReadings (tests), every reading that stands
// is compared with a fresh one (stateStats.Stood, StoodWrong).
func (w *World) checkLockLocked(e *liveLock, node int) {
	select {
	case <-e.lost:
		return
	default:
	}
	now := time.Now()
	clientNow := now
	if c := w.clientClock(e.ci); c != nil {
		clientNow = c.Now()
	}
	if !clientNow.Before(e.lk.Deadline()) {
		return
	}
	st := &w.state
	if st.revoked[e.token] {
		// An operator's forced release of its token was sent
		// (revokework.go): the nodes may drop it at any moment, by
		// design, even before its holder heard of its grant.
		st.stats.Exempt++
		return
	}
	nowV := now.Sub(w.start)
	nodes, need := e.nodes, e.need
	if e.failover {
		w.mu.Lock()
		g, ok := w.grants[e.token]
		w.mu.Unlock()
		if !ok || st.movedSince(g.at, nowV) {
			st.stats.Exempt++
			return
		}
		nodes, need = []int{g.node}, 1
		// Its replica too: the strategy moves Until only on a write WAIT
		// says the replica acknowledged, and the replica is what a
		// failover promotes.
		if r := w.nodes[g.node].replicaNode(); r != nil {
			nodes, need = []int{g.node, r.id}, 2
			st.stats.Replicas++
		}
		node = -1
	}
	if e.cluster {
		nodes, need = []int{w.keyHome(e.key).id}, 1
		node = readAll // the master (or, in a migrating slot, the node with the key) may have changed since the last reading
	}
	st.stats.Examined++
	untilV := w.clientVirtual(e.ci, e.lk.Until())
	held := 0
	if len(e.seen) != len(nodes) {
		e.seen = make([]nodeHold, len(nodes))
	}
	if e.failover {
		node = -1
	}
	for i, id := range nodes {
		if st.sittingOut(id, nowV) {
			held++
			e.seen[i] = nodeHold{} // read it again once it votes
			continue
		}
		if node == readAll || node == id || !e.seen[i].read {
			e.seen[i] = w.nodes[id].stateOf(e.key, e.token, nowV)
		} else if w.verifyReadings {
			st.stats.Stood++
			old, fresh := e.seen[i], w.nodes[id].stateOf(e.key, e.token, nowV)
			if (old.held && old.exp >= untilV-drift.Fixed) != (fresh.held && fresh.exp >= untilV-drift.Fixed) {
				st.stats.StoodWrong++
				w.hist.logf("state-valid: %s node%d: reading %s stood, a fresh one says %s", e.name, id, old, fresh)
			}
		}
		if h := e.seen[i]; h.held && h.exp >= untilV-drift.Fixed {
			held++
		}
	}
	if held >= need {
		return
	}
	var why []string
	var short []int
	var bits uint64
	for i, id := range nodes {
		if h := e.seen[i]; h.read && !(h.held && h.exp >= untilV-drift.Fixed) {
			why = append(why, fmt.Sprintf("node%d %s", id, h))
			short = append(short, id)
			bits |= 1 << uint(i)
		}
	}
	if bits&^e.reported == 0 {
		return // no node short that a violation of this lock has not named
	}
	lacks := need - held
	if e.failover && len(short) > 1 && short[0] == nodes[0] {
		// The primary is short too: its replica follows it (a resync
		// copies what the primary has), so the fault to blame, and the
		// scope that may excuse it, is the primary's.
		short, lacks = short[:1], 1
	}
	e.reported |= bits
	w.hist.violation(Violation{Inv: InvStateValid, At: nowV, Detail: fmt.Sprintf(
		"%s %s (token %s): believed valid (Deadline in %.3fms on its clock, Until at %.3fms), but %d of %d nodes hold it until Until−%v (%d needed): %s",
		e.name, e.key, e.token, msf(e.lk.Deadline().Sub(clientNow)), msf(untilV), held, len(nodes), drift.Fixed, need, strings.Join(why, "; ")),
		Holds: []*Hold{{Client: e.ci, Key: e.key, Via: "state", Token: e.token, From: e.from, LostAt: -1, RelSent: -1}},
		Nodes: short, Short: lacks})
}

// stateResult returns the run's state-valid figures.
func (w *World) stateResult() stateStats {
	w.state.mu.Lock()
	defer w.state.mu.Unlock()
	return w.state.stats
}

// stateObserver reports every extension outcome of client ci's Locker
// (Lock.Extend's and a keeper's renewals, which ExtendAll reports as
// "extend") to the state check, after it was recorded on the lock.
type stateObserver struct {
	w  *World
	ci int
}

func noDone(error) {}

// Start returns done for an "extend": check the client's locks on the
// key; for an "acquire": check held-kind on its answer.
func (o stateObserver) Start(ctx context.Context, op redlease.Op) (context.Context, func(error)) {
	switch op.Name {
	case "extend":
		return ctx, func(error) { o.w.checkClientKey(o.ci, op.Key) }
	case "acquire", "acquire_set": // a set's step: op.Key names its keys
		t0 := o.w.hist.now()
		return ctx, func(err error) { o.w.heldKind(ctx, o.ci, op.Key, t0, err) }
	}
	return ctx, noDone
}

// Held does nothing.
func (stateObserver) Held(redlease.Op, time.Duration, error) {}

// NodeFailed does nothing.
func (stateObserver) NodeFailed(context.Context, redlease.Op, *redlease.NodeError) {}

// trackKeeper wraps a Keeper so that every lock it is handed is checked
// while kept (the Barrier's locks, which the workload never sees
// otherwise): key is prefix + the lock's key.
type trackKeeper struct {
	w      *World
	ci     int
	inner  redlease.Keeper
	prefix string
	place  lockPlace
}

// Keep tracks lk and keeps it with the inner Keeper; stop ends both.
func (k trackKeeper) Keep(lk *redlease.Lock) (stop func()) {
	e := k.w.track(k.ci, fmt.Sprintf("c%d/%s", k.ci, lk.Key()), k.prefix+lk.Key(), lk, k.place)
	s := k.inner.Keep(lk)
	return func() {
		s()
		k.w.untrack(e)
	}
}

// writePause is how long a client pauses between a Valid that said yes
// and its write to the fenced register, in the lockClient and doClient
// workloads: one write in eight, up to 1.5 TTLs (past the lock's end at
// times: the fences, not the belief intervals, must then refuse a stale
// write). Drawn from a hash of the seed, client, hold and step, so that
// the workloads' own draws stay what they were.
func (w *World) writePause(ci, seq, step int, ttl time.Duration) time.Duration {
	h := mix(mix(w.seed, 0x9a05e), uint64(ci)<<40|uint64(seq)<<20|uint64(step))
	if h%8 != 0 {
		return 0
	}
	return time.Duration(unit(mix(h, 1)) * 1.5 * float64(ttl))
}

// movedSince reports whether the primary changed (a failover or a
// failback promoted a node) after a grant at grant and by now.
func (st *stateCheck) movedSince(grant, now time.Duration) bool {
	for _, p := range st.moves {
		if grant < p && now >= p {
			return true
		}
	}
	return false
}
