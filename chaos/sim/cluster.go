package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// The simulated Redis Cluster (watchdog-mixed's third lane): ClusterMasters
// nodes, each serving a third of the 16,384 hash slots as redis-cli
// --cluster create splits them, with no replicas. A go-redis ClusterClient
// learns the topology from them (CLUSTER SLOTS, answered here; miniredis's
// own CLUSTER claims every slot for itself) and the nodes refuse what a
// master of a Cluster refuses: a key of another master's slot (MOVED), keys
// of several slots in one command (CROSSSLOT; in a script, "do not hash to
// the same slot"), and a script touching a key of a slot the node does not
// serve (Redis 7's "non local key"). A script without a shebang (all of
// the library's) may touch keys of several slots the node serves, declared
// or not, as Redis 7.0 allows (checked against redis-server 7.0.15): only
// its declared keys must share a slot. Slots move only in
// cluster-failover's reshard (reshard.go; Node.redirect).

// ClusterMasters is the number of masters of the simulated Cluster.
const ClusterMasters = 3

// clusterPort is the port every simulated Cluster node announces.
const clusterPort = 6379

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// masterSlots is the slot range [lo, hi] master i serves: as redis-cli
// --cluster create splits 16,384 slots over three masters.
func masterSlots(i int) [2]int {
	return [ClusterMasters][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}[i]
}

// keySlot is Redis Cluster's hash slot of key: CRC16 (XMODEM) of its hash
// tag (between the first '{' and the next '}', if not empty) or of the
// whole key, mod 16384. Written here rather than borrowed from the library
// (internal/primary has its own): the simulator checks the library's
// routing against it.
func keySlot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % clusterSlots
}

// clusterKeys are the Cluster lane's lock keys, one per master: "c" and
// the smallest number whose slot that master serves.
var clusterKeys = func() (ks [ClusterMasters]string) {
	found := 0
	for i := 0; found < ClusterMasters && i < 10000; i++ {
		k := "c" + strconv.Itoa(i)
		m := masterOfSlot(keySlot(k))
		if ks[m] == "" {
			ks[m] = k
			found++
		}
	}
	return ks
}()

// masterOfSlot is the index (0..ClusterMasters-1) of the master serving
// slot.
func masterOfSlot(slot int) int {
	for i := range ClusterMasters {
		if r := masterSlots(i); slot >= r[0] && slot <= r[1] {
			return i
		}
	}
	return -1
}

// clusterBase is the id of the Cluster's first master: after the quorum's
// nodes and the single strategy's.
func (sc *Scenario) clusterBase() int {
	if sc.Strategy == FailoverCluster {
		return 0 // the run's only nodes: the masters, then their replicas
	}
	return sc.Nodes + 1
}

// master returns the Cluster node serving key.
func (w *World) master(key string) *Node {
	return w.masterNode(masterOfSlot(keySlot(key)))
}

// masterNode is the master of the i-th third of the slots: the node it
// started as, or the replica the failover construction promoted.
func (w *World) masterNode(i int) *Node {
	if n := w.cmaster[i].Load(); n != nil {
		return n
	}
	return w.nodes[w.sc.clusterBase()+i]
}

// viewMaster is the master of the i-th third of the slots as node n sees
// it (n may be nil: the Cluster's): n itself while it serves on after a
// takeover it has not learnt of (Node.staleShard), else the Cluster's.
// Called with n.mu held.
func (w *World) viewMaster(n *Node, i int) *Node {
	if n != nil && n.staleShard == i+1 {
		return n
	}
	return w.masterNode(i)
}

// clusterNodes are the Cluster's masters.
func (w *World) clusterNodes() []*Node {
	if !w.sc.Cluster {
		return nil
	}
	ms := make([]*Node, ClusterMasters)
	for i := range ms {
		ms[i] = w.masterNode(i)
	}
	return ms
}

// spareReplica is the Cluster's spare replica (clusterfail.go): the node
// after the masters.
func (w *World) spareReplica() *Node { return w.nodes[w.sc.clusterBase()+ClusterMasters] }

// nodeByAddr is the node that announces addr (a Cluster node: a master or
// the spare replica), or nil.
func (w *World) nodeByAddr(addr string) *Node {
	if !w.sc.Cluster {
		return nil
	}
	for _, n := range w.nodes[w.sc.clusterBase():] {
		if n.addr == addr {
			return n
		}
	}
	return nil
}

// clusterID is node n's Cluster node id (40 hex digits; kept across
// restarts, as nodes.conf keeps it).
func (n *Node) clusterID() string { return fmt.Sprintf("%040x", mix(0xc1, uint64(n.id))) }

// clusterClient returns a go-redis ClusterClient of workload client ci,
// seeded with the first master's address and reaching the masters through
// the simulator's Dialer, with the options redisClient gives a plain
// client. go-redis picks the seed address it asks CLUSTER SLOTS with
// math/rand's global source, which no seed controls: with one, it asks
// that master (it knows the others as nodes of the topology, not as seed
// addresses, and reloads the topology only on MOVED, ASK and READONLY,
// which no simulated master answers). DisableRoutingPolicies: go-redis
// would otherwise fetch COMMAND, for Redis 7's command tips, from a master
// it picks the same way; miniredis's COMMAND has no tips, so every command
// of the library routes by its key's slot either way. (freshClusterClient
// keeps them on, for the fresh-client construction.)
func (w *World) clusterClient(ci int, ctxTimeouts bool) *redis.ClusterClient {
	c := w.newClusterClient(ci, ctxTimeouts, true)
	// Warm up: the client's first command loads the topology (CLUSTER
	// SLOTS), here while the run sets up on a quiet network (World.quiet).
	// (go-redis fetches COMMAND, with routing policies on, holding a mutex
	// every other command of the client waits for; a goroutine waiting on
	// a mutex is not durably blocked, so synctest's clock stopped while the
	// fetch waited for a reply only the clock could bring, a paused or
	// black-holed master: seed 100 hung in real time.) A command on a key
	// of the first master, not PING: go-redis sends a keyless command to a
	// master it picks at random.
	if err := c.Exists(context.Background(), clusterKeys[0]).Err(); err != nil {
		w.hist.logf("c%d cluster client warm-up: %v", ci, err)
	}
	return c
}

// freshClusterClient is clusterClient with go-redis's default routing
// policies (DisableRoutingPolicies false), as a Cluster user's client has
// them, warmed up without a routed command: ForEachMaster loads the
// topology and PINGs every master on the master's own connection, so the
// client knows every master and has a connection to each, but has not
// fetched COMMAND yet. Its first routed command fetches it (go-redis
// asks up to three masters in math/rand's order, each with a ctx of its
// own, see clusterbound.go).
func (w *World) freshClusterClient(ci int, ctxTimeouts bool) *redis.ClusterClient {
	c := w.newClusterClient(ci, ctxTimeouts, false)
	if err := c.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
		return m.Ping(ctx).Err()
	}); err != nil {
		w.hist.logf("c%d fresh cluster client warm-up: %v", ci, err)
	}
	return c
}

// newClusterClient is the ClusterClient of clusterClient and
// freshClusterClient, not yet warmed up.
func (w *World) newClusterClient(ci int, ctxTimeouts, disableRouting bool) *redis.ClusterClient {
	first := w.clusterNodes()[0]
	backoff := w.retryBackoff(ci, uint64(first.id))
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: []string{first.addr},
		Dialer: func(ctx context.Context, _, addr string) (net.Conn, error) {
			n := w.nodeByAddr(addr)
			if n == nil {
				return nil, fmt.Errorf("dial %s: no such simulated node", addr)
			}
			return n.dial(ci)
		},
		ClusterSlots:             w.clusterSlotsLoader(ci, ctxTimeouts),
		ContextTimeoutEnabled:    ctxTimeouts,
		DisableIdentity:          true,
		MinRetryBackoff:          backoff, // see redisClient
		MaxRetryBackoff:          backoff,
		DialerRetryTimeout:       w.dialRetry(ci, uint64(first.id)),
		DisableRoutingPolicies:   disableRouting,
		PoolSize:                 64, // see redisClient
		Protocol:                 2,
		ReadBufferSize:           1024,
		WriteBufferSize:          1024,
		PipelineReadBufferSize:   1024,
		PipelineWriteBufferSize:  1024,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	c.AddHook(w.orderHookFor(ci, 1<<17))
	w.mu.Lock()
	w.clients = append(w.clients, c)
	w.mu.Unlock()
	return c
}

// clusterHook answers CLUSTER on a Cluster node and refuses keys the node
// does not serve, as a Redis Cluster master does. It reports whether it
// answered. Called from hook, with n.mu held.
func (n *Node) clusterHook(p *server.Peer, cmd string, args []string) bool {
	if cmd == "CLUSTER" {
		n.clusterCommand(p, args)
		return true
	}
	if cmd == "ASKING" {
		if n.cur != nil && p == n.cur.peer {
			n.cur.asking = true // for the connection's next command (execLocked)
		}
		p.WriteOK()
		return true
	}
	keys, _ := commandKeys(cmd, args)
	fromScript := p == n.lcall.peer
	slot := -1
	for _, k := range keys {
		s := keySlot(k)
		if slot >= 0 && s != slot {
			if fromScript {
				p.WriteError("ERR Script attempted to access keys that do not hash to the same slot")
			} else {
				p.WriteError("CROSSSLOT Keys in request don't hash to the same slot")
			}
			return true
		}
		slot = s
	}
	if slot < 0 {
		return false
	}
	if n.w.clusterIsDown() {
		// Redis 7's getNodeByQuery: the cluster's state is checked after
		// CROSSSLOT, before any redirection (clusterdown.go).
		if fromScript {
			p.WriteError("ERR Script attempted to execute a command while the cluster is down")
		} else {
			p.WriteError("CLUSTERDOWN The cluster is down")
		}
		return true
	}
	refusal, why := n.redirect(slot, keys)
	if refusal == "" {
		return false
	}
	n.w.mu.Lock()
	n.w.moved++
	n.w.mu.Unlock()
	if n.w.opts.Log {
		n.w.hist.logf("%s refused %s: slot %d %s", n.name, describe(append([]string{cmd}, args...)), slot, why)
	}
	if fromScript {
		// Redis 7.0's scriptVerifyClusterState: any redirection of a
		// call inside a script (MOVED, ASK, TRYAGAIN) fails that call.
		p.WriteError("ERR Script attempted to access a non local key in a cluster node")
	} else {
		p.WriteError(refusal)
	}
	return true
}

// redirect is what node n answers instead of running a command on keys of
// slot (all of that slot), as Redis 7.0's getNodeByQuery decides it:
// "" to run it; otherwise the error, and why (for the log). A command
// from a script is judged alike, with the ASKING of the command that ran
// the script (Node.asking), as Redis copies it to the script's client.
// While slot migrates (reshard.go): on the source, a command whose keys
// are all present runs, one whose keys are all absent gets ASK to the
// target, one with some of each TRYAGAIN; on the target, a command right
// after ASKING runs (TRYAGAIN if it names several keys and one is
// absent), any other gets MOVED to the source, the slot's owner until
// SETSLOT NODE. A key that expired counts as absent, as lookupKeyRead
// finds it. Checked against redis-server 7.0.15 (two cluster-enabled
// nodes, one slot IMPORTING and MIGRATING, a key moved with MIGRATE):
// GET, MGET and EVAL with declared keys on the source (present: runs;
// absent: ASK; mixed: TRYAGAIN), GET with and without ASKING on the
// target (ASKING lets one command through; the next gets MOVED), MGET of
// a present and an absent key after ASKING (TRYAGAIN), EVAL without
// declared keys on the source and on the target without ASKING
// (redis.call and redis.pcall of an absent key: "non local key"; of a
// present key on the source: runs; after ASKING on the target: runs), an
// expired key on the source (ASK), and, after SETSLOT NODE, MOVED from
// the source.
func (n *Node) redirect(slot int, keys []string) (refusal, why string) {
	rt := n.w.route(n, slot)
	tryAgain := "TRYAGAIN Multiple keys request during rehashing of slot"
	switch {
	case rt.migratingTo != nil:
		present, absent := n.presence(keys)
		switch {
		case absent == 0:
			return "", ""
		case present > 0:
			return tryAgain, fmt.Sprintf("migrating to %s: %d keys present, %d absent", rt.migratingTo.name, present, absent)
		}
		return fmt.Sprintf("ASK %d %s", slot, rt.migratingTo.addr), "migrating to " + rt.migratingTo.name + ": absent"
	case rt.importingFrom != nil && n.asking:
		if _, absent := n.presence(keys); absent > 0 && distinct(keys) > 1 {
			return tryAgain, fmt.Sprintf("importing from %s, after ASKING: %d of several keys absent", rt.importingFrom.name, absent)
		}
		return "", ""
	case rt.owner != n:
		return fmt.Sprintf("MOVED %d %s", slot, rt.owner.addr), "is " + rt.owner.name + "'s"
	}
	return "", ""
}

// presence counts keys present on n now (an expired key is absent) and
// absent. Called with n.mu held.
func (n *Node) presence(keys []string) (present, absent int) {
	n.m.SetTime(n.clockLocked())
	for _, k := range keys {
		if n.m.Exists(k) {
			present++
		} else {
			absent++
		}
	}
	return present, absent
}

// distinct is the number of distinct keys.
func distinct(keys []string) int {
	d := 0
	for i, k := range keys {
		if !slices.Contains(keys[:i], k) {
			d++
		}
	}
	return d
}

// commandKeys are the keys of a command (cmd upper case, args without it)
// for the Cluster's checks; script: it is EVAL or EVALSHA (its declared
// keys). Commands without keys return none.
func commandKeys(cmd string, args []string) (keys []string, script bool) {
	switch cmd {
	case "EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO":
		if len(args) < 2 {
			return nil, true
		}
		nk, err := strconv.Atoi(args[1])
		if err != nil || nk < 0 || 2+nk > len(args) {
			return nil, true
		}
		return args[2 : 2+nk], true
	case "DEL", "EXISTS", "UNLINK", "MGET", "TOUCH", "WATCH":
		return args, false
	case "MSET", "MSETNX":
		for i := 0; i < len(args); i += 2 {
			keys = append(keys, args[i])
		}
		return keys, false
	case "PING", "HELLO", "CLIENT", "COMMAND", "INFO", "SCRIPT", "SELECT", "AUTH", "ECHO", "TIME",
		"WAIT", "READONLY", "READWRITE", "QUIT", "DBSIZE", "FLUSHALL", "FLUSHDB", "MULTI", "EXEC",
		"DISCARD", "KEYS", "SCAN", "RANDOMKEY", "CONFIG", "DEBUG", "ASKING", "ROLE", "PUBLISH":
		return nil, false
	}
	if len(args) > 0 {
		return args[:1], false
	}
	return nil, false
}

// clusterCommand answers CLUSTER SLOTS (what go-redis's ClusterClient asks
// to learn the topology), SHARDS, NODES, MYID, KEYSLOT and INFO, as node n
// sees the Cluster (viewMaster, shardMembers). Called with n.mu held.
func (n *Node) clusterCommand(p *server.Peer, args []string) {
	if len(args) == 0 {
		p.WriteError("ERR wrong number of arguments for 'cluster' command")
		return
	}
	masters := make([]*Node, ClusterMasters)
	for i := range masters {
		masters[i] = n.w.viewMaster(n, i)
	}
	switch strings.ToUpper(args[0]) {
	case "SLOTS":
		entries := 0
		for i := range masters {
			entries += len(n.w.shardRanges(i))
		}
		p.WriteLen(entries)
		for i := range masters {
			ms := n.w.slotNodes(n, i)
			for _, r := range n.w.shardRanges(i) {
				p.WriteLen(2 + len(ms))
				p.WriteInt(r[0])
				p.WriteInt(r[1])
				for _, m := range ms {
					p.WriteLen(3)
					p.WriteBulk(m.name)
					p.WriteInt(clusterPort)
					p.WriteBulk(m.clusterID())
				}
			}
		}
	case "SHARDS":
		// Redis 7's shape in RESP2: per shard a flat map of "slots" (start
		// and end of each range) and "nodes" (each a flat map).
		p.WriteLen(len(masters))
		for i := range masters {
			rs := n.w.shardRanges(i)
			ms := n.w.shardMembers(n, i)
			p.WriteLen(4)
			p.WriteBulk("slots")
			p.WriteLen(2 * len(rs))
			for _, r := range rs {
				p.WriteInt(r[0])
				p.WriteInt(r[1])
			}
			p.WriteBulk("nodes")
			p.WriteLen(len(ms))
			for _, m := range ms {
				p.WriteLen(14)
				for _, kv := range [][2]string{{"id", m.node.clusterID()}, {"ip", m.node.name}, {"endpoint", m.node.name}, {"role", m.role}, {"health", m.health}} {
					p.WriteBulk(kv[0])
					p.WriteBulk(kv[1])
				}
				p.WriteBulk("port")
				p.WriteInt(clusterPort)
				p.WriteBulk("replication-offset")
				p.WriteInt(0)
			}
		}
	case "NODES":
		var b strings.Builder
		for i, m := range masters {
			flags := "master"
			if m == n {
				flags = "myself,master"
			}
			fmt.Fprintf(&b, "%s %s@%d %s - 0 0 %d connected", m.clusterID(), m.addr, clusterPort+10000, flags, i+1)
			for _, r := range n.w.shardRanges(i) {
				fmt.Fprintf(&b, " %d-%d", r[0], r[1])
			}
			b.WriteByte('\n')
		}
		p.WriteBulk(b.String())
	case "MYID":
		p.WriteBulk(n.clusterID())
	case "KEYSLOT":
		if len(args) != 2 {
			p.WriteError("ERR wrong number of arguments for 'cluster|keyslot' command")
			return
		}
		p.WriteInt(keySlot(args[1]))
	case "INFO":
		p.WriteBulk(fmt.Sprintf("cluster_enabled:1\r\ncluster_state:ok\r\ncluster_slots_assigned:%d\r\ncluster_slots_ok:%d\r\ncluster_known_nodes:%d\r\ncluster_size:%d\r\n",
			clusterSlots, clusterSlots, len(masters), len(masters)))
	default:
		p.WriteError("ERR unknown subcommand '" + args[0] + "'. Try CLUSTER HELP.")
	}
}

// shardMember is one node of a shard as CLUSTER SHARDS lists it.
type shardMember struct {
	node         *Node
	role, health string
}

// shardMembers are the nodes of the i-th shard as node n (nil: the
// Cluster) sees them: its master, then (cluster-failover) the shard's
// other node as World.shardRole says, or, in the view of a master serving
// on after a takeover it has not learnt of, as its replica. Called with
// n.mu held, if n is not nil.
func (w *World) shardMembers(n *Node, i int) []shardMember {
	m := w.viewMaster(n, i)
	out := []shardMember{{node: m, role: "master", health: "online"}}
	if w.sc.Strategy != FailoverCluster {
		return out
	}
	other := w.nodes[i]
	if other == m {
		other = w.nodes[ClusterMasters+i]
	}
	if n != nil && n.staleShard == i+1 {
		return append(out, shardMember{node: other, role: "replica", health: "online"})
	}
	w.mu.Lock()
	st := w.shardRole[i]
	w.mu.Unlock()
	if st.role == "" {
		st = shardState{role: "replica", health: "online"}
	}
	return append(out, shardMember{node: other, role: st.role, health: st.health})
}

// slotNodes are the nodes CLUSTER SLOTS lists for the i-th third of the
// slots, as node n sees them: its master, then its replicas that are
// online (as Redis 7 leaves failed replicas out).
func (w *World) slotNodes(n *Node, i int) []*Node {
	var out []*Node
	for _, m := range w.shardMembers(n, i) {
		if m.role == "master" && len(out) == 0 || m.role == "replica" && m.health == "online" {
			out = append(out, m.node)
		}
	}
	return out
}

// shardState is what CLUSTER SHARDS says of a shard's node that is not
// its master (cluster-failover): "replica" while it follows the master,
// "master" (no slots) from the promotion that replaced it until it
// follows the new master, "failed" while it is down.
type shardState struct{ role, health string }

// clusterSlotsLoader is a ClusterClient's topology source (its
// ClusterSlots option). go-redis would ask the nodes it knows for CLUSTER
// SLOTS in math/rand's order, which no seed controls: a reload (the
// library asks for one when a master leaves a call unanswered) would ask a
// dead master first in some runs and not in others, and take longer when
// it does. This asks them the same way, over the simulated network through
// a plain go-redis client of client ci to each (created on first use, with
// the ClusterClient's ContextTimeoutEnabled), in an order drawn from the
// seed per load, and returns the first answer. The nodes it knows: the
// first master, then every master an answer named. The first load, the
// client's warm-up on a quiet network, is answered from the simulated
// masters without a round trip.
func (w *World) clusterSlotsLoader(ci int, ctxTimeouts bool) func(context.Context) ([]redis.ClusterSlot, error) {
	var (
		mu      sync.Mutex
		loads   uint64
		known   = []*Node{w.clusterNodes()[0]}
		clients = map[*Node]*redis.Client{}
	)
	return func(ctx context.Context) ([]redis.ClusterSlot, error) {
		mu.Lock()
		loads++
		if loads == 1 {
			// The first load (the client's warm-up, on a quiet network,
			// asking the first master): answered from the masters
			// directly, sparing each client a connection of its own.
			known = w.clusterNodes()
			mu.Unlock()
			return w.clusterSlots(), nil
		}
		ask := slices.Clone(known)
		r := rand.New(rand.NewPCG(mix(w.seed, 0x5107), uint64(ci+2)<<32|loads))
		r.Shuffle(len(ask), func(i, j int) { ask[i], ask[j] = ask[j], ask[i] })
		cs := make([]*redis.Client, len(ask))
		for i, n := range ask {
			if clients[n] == nil {
				clients[n] = w.redisClientAs(ci, n, ctxTimeouts, n.addr)
			}
			cs[i] = clients[n]
		}
		mu.Unlock()
		var first error
		for _, c := range cs {
			slots, err := c.ClusterSlots(ctx).Result()
			if err != nil {
				if first == nil {
					first = err
				}
				continue
			}
			mu.Lock()
			for _, sl := range slots {
				for _, nd := range sl.Nodes {
					if n := w.nodeByAddr(nd.Addr); n != nil && !slices.Contains(known, n) {
						known = append(known, n)
					}
				}
			}
			mu.Unlock()
			return slots, nil
		}
		return nil, first
	}
}

// clusterSlots is CLUSTER SLOTS as the masters answer it now.
func (w *World) clusterSlots() []redis.ClusterSlot {
	ms := w.clusterNodes()
	var out []redis.ClusterSlot
	for i := range ms {
		var nodes []redis.ClusterNode
		for _, m := range w.slotNodes(nil, i) {
			nodes = append(nodes, redis.ClusterNode{ID: m.clusterID(), Addr: m.addr})
		}
		for _, r := range w.shardRanges(i) {
			out = append(out, redis.ClusterSlot{Start: r[0], End: r[1], Nodes: nodes})
		}
	}
	return out
}
