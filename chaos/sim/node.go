package sim

import (
	"bufio"
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	lua "github.com/yuin/gopher-lua"

	"github.com/redlease/redlease/internal/script"
)

// Node is one simulated Redis server: a miniredis command engine that the
// simulator feeds with requests from its links, with key expiry driven by
// the node's own clock (the bubble's virtual clock plus the node's offset),
// and with the behaviour miniredis lacks provided by a hook (see the
// package doc: INFO server's run_id, WAIT against a simulated replica).
type Node struct {
	w    *World
	id   int
	name string
	// cluster: a master of the simulated Cluster (cluster.go), announced
	// as addr.
	cluster bool
	addr    string
	// staleShard (cluster-failover): i+1 while this node, a master whose
	// replica took its shard i over, serves on as its master, not having
	// learnt of the takeover; 0 otherwise. Guarded by mu.
	staleShard int

	mu        sync.Mutex
	m         *miniredis.Miniredis
	runID     string
	boots     int
	paused    bool
	down      bool // restarting: dials refused
	queue     []queued
	offset    time.Duration // node clock minus virtual clock
	conns     map[*conn]struct{}
	replica   *Node                         // failover: the replica this primary feeds, nil if none
	repl      replLink                      // failover: state of the replication stream
	master    *Node                         // failover: the primary this replica follows, nil if a primary
	followGen uint64                        // as a replica: the link generation it follows
	applied   uint64                        // as a replica: offset applied
	cur       *conn                         // the connection whose command is being dispatched
	block     bool                          // set by WAIT: the reply is deferred, the connection blocked
	waiters   []*waiter                     // blocked WAITs
	blocked   map[*conn][]queued            // requests that arrived behind a blocked WAIT
	sent      *sentinelState                // a Sentinel (sentinel.go), nil for a Redis node
	dialsBy   map[int]int                   // per client: connections dialled, for per-message randomness
	snapshot  []snapKey                     // the last snapshot (for restarts that roll back)
	atCrash   []snapKey                     // the data when the node last crashed (durable restarts)
	scripts   map[string]*lua.FunctionProto // script cache: SHA → compiled source (lost on restart)
	lua       *luaVM                        // the node's Lua state (see lua.go)
	lcall     luaCallBufs                   // redis.call's peer and buffers (see lua.go)
	// The running script's writes to keys it did not declare (a Cluster
	// renewal in ExtendMany's local layout): the keys, and (with a
	// replica) their states before the script's first write to them, for
	// the state check and replication, as Redis replicates a script's
	// effects on every key. declared: the script's declared keys.
	scriptKeys, declared []string
	scriptPre            []keyState
	// asking: the command being dispatched came right after ASKING on
	// its connection (a Cluster node: it, and its script's calls, may
	// reach a slot the node imports; reshard.go).
	asking bool
	// gate, when set (hand-written tests), holds back the requests it
	// returns true for until openGate, as redistest.Gate does with
	// redis-server: the test decides the order in which they land.
	gate func(c *conn, args []string) bool
	held []queued
	// psubs (Wake and Elect scenarios): the connections subscribed to channels and
	// their channels; the simulator answers SUBSCRIBE, UNSUBSCRIBE, PING
	// in subscribed mode and PUBLISH itself (pubsub.go).
	psubs map[*conn]map[string]bool
	// badKeys: lock keys a badkey fault overwrote on this node while they
	// held a token, with the moment (virtual time) the token would have
	// expired; holds counts the token as held until then (nobody else can
	// take the key before: the hash outlives it).
	badKeys map[string]badKey
}

type badKey struct {
	token string
	exp   time.Time // virtual time
}

type queued struct {
	c    *conn
	args []string
	sent time.Time // when the client sent it
}

func newNode(w *World, id int, name string) *Node {
	n := &Node{w: w, id: id, name: name, conns: map[*conn]struct{}{}, dialsBy: map[int]int{}}
	n.start()
	return n
}

// start makes a fresh server process: empty data, a new run_id.
func (n *Node) start() {
	if n.m != nil {
		putMini(n.m) // the crashed process's engine, kept for reads until now
	}
	m := takeMini()
	m.SetTime(n.clockLocked())
	m.ClockTTL(true)
	m.Server().SetPreHook(n.hook)
	n.m = m
	n.scripts = map[string]*lua.FunctionProto{}
	if n.boots == 0 && n.w.warm(n.id) {
		n.loadLibraryScripts() // warm.go
	}
	n.dropLua()
	n.boots++
	n.runID = fmt.Sprintf("%040x", mix(n.w.seed, uint64(n.id)<<32|uint64(n.boots)))
}

// minis keeps miniredis engines whose node process ended, emptied, for
// the next node process in any run: making one (its server registers
// some 200 commands, each a closure and a map entry, and Dial starts it
// on a pipe served by a goroutine) was 2.4 % of watchdog-mixed's CPU and
// a tenth of its allocations, nine nodes per seed. An engine is put back
// only when nothing refers to it any more: at a restart (the new process
// replaces it) and at the end of Run, after its checks (releaseMini).
// What a run leaves in one is emptied by putMini: every database's keys
// (FlushAll), the hook (its node). The counters behind INFO's stats
// section carry over (the simulator answers INFO server itself; nothing
// asks for stats). An engine is never closed: Close would end its
// server, and a crashed node's closed engine served only reads anyway.
var minis sync.Pool // *miniredis.Miniredis

// takeMini returns an empty started miniredis engine.
func takeMini() *miniredis.Miniredis {
	if m, ok := minis.Get().(*miniredis.Miniredis); ok {
		return m
	}
	m := miniredis.NewMiniRedis()
	// Dial starts the server without a listener; the pipe is not used.
	if c, err := m.Dial(); err == nil {
		_ = c.Close()
	}
	return m
}

// putMini empties m and keeps it for takeMini.
func putMini(m *miniredis.Miniredis) {
	m.FlushAll()
	m.Server().SetPreHook(nil)
	minis.Put(m)
}

// releaseMini gives the node's engine back at the end of a run; the node
// must not be used after it.
func (n *Node) releaseMini() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m != nil {
		putMini(n.m)
		n.m = nil
	}
}

// clockLocked is the node's clock: virtual time plus its offset (its
// jumps) and its lead from clock-rate faults (drift.go).
func (n *Node) clockLocked() time.Time {
	now := time.Now()
	return now.Add(n.offset + n.w.nodeSkew(n.id, now))
}

// hook supplies what miniredis lacks. It runs inside Dispatch, with n.mu
// held by the caller (receive/exec), also for commands called from Lua.
func (n *Node) hook(p *server.Peer, cmd string, args ...string) bool {
	if n.sent != nil {
		return n.sentinelHook(p, cmd, args)
	}
	// A Cluster node redirects first: a replica answers a key of its
	// master's slots with MOVED, as Redis 7 does (READONLY only after the
	// READONLY command, which no client here sends).
	if n.cluster && n.clusterHook(p, cmd, args) {
		return true
	}
	if n.master != nil && (cmd == "EVAL" || cmd == "EVALSHA") && n.cur != nil && p == n.cur.peer {
		p.WriteError("READONLY You can't write against a read only replica.")
		return true
	}
	if (n.w.sc.Wake || n.w.sc.Elect || n.w.sc.SemWake) && n.pubsubHook(p, cmd, args) {
		return true
	}
	if n.evalHook(p, cmd, args) {
		return true
	}
	switch cmd {
	case "HELLO":
		// Every new connection's handshake (go-redis sends HELLO 2):
		// miniredis's reply, made once (see hello2Reply).
		if len(args) == 1 && args[0] == "2" {
			p.Resp3 = false
			p.WriteRaw(hello2Reply)
			return true
		}
	case "INFO":
		if len(args) == 1 && strings.EqualFold(args[0], "server") {
			mode := "standalone"
			if n.cluster {
				mode = "cluster"
			}
			p.WriteBulk("# Server\r\nredis_version:7.0.15\r\nredis_mode:" + mode + "\r\nrun_id:" + n.runID + "\r\n")
			return true
		}
	case "WAIT":
		if len(args) != 2 {
			p.WriteError("ERR wrong number of arguments for 'wait' command")
			return true
		}
		if n.master != nil {
			p.WriteError("ERR WAIT cannot be used with replica instances.")
			return true
		}
		r, block := n.waitLocked(args)
		switch {
		case r < 0:
			p.WriteError("ERR value is not an integer or out of range")
		case !block:
			p.WriteInt(r)
		}
		return true
	}
	return false
}

// hello2Reply is miniredis's reply to HELLO 2, taken from a miniredis
// once: its HELLO writes a constant map of seven entries value by value,
// each through the peer's mutex (1.5 % of watchdog-mixed's CPU, some 50
// handshakes per seed). TestHello2Reply checks it against a fresh
// miniredis's.
var hello2Reply = func() string {
	m := miniredis.NewMiniRedis()
	defer m.Close()
	if c, err := m.Dial(); err == nil {
		_ = c.Close()
	}
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	m.Server().Dispatch(server.NewPeer(w), []string{"HELLO", "2"})
	_ = w.Flush()
	return buf.String()
}()

// dial opens a connection from client to this node, or refuses it while
// the node restarts.
func (n *Node) dial(client int) (*conn, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.down {
		return nil, fmt.Errorf("dial %s: connection refused (restarting)", n.name)
	}
	k := n.dialsBy[client]
	n.dialsBy[client] = k + 1
	key := mix(uint64(n.id+1)<<40|uint64(client+2)<<20|uint64(k), 0x5eed)
	c := newConn(n.w, n, client, key, fmt.Sprintf("c%d>%s#%d", client, n.name, k))
	n.conns[c] = struct{}{}
	return c, nil
}

// forget drops a closed connection.
func (n *Node) forget(c *conn) {
	n.mu.Lock()
	delete(n.conns, c)
	delete(n.psubs, c)
	n.mu.Unlock()
}

// receive applies a request now, or queues it while the node is paused.
func (n *Node) receive(c *conn, args []string, sent time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.conns[c]; !ok {
		return // cut, or the node restarted since
	}
	if n.gate != nil && n.gate(c, args) {
		n.held = append(n.held, queued{c, args, sent})
		return
	}
	if n.paused {
		n.queue = append(n.queue, queued{c, args, sent})
		return
	}
	n.execLocked(c, args, sent)
}

// setGate makes the node hold back the requests gate returns true for.
func (n *Node) setGate(gate func(c *conn, args []string) bool) {
	n.mu.Lock()
	n.gate = gate
	n.mu.Unlock()
}

// openGate applies the requests held back, in arrival order, even those
// whose connection the client has closed since (Redis runs what it read
// before it sees the connection close), and removes the gate.
func (n *Node) openGate() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.gate = nil
	held := n.held
	n.held = nil
	for _, r := range held {
		n.execLocked(r.c, r.args, r.sent)
	}
}

func (n *Node) execLocked(c *conn, args []string, sent time.Time) {
	if q, ok := n.blocked[c]; ok { // behind a blocked WAIT, as Redis keeps a blocked client's input
		n.blocked[c] = append(q, queued{c, args, sent})
		return
	}
	// ASKING holds for the next command on the connection only.
	asking := c.asking
	c.asking = false
	if n.w.scriptCall(n, c, args, sent) {
		return
	}
	n.m.SetTime(n.clockLocked())
	var keys []string
	var pre []keyState
	if n.replica != nil {
		if keys = writeKeys(args); keys != nil {
			pre = n.keyStatesLocked(keys)
		}
	}
	ac := n.w.beforeApply(n, c, args)
	n.cur, n.asking = c, asking
	if isScript(args) {
		n.declared = writeKeys(args)
	}
	n.m.Server().Dispatch(c.peer, args)
	n.cur, n.declared, n.asking = nil, nil, false
	n.w.touch(n.id, args) // the state check runs once n.mu is released (flushState)
	if len(n.scriptKeys) > 0 {
		n.w.touchKeys(n.id, n.scriptKeys)
		if n.replica != nil {
			keys = append(slices.Clip(keys), n.scriptKeys...)
			pre = append(pre, n.scriptPre...)
		}
		n.scriptKeys, n.scriptPre = n.scriptKeys[:0], n.scriptPre[:0]
	}
	if keys != nil && n.replica != nil {
		n.replicateLocked(keys, pre)
	}
	if n.block {
		n.block = false
		if n.blocked == nil {
			n.blocked = map[*conn][]queued{}
		}
		n.blocked[c] = nil
		if n.w.opts.Log {
			n.w.hist.logf("%s blocked on %s (sent %.3fms)", c.name, describe(args), msf(sent.Sub(n.w.start)))
		}
		return
	}
	_ = c.pw.Flush()
	reply := append([]byte(nil), c.pbuf.Bytes()...)
	c.pbuf.Reset()
	if n.w.grants != nil {
		n.w.noteGrant(n, args, reply)
	}
	n.w.afterApply(n, ac, reply)
	if n.w.opts.Log {
		n.w.hist.logf("%s applied %s -> %s (sent %.3fms)", c.name, describe(args), strings.TrimSpace(strings.ReplaceAll(string(reply), "\r\n", " ")), msf(sent.Sub(n.w.start)))
	}
	d, lost, dropped := c.sendReply(reply)
	if lost && n.w.opts.Log {
		n.w.hist.logf("%s lost the reply to %s", c.name, describe(args))
	}
	if n.w.sc.Watchdog {
		n.w.noteRenewReply(c, args, sent, d, lost, dropped)
	}
}

// pause makes the node serve nothing until resume.
func (n *Node) pause() {
	n.mu.Lock()
	n.paused = true
	n.mu.Unlock()
}

// resume serves everything queued during the pause, in arrival order.
func (n *Node) resume() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.paused {
		return
	}
	n.paused = false
	q := n.queue
	n.queue = nil
	for _, r := range q {
		if _, ok := n.conns[r.c]; ok {
			n.execLocked(r.c, r.args, r.sent)
		}
	}
}

// crash stops the server process: every connection is cut (each its
// settle later: cutSoon), queued requests are lost, dials are refused
// until restart. A node already down stays as it is (two restart faults
// can overlap: the second one's crash must not record the dead process's
// data as what a durable restart brings back; failover seed 11836 lost a
// fence counter that way).
func (n *Node) crash() { n.stop((*conn).cutSoon) }

// stop is crash, cutting the connections with cut.
func (n *Node) stop(cut func(*conn)) {
	n.mu.Lock()
	if n.down {
		n.mu.Unlock()
		return
	}
	cs := make([]*conn, 0, len(n.conns))
	for c := range n.conns {
		cs = append(cs, c)
	}
	n.conns = map[*conn]struct{}{}
	n.psubs = nil
	n.queue = nil
	n.waiters, n.blocked = nil, nil
	n.paused = false
	n.down = true
	n.atCrash = snapshotOf(n.m, n.clockLocked())
	n.w.noteCrash(n)
	n.mu.Unlock()
	for _, c := range cs {
		cut(c)
	}
}

// restart starts a new server process. With keep, the data survives (a
// durable node); with fromSnapshot, the node comes back with its last
// snapshot (older keys only); otherwise it comes back empty. A node that
// is up (an overlapping restart fault already brought it back) is left
// alone; restart reports whether it restarted.
func (n *Node) restart(keep, fromSnapshot bool) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.down {
		return false
	}
	var data []snapKey
	switch {
	case keep:
		data = n.atCrash
	case fromSnapshot:
		data = n.snapshot
	}
	n.start()
	n.down = false
	restore(n.m, data, n.clockLocked())
	return true
}

// takeSnapshot records the node's keys, as an RDB save would.
func (n *Node) takeSnapshot() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.down {
		return
	}
	n.m.SetTime(n.clockLocked())
	n.snapshot = snapshotOf(n.m, n.clockLocked())
	n.w.noteSnapshot(n)
}

// jump moves the node's clock by d (forward when positive): key TTLs run
// out d sooner (later), and TIME answers accordingly.
func (n *Node) jump(d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.w.noteJump(n)
	n.offset += d
	if n.m != nil && !n.down {
		n.m.SetTime(n.clockLocked())
	}
}

// close stops the node for good (end of a run), its connections cut at
// once (the network stops next).
func (n *Node) close() {
	n.stop((*conn).cut)
	n.mu.Lock()
	n.dropLua()
	n.mu.Unlock()
}

// set writes a string key directly (setup, e.g. boot markers).
func (n *Node) set(key, val string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	_ = n.m.Set(key, val)
}

// holds reports whether key's value is val on the node now (true while
// the node is down: see checkHeld).
func (n *Node) holds(key, val string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.down {
		return true
	}
	n.m.SetTime(n.clockLocked())
	v, err := n.m.Get(key)
	if err == nil && v == val {
		return true
	}
	bk, ok := n.badKeys[key]
	return ok && bk.token == val && time.Now().Before(bk.exp)
}

// overwrite replaces key with a hash (a badkey fault) that lives as long
// as the key would have, plus extra. It returns the token the key held
// ("" if none) and when it would have expired (virtual time).
func (n *Node) overwrite(key string, extra time.Duration) (string, time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.down {
		return "", time.Time{}
	}
	n.m.SetTime(n.clockLocked())
	var tok string
	var exp time.Time
	ttl := time.Duration(0)
	if n.m.Type(key) == "string" {
		v, err := n.m.Get(key)
		if err == nil {
			ttl = n.m.TTL(key)
			if ttl > 0 {
				tok, exp = v, time.Now().Add(ttl)
				if n.badKeys == nil {
					n.badKeys = map[string]badKey{}
				}
				n.badKeys[key] = badKey{tok, exp}
			}
		}
	}
	n.m.Del(key)
	n.m.HSet(key, "bad", "1")
	n.m.SetTTL(key, max(ttl, 0)+extra)
	return tok, exp
}

// get reads a string key directly ("" if absent).
func (n *Node) get(key string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.m.SetTime(n.clockLocked())
	v, _ := n.m.Get(key)
	return v
}

// snapKey is one string key of a snapshot with its expiry on the node's
// clock (zero: none), so that time spent down counts, as in Redis.
type snapKey struct {
	key, val string
	hash     []string // a hash's fields and values (val unused)
	exp      time.Time
}

// snapshotOf copies the string and hash keys of m (locks, fence
// counters, boot markers, idempotency records: everything the library's
// scripts write). Other types are skipped and listed as a gap in the
// package doc.
func snapshotOf(m *miniredis.Miniredis, now time.Time) []snapKey {
	var out []snapKey
	for _, k := range m.Keys() {
		var sk snapKey
		switch m.Type(k) {
		case "string":
			v, err := m.Get(k)
			if err != nil {
				continue
			}
			sk = snapKey{key: k, val: v}
		case "hash":
			fs, err := m.HKeys(k)
			if err != nil {
				continue
			}
			sk = snapKey{key: k, hash: []string{}}
			for _, f := range fs {
				sk.hash = append(sk.hash, f, m.HGet(k, f))
			}
		default:
			continue
		}
		if ttl := m.TTL(k); ttl > 0 {
			sk.exp = now.Add(ttl)
		}
		out = append(out, sk)
	}
	return out
}

func restore(m *miniredis.Miniredis, data []snapKey, now time.Time) {
	for _, k := range data {
		if !k.exp.IsZero() && !k.exp.After(now) {
			continue
		}
		if k.hash != nil {
			m.HSet(k.key, k.hash...)
		} else {
			_ = m.Set(k.key, k.val)
		}
		if !k.exp.IsZero() {
			m.SetTTL(k.key, k.exp.Sub(now))
		}
	}
}

// itoa is strconv.Itoa, short.
func itoa(i int) string { return strconv.Itoa(i) }

// describe is a command line for the log, scripts named by their SHA.
func describe(args []string) string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if i == 1 && len(args) > 2 && (strings.EqualFold(args[0], "evalsha") || strings.EqualFold(args[0], "eval")) {
			a = scriptName(a)
		}
		if len(a) > 40 {
			a = a[:40] + "…"
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

// scriptNames maps the library's script SHAs (and sources) to names.
var scriptNames = func() map[string]string {
	m := map[string]string{}
	for name, s := range map[string]*script.Script{
		"acquire": script.Acquire, "raisefence": script.RaiseFence, "extend": script.Extend,
		"release": script.Release, "extendmany": script.ExtendMany,
	} {
		m[s.Hash()] = name
	}
	return m
}()

func scriptName(shaOrSrc string) string {
	if n, ok := scriptNames[shaOrSrc]; ok {
		return n
	}
	if len(shaOrSrc) > 40 {
		return "<script>"
	}
	return shaOrSrc
}

// isScript reports whether args is EVAL or EVALSHA.
func isScript(args []string) bool {
	return len(args) > 0 && (strings.EqualFold(args[0], "evalsha") || strings.EqualFold(args[0], "eval"))
}
