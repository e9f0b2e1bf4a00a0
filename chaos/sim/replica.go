package sim

import (
	"slices"
	"strconv"
	"strings"
	"time"
)

// Replication (failover scenario). A primary ships the effects of every
// write it applies to its replica over a simulated replication link: for
// a script, the state of each key it declared (KEYS) that changed — value
// and absolute expiry on the primary's clock, or its absence — as Redis 7
// replicates a script's effects (and a relative expiry as an absolute
// PXAT one). The replica applies them in order after the link's delay and
// acknowledges its offset back over the same link. WAIT numreplicas
// timeout answers from the acknowledged offset: at once if enough
// replicas acknowledged every write the primary had sent when WAIT
// arrived, else it blocks the connection until they do or the timeout
// passes on the virtual clock, as Redis does.
//
// The link's faults (schedule kinds repl-slow, repl-hole, repl-cut): slow
// adds a seeded delay; a hole holds everything sent, both ways, until it
// ends (TCP retransmits: nothing is lost, but nothing arrives — WAIT
// returns 0 meanwhile, as NOTES.md measured); a cut drops what was in
// flight, ships nothing while down, and on reconnecting resynchronises
// the replica from the primary's data (what PSYNC from the backlog or a
// full resync would leave).

// replicaNode returns the replica n feeds, or nil.
func (n *Node) replicaNode() *Node {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.replica
}

// replLink is a primary's replication stream to its replica.
type replLink struct {
	off     uint64    // offset: writes shipped (or, while down, backlogged)
	acked   uint64    // offset the replica acknowledged
	gen     uint64    // link generation: a cut or a resync starts a new one
	down    bool      // cut: nothing shipped until the resync
	n       uint64    // messages sent on the link (per-message randomness)
	lastAt  time.Time // FIFO towards the replica
	lastAck time.Time // FIFO back
}

// keyState is one key as replicated: absent (!present), or a string or
// hash with its absolute expiry on the primary's clock (zero: none).
type keyState struct {
	key     string
	present bool
	val     string
	hash    []string
	exp     time.Time
}

func (a keyState) equal(b keyState) bool {
	return a.key == b.key && a.present == b.present && a.val == b.val && slices.Equal(a.hash, b.hash) && a.exp.Equal(b.exp)
}

// waiter is a WAIT blocked on its connection.
type waiter struct {
	c      *conn
	target uint64
	num    int
	done   bool
}

// writeKeys returns the keys a write command touches (nil: not a write
// the replica needs).
func writeKeys(args []string) []string {
	if len(args) < 2 {
		return nil
	}
	switch strings.ToUpper(args[0]) {
	case "EVAL", "EVALSHA":
		nk, err := strconv.Atoi(args[2])
		if err != nil || nk < 0 || 3+nk > len(args) {
			return nil
		}
		return args[3 : 3+nk]
	case "SET", "INCR", "PEXPIRE", "EXPIRE", "HSET", "SETNX", "PSETEX", "GETDEL":
		return args[1:2]
	case "DEL", "UNLINK":
		return args[1:]
	}
	return nil
}

// keyStatesLocked reads keys' states on n now.
func (n *Node) keyStatesLocked(keys []string) []keyState {
	now := n.clockLocked()
	out := make([]keyState, 0, len(keys))
	for _, k := range keys {
		ks := keyState{key: k}
		switch n.m.Type(k) {
		case "string":
			if v, err := n.m.Get(k); err == nil {
				ks.present, ks.val = true, v
			}
		case "hash":
			if fs, err := n.m.HKeys(k); err == nil {
				ks.present, ks.hash = true, []string{}
				for _, f := range fs {
					ks.hash = append(ks.hash, f, n.m.HGet(k, f))
				}
			}
		}
		if ks.present {
			if ttl := n.m.TTL(k); ttl > 0 {
				ks.exp = now.Add(ttl)
			}
		}
		out = append(out, ks)
	}
	return out
}

// applyStatesLocked writes replicated key states on n.
func (n *Node) applyStatesLocked(states []keyState) {
	now := n.clockLocked()
	n.m.SetTime(now)
	for _, s := range states {
		n.m.Del(s.key)
		if !s.present || (!s.exp.IsZero() && !s.exp.After(now)) {
			continue
		}
		if s.hash != nil {
			n.m.HSet(s.key, s.hash...)
		} else {
			_ = n.m.Set(s.key, s.val)
		}
		if !s.exp.IsZero() {
			n.m.SetTTL(s.key, s.exp.Sub(now))
		}
	}
}

// replicateLocked ships the effects of a write n just applied (pre: the
// touched keys' states before it) to n's replica. Called with n.mu held.
func (n *Node) replicateLocked(keys []string, pre []keyState) {
	post := n.keyStatesLocked(keys)
	var changed []keyState
	for i := range post {
		if !post[i].equal(pre[i]) {
			changed = append(changed, post[i])
		}
	}
	if len(changed) == 0 {
		return
	}
	n.repl.off++
	if n.repl.down {
		return // backlogged: the resync brings it
	}
	rep, gen, off := n.replica, n.repl.gen, n.repl.off
	at := n.w.replDelivery(n, n.repl.n, true, time.Now())
	n.repl.n++
	if !at.After(n.repl.lastAt) {
		at = n.repl.lastAt.Add(time.Nanosecond)
	}
	n.repl.lastAt = at
	n.w.net.at(at, func() { rep.applyRepl(n, gen, off, changed) })
}

// replDelivery is when a message on primary p's replication link, sent at
// now, arrives: a seeded delay, slowed by repl-slow faults and held by
// repl-hole faults until they end.
func (w *World) replDelivery(p *Node, i uint64, toReplica bool, now time.Time) time.Time {
	dir := uint64(1)
	if toReplica {
		dir = 2
	}
	h := mix(mix(w.seed, 0x4e91<<20|uint64(p.id)), i<<2|dir)
	delay := 50*time.Microsecond + time.Duration(unit(mix(h, 0))*float64(450*time.Microsecond))
	sent := now.Sub(w.start)
	for _, f := range w.faults {
		if f.Kind == FaultReplSlow && f.Node == p.id && sent >= f.At && sent < f.At+f.For {
			delay += time.Duration(unit(mix(h, 1)) * float64(f.Amount))
		}
	}
	at := sent + delay
	for _, f := range w.faults {
		// Held while the hole is open, whether sent before or during it.
		if f.Kind == FaultReplHole && f.Node == p.id && f.At <= at && sent < f.At+f.For {
			at = f.At + f.For + delay
		}
	}
	return w.start.Add(at)
}

// applyRepl applies one replicated write on n, if it still follows p on
// link generation gen and it is the next one, and acknowledges it.
func (n *Node) applyRepl(p *Node, gen, off uint64, states []keyState) {
	n.mu.Lock()
	if n.down || n.master != p || n.followGen != gen || off != n.applied+1 {
		n.mu.Unlock()
		return
	}
	n.applyStatesLocked(states)
	n.applied = off
	if n.w.opts.Log {
		n.w.hist.logf("%s replica applied offset %d from %s (%d keys)", n.name, off, p.name, len(states))
	}
	n.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.replica != n || p.repl.gen != gen {
		return
	}
	at := n.w.replDelivery(p, p.repl.n, false, time.Now())
	p.repl.n++
	if !at.After(p.repl.lastAck) {
		at = p.repl.lastAck.Add(time.Nanosecond)
	}
	p.repl.lastAck = at
	n.w.net.at(at, func() { p.ack(n, gen, off) })
}

// ack records the replica's acknowledgement of off and wakes WAITs.
func (n *Node) ack(rep *Node, gen, off uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.replica != rep || n.repl.gen != gen || off <= n.repl.acked {
		return
	}
	n.repl.acked = off
	for _, wt := range slices.Clone(n.waiters) {
		n.finishWaitLocked(wt, false)
	}
}

// ackedLocked is how many replicas acknowledged offset target.
func (n *Node) ackedLocked(target uint64) int {
	if n.replica != nil && !n.repl.down && n.repl.acked >= target {
		return 1
	}
	return 0
}

// waitLocked answers WAIT numreplicas timeout on n.cur: at once, or by
// blocking the connection (n.block is set; execLocked sends no reply).
func (n *Node) waitLocked(args []string) (reply int, block bool) {
	num, err1 := strconv.Atoi(args[0])
	ms, err2 := strconv.Atoi(args[1])
	if err1 != nil || err2 != nil || num < 0 || ms < 0 {
		return -1, false
	}
	target := n.repl.off
	got := n.ackedLocked(target)
	if got >= num || n.cur == nil {
		return got, false
	}
	wt := &waiter{c: n.cur, target: target, num: num}
	n.waiters = append(n.waiters, wt)
	n.block = true
	if ms > 0 {
		n.w.after(time.Duration(ms)*time.Millisecond, func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			n.finishWaitLocked(wt, true)
		})
	}
	return 0, true
}

// finishWaitLocked answers a blocked WAIT if enough replicas acknowledged
// its target or it timed out, and serves what its connection sent since.
func (n *Node) finishWaitLocked(wt *waiter, timedOut bool) {
	if wt.done {
		return
	}
	got := n.ackedLocked(wt.target)
	if got < wt.num && !timedOut {
		return
	}
	wt.done = true
	n.waiters = slices.DeleteFunc(n.waiters, func(x *waiter) bool { return x == wt })
	c := wt.c
	q := n.blocked[c]
	delete(n.blocked, c)
	if _, ok := n.conns[c]; !ok {
		return
	}
	c.peer.WriteInt(got)
	_ = c.pw.Flush()
	reply := append([]byte(nil), c.pbuf.Bytes()...)
	c.pbuf.Reset()
	if n.w.opts.Log {
		n.w.hist.logf("%s WAIT %d answered %d (timed out: %v)", c.name, wt.num, got, timedOut)
	}
	c.sendReply(reply)
	for i, r := range q {
		if n.paused {
			n.queue = append(n.queue, q[i:]...)
			return
		}
		n.execLocked(r.c, r.args, r.sent)
		if _, ok := n.blocked[c]; ok {
			n.blocked[c] = append(n.blocked[c], q[i+1:]...)
			return
		}
	}
}

// dropWaitsLocked answers every blocked WAIT with what it has (a primary
// demoted, or the run ending).
func (n *Node) dropWaitsLocked() {
	for _, wt := range slices.Clone(n.waiters) {
		n.finishWaitLocked(wt, true)
	}
}

// follow makes n a replica of p, resynchronised from p's data now (a
// full resync: n's own data is replaced), on a new link generation.
func (n *Node) follow(p *Node) {
	p.mu.Lock()
	p.m.SetTime(p.clockLocked())
	data := snapshotOf(p.m, p.clockLocked())
	p.replica = n
	p.repl.gen++
	p.repl.down = false
	gen, off := p.repl.gen, p.repl.off
	p.repl.acked = off // the resync's own acknowledgement
	for _, wt := range slices.Clone(p.waiters) {
		p.finishWaitLocked(wt, false)
	}
	p.mu.Unlock()

	n.mu.Lock()
	defer n.mu.Unlock()
	n.dropWaitsLocked()
	n.master, n.followGen, n.applied = p, gen, off
	n.replica = nil
	if n.down {
		return
	}
	n.m.SetTime(n.clockLocked())
	n.m.FlushAll()
	restore(n.m, data, n.clockLocked())
	if n.w.opts.Log {
		n.w.hist.logf("%s resynced from %s at offset %d (%d keys)", n.name, p.name, off, len(data))
	}
}

// cutRepl cuts p's replication link: in-flight writes and acks are lost,
// nothing is shipped until resync.
func (p *Node) cutRepl() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.replica == nil {
		return
	}
	p.repl.gen++
	p.repl.down = true
}

// resync reconnects p's replica after a cut (or a restart of p).
func (p *Node) resync() {
	p.mu.Lock()
	rep := p.replica
	p.mu.Unlock()
	if rep != nil {
		rep.follow(p)
	}
}

// rejoin puts a restarted node back in replication: a replica
// resynchronises from its primary, a primary's replica from it (a new
// process: no partial resync).
func (n *Node) rejoin() {
	n.mu.Lock()
	p, rep := n.master, n.replica
	n.mu.Unlock()
	switch {
	case p != nil:
		n.follow(p)
	case rep != nil:
		rep.follow(n)
	}
}

// promote makes n a primary: it stops following its master (whose link
// to it is dropped) and keeps whatever it applied.
func (n *Node) promote() {
	n.mu.Lock()
	old := n.master
	n.master = nil
	n.mu.Unlock()
	if old == nil {
		return
	}
	old.mu.Lock()
	if old.replica == n {
		old.replica = nil
		old.repl.gen++
	}
	old.mu.Unlock()
}
