package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/backoff"
	"github.com/redlease/redlease/internal/locktoken"
	"github.com/redlease/redlease/internal/splitmix"
)

// World is one run: the nodes, the links between them and the clients,
// the seed's fault schedule, and the history the checker reads. Run makes
// one; its fields are the simulator's own.
type World struct {
	// cmaster: the Cluster's master of each third of the slots once the
	// failover construction promoted a replica (clusterfail.go); nil: the
	// node it started as.
	cmaster [ClusterMasters]atomic.Pointer[Node]

	seed uint64
	sc   Scenario
	// warmDraw: nodes are drawn warm (warm.go); a generated run's world
	// only.
	warmDraw bool
	opts     Options
	start    time.Time
	nodes    []*Node
	faults   []Fault
	hist     *history
	net      *sched // delivers messages, runs the nodes' commands
	// verifyReadings (tests): the state check compares every node reading
	// it lets stand with a fresh one (checkLockLocked).
	verifyReadings bool

	mu      sync.Mutex
	msgs    int // messages sent (both directions)
	lost    int // messages lost
	clients []redis.UniversalClient
	// clientsClosed: Run closed clients; a client made later is closed as
	// it is made (redisClientAs).
	clientsClosed bool
	closers       []closer
	verbose       bool
	schedLog      []string
	badHits       []badHit       // badkey faults that replaced a token
	hashes        []hashWin      // badkey faults: where and while a hash stood in a lock key
	renews        []renewCall    // renewal script calls answered by an errnode fault
	errCalls      map[[2]int]int // (node, virtual second) → script calls answered with a fast error
	moved         int            // commands a Cluster node refused as another master's (MOVED, non-local key)
	// shardRole (cluster-failover): what CLUSTER SHARDS says of each
	// shard's node that is not its master (zero: a replica, online).
	shardRole [ClusterMasters]shardState
	cfo       *clusterFailover // cluster-failover's construction (clusterrepl.go), nil elsewhere
	resh      *reshard         // cluster-failover's slot migration (reshard.go), nil if none drawn
	// quiet: while the run sets its clients up (Cluster clients warm up),
	// messages get their base delay only: no spike, loss or fault.
	quiet atomic.Bool
	// renewals: every renewal request (extend, extendmany) of a lock and
	// its reply as the network treated them, by token (health.go).
	renewals map[string][]*renewMsg
	links    map[[2]int][]linkMsg // (client, node) → every message between them, in send order
	pending  map[pendingRenewal]*renewMsg
	grants   map[string]grantRec // failover: acquisition token → its last grant
	watchers map[int]watchInfo
	closing  map[int]bool // failover: clients whose Watcher is closing (see failoverClient)
	// Revoke scenarios (revokework.go): the forced releases sent, the
	// fence of every kept grant by token, and every key+"\x00"+token
	// some node was sent a script for.
	revokes      []revocation
	revokeGrants map[string]uint64
	revokeSent   map[string]bool
	// Wake scenarios (wakework.go): every Lock call and every release.
	wakeWaits []wakeWait
	semWaits  []semWaitRec // SemWake: the Acquire and Do calls of the Sem clients
	wakeRels  []wakeRelease
	scope     scopeRecs // what the nodes recorded for the hazard scopes (scope.go)
	fifo      fifoRecs  // fair mode's line as the nodes applied grants (fifo.go)

	// Clock rates (drift.go), the state-valid invariant (statecheck.go)
	// and the ops scenarios' options (opswork.go, nil elsewhere).
	drift driftPlan
	state stateCheck
	ops   *opsPlan
	bnd   boundsState // the bound invariants' constructions (bounds.go)
	elect electState  // the Elect workload's records (electwork.go)
	idem  idemState   // the idempotency workloads' records (idemwork.go)

	// reqSeen: requests sent per (client, node, content), for their
	// identities (requestID).
	reqMu   sync.Mutex
	reqSeen map[uint64]seenCount
}

// seenCount counts the requests of one content a client sent one node: the
// instant of the last, how many were sent before that instant, and in all.
type seenCount struct {
	at           time.Time
	before, sent uint64
}

// badHit is one node on which a badkey fault replaced a lock's token.
type badHit struct {
	at    time.Duration
	node  int
	key   string
	token string
	exp   time.Duration // when the token would have expired there
}

// hashWin is a hash a badkey fault left in a lock key on a node.
type hashWin struct {
	node     int
	key      string
	from, to time.Duration
}

// renewCall is one renewal (extend, extendmany) of one lock sent to a
// node while it answered every script call with an error.
type renewCall struct {
	node       int
	key, token string
	at         time.Duration // answered
	sent       time.Duration // sent by the client (the gap check's clock)
}

// mix is splitmix64 over a and b (internal/splitmix, as the library's
// seeded draws): the simulator's only hash, for
// per-message randomness that does not depend on the order in which
// goroutines happen to draw it.
func mix(a, b uint64) uint64 { return splitmix.Mix(a, b) }

// unit maps h to [0, 1).
func unit(h uint64) float64 { return float64(h>>11) / (1 << 53) }

// A message's delay without a fault: baseDelay plus up to baseJitter, and
// one message in 50 up to maxSpike more (see fate). maxOneWay is the
// longest a message can take without a delay fault (health.go derives its
// bound from it).
const (
	baseDelay  = 20 * time.Microsecond
	baseJitter = 480 * time.Microsecond
	maxSpike   = 40 * time.Millisecond
	maxOneWay  = baseDelay + baseJitter + maxSpike
)

// fate decides the delay of message i in one direction of c (its index
// on c), whose identity is id, or that it is lost. It reads the seed's
// schedule at the current virtual time, and draws from a hash of (seed,
// id, direction). A request's id is its content and how many times its
// client sent that content to that node before (requestID), a reply's the
// request the node last took from c and its count since (conn.send): not
// the connection, so that two requests a go-redis client sends at one
// instant draw their fates whichever pooled connection each takes, and a
// message's fate does not depend on which goroutine sent first.
func (w *World) fate(c *conn, toNode bool, i, id uint64, now time.Time) (time.Duration, bool) {
	d := uint64(1)
	if toNode {
		d = 2
	}
	if bd, lost, ok := w.boundsFate(c, toNode, i, now); ok {
		return bd, lost
	}
	h := mix(mix(w.seed, id), d)
	u := func(k uint64) float64 { return unit(mix(h, k)) }
	delay := baseDelay + time.Duration(u(0)*float64(baseJitter))
	if (w.sc.Wake || w.sc.SemWake) && i == 0 {
		// A connection's handshake (HELLO and its reply) in a Wake (or
		// SemWake) scenario: no delay, no loss. go-redis's PubSub dials and
		// handshakes holding its mutex, and the hub's other goroutine
		// waits on that mutex: a goroutine blocked on a mutex is not
		// durably blocked, so the bubble's clock would stop with the
		// HELLO reply still due (see the package doc's gaps).
		return 0, false
	}
	if !w.sc.Faults || c.client < 0 || w.quiet.Load() || w.sheltered(c.client) {
		return delay, false
	}
	if u(1) < 0.02 { // a spike: a reply can arrive after the next attempt started
		delay += time.Duration(u(2) * float64(maxSpike))
	}
	// Sentinels lose messages only under their own faults; Wake
	// scenarios only pub/sub messages, under theirs (pushFate).
	if u(3) < 0.002 && c.node.sent == nil && !w.sc.Wake {
		return 0, true
	}
	at := now.Sub(w.start)
	for _, f := range w.faults {
		if at < f.At || at >= f.At+f.For {
			continue
		}
		switch f.Kind {
		case FaultDelay:
			if f.Node == c.node.id {
				delay += time.Duration(u(4) * float64(f.Amount))
			}
		case FaultLoss, FaultSentinelLossy:
			if f.Node == c.node.id && u(5) < f.Prob {
				return 0, true
			}
		case FaultBlackhole:
			if f.Node == c.node.id {
				return 0, true
			}
		case FaultPartition:
			if f.Client == c.client && slices.Contains(f.Nodes, c.node.id) {
				return 0, true
			}
		}
	}
	return delay, false
}

// requestID is the identity of a request of c's client to c's node, sent
// at now: its content (args, see contentHash) and how many requests with
// that content the client sent to the node before. Two requests with different
// contents keep their identities whatever order they are sent in.
//
// A connection's handshake (HELLO, its first request) counts only the
// handshakes of earlier instants: those sent at one instant share one
// identity, so one fate. go-redis retries each failed dial after the same
// DialerRetryTimeout, in a goroutine that serves one command; two such
// dials at one instant handshake in the scheduler's order, and counted one
// by one the first would take the first fate, and with it which command
// got the faster connection (cluster-failover 26: a release and an undo,
// both waiting for node2 to come back). The commands then written on
// connections that finished their handshakes together pass the turnstile
// first (conn.Write). Other requests count one by one: sharing the fate
// of alike requests on two connections (the WAITs behind an Extend and a
// renewal) makes their replies arrive together, and the callers they wake
// race (fence-expiry-failover 2).
func (w *World) requestID(c *conn, args []string, now time.Time) uint64 {
	k := mix(mix(uint64(c.client+2)<<32|uint64(c.node.id+1), 0x7e9), contentHash(args))
	w.reqMu.Lock()
	defer w.reqMu.Unlock()
	if w.reqSeen == nil {
		w.reqSeen = map[uint64]seenCount{}
	}
	rs := w.reqSeen[k]
	n := rs.sent
	if !rs.at.Equal(now) {
		rs.at, rs.before = now, rs.sent
	}
	rs.sent++
	w.reqSeen[k] = rs
	if c.helloOnly {
		n = rs.before
	}
	return mix(k, n)
}

// contentHash is FNV-1a over a command's arguments, each prefixed by its
// length; an argument longer than 256 bytes (a script's source) counts by
// its length and its first and last 64 bytes.
func contentHash(args []string) uint64 {
	h := uint64(14695981039346656037)
	add := func(s string) {
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= 1099511628211
		}
	}
	for _, a := range args {
		h ^= uint64(len(a))
		h *= 1099511628211
		if len(a) > 256 {
			add(a[:64])
			add(a[len(a)-64:])
			continue
		}
		add(a)
	}
	return h
}

// noteMessage counts a message sent at now on c and, in the Watchdog
// scenario, records its fate per (client, node) link for health.go.
func (w *World) noteMessage(c *conn, now time.Time, delay time.Duration, lost bool) {
	w.mu.Lock()
	w.msgs++
	if lost {
		w.lost++
	}
	if w.sc.Watchdog && c.client >= 0 {
		if w.links == nil {
			w.links = map[[2]int][]linkMsg{}
		}
		k := [2]int{c.client, c.node.id}
		w.links[k] = append(w.links[k], linkMsg{at: now.Sub(w.start), delay: delay, lost: lost})
	}
	w.mu.Unlock()
}

// Sites of jitterCtx: each calling workload apart.
const (
	jitLock uint64 = iota + 1
	jitDo
	jitLong
	jitOpsLock
	jitOpsDo
	jitPastMax
	jitWake
	jitBarrier
	jitWatch
	jitTokens
	jitClusterFresh
	jitClusterFail
	jitClusterRepl
	jitMulti
	jitRevoke
	jitSem
	jitElect
)

// jitterCtx returns ctx seeded for the library's jitter (internal/backoff:
// Lock's retry backoff, a waiter's undo pauses, the failover Watcher's
// resubscription pauses) and its lock tokens (internal/locktoken: the base
// token of a Lock or TryLock call, which is also its waiter id in fair
// mode, where two waiters whose tickets tie are ordered by id) of client
// ci's call seq at site, so that those draws are the seed's and replay
// with it, whichever goroutine runs first.
func (w *World) jitterCtx(ctx context.Context, ci int, site uint64, seq int) context.Context {
	seed := mix(mix(w.seed, uint64(ci+1)<<8|site), uint64(seq))
	return locktoken.WithSeed(backoff.WithSeed(ctx, seed), seed)
}

// retryAtOnce is the workloads' Lock retry delay: the next attempt goes
// 1 or 2 ns after the last one was decided. Not 0: the last attempt's
// undo leaves at that instant, and a node's two workers taking the undo
// and the next attempt at one instant would take pooled connections (or
// dial) in the Go scheduler's order.
func retryAtOnce() redlease.LockOption {
	return redlease.WithRetryDelay(2*time.Nanosecond, 2*time.Nanosecond)
}

// after runs f after d of virtual time, on the network's goroutine.
func (w *World) after(d time.Duration, f func()) { w.net.at(time.Now().Add(d), f) }

// redisClient returns a go-redis client of workload client ci to node n,
// unmodified but for its Dialer, which opens a simulated connection.
func (w *World) redisClient(ci int, n *Node, ctxTimeouts bool) *redis.Client {
	return w.redisClientAs(ci, n, ctxTimeouts, n.name)
}

// redisClientAs is redisClient with Addr addr (only the name the client
// reports: it dials n whatever addr says), as a redis.NewFailoverClient
// reports "FailoverClient" whatever primary it reaches.
func (w *World) redisClientAs(ci int, n *Node, ctxTimeouts bool, addr string) *redis.Client {
	backoff := w.retryBackoff(ci, uint64(n.id))
	c := redis.NewClient(&redis.Options{
		Addr: addr,
		Dialer: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return w.dialNode(ci, n)
		},
		ContextTimeoutEnabled: ctxTimeouts,
		DisableIdentity:       true,
		// go-redis's own retries (MaxRetries) wait a backoff it draws
		// from math/rand's global source, which no seed controls: min =
		// max makes it wait exactly that, drawn from the seed.
		MinRetryBackoff:    backoff,
		MaxRetryBackoff:    backoff,
		DialerRetryTimeout: w.dialRetry(ci, uint64(n.id)),
		// Never exhausted: go-redis waits for a pool turn on a timer from
		// a process-wide sync.Pool, and a timer made in one seed's bubble
		// and reused in another's is a fatal error ("select on synctest
		// channel from outside bubble"; seen with 10 connections while
		// dials to a restarting node retried). The library's quorum
		// workers (8 per node) and dials stay far below 64.
		PoolSize: 64,
		// RESP2 (HELLO 2): with RESP3, go-redis peeks for push
		// notifications before every reply (6 % of a run's CPU); the
		// library's commands get the same replies either way (see the
		// package doc's gaps). Small buffers: go-redis's 32 KiB per
		// connection and direction (128 KiB for its pipeline pool) were
		// half of a run's allocations; the library's messages are a few
		// hundred bytes and bufio handles longer ones in pieces.
		Protocol:                2,
		ReadBufferSize:          1024,
		WriteBufferSize:         1024,
		PipelineReadBufferSize:  1024,
		PipelineWriteBufferSize: 1024,
		// Auto mode resolves Addr in DNS to guess the endpoint type: a
		// lookup leaves the bubble (and the machine). The notifications
		// are a Redis Enterprise feature the library does not use.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	c.AddHook(w.orderHookFor(ci, uint64(n.id)))
	w.mu.Lock()
	ended := w.clientsClosed
	if !ended {
		w.clients = append(w.clients, c)
	}
	w.mu.Unlock()
	if ended {
		// Made by a go-redis goroutine (a Cluster client's background
		// topology reload) after Run closed the clients: closed at once,
		// so that nothing of it outlives the run.
		_ = c.Close()
	}
	return c
}

// retryBackoff is the wait before each of go-redis's own retries
// (MaxRetries) on client ci's go-redis client to target (a node's id).
// go-redis draws it (internal.RetryBackoff: min + [0, min << retry),
// capped at max) from math/rand's global source, which no seed controls;
// with min = max it waits max. So each go-redis client waits a time
// drawn from the seed, over [10 ms, 50 ms): every wait go-redis's
// defaults draw for its three retries (10 ms plus up to 10, 20 or 40 ms).
func (w *World) retryBackoff(ci int, target uint64) time.Duration {
	return 10*time.Millisecond + time.Duration(unit(mix(mix(w.seed, 0xbac0ff), uint64(ci+2)<<32|target))*float64(40*time.Millisecond))
}

// dialRetry is the wait between go-redis's dial attempts (DialerRetries)
// on client ci's go-redis client to target: go-redis's default 100 ms
// plus a few nanoseconds drawn from the seed, so that a dial retried
// after a refused one never wakes at the instant a library timer of a
// round 100 ms started with the refused dial ends (a failover Watcher's
// next poll tick, 100 ms after the poll whose ask was refused: which of
// the two dialled first would follow the Go scheduler).
func (w *World) dialRetry(ci int, target uint64) time.Duration {
	return 100*time.Millisecond + time.Duration(1+mix(mix(w.seed, 0xd1a1), uint64(ci+2)<<32|target)%maxSettle)
}

// onClose registers f, of workload client ci, to run when the run ends,
// before the go-redis clients close (strategies' Close, watchdogs'
// Close). The closers run one after the other, by client, each client's
// in the order it registered them: clients register in the Go
// scheduler's order when they do at one instant, and a closer that waits
// for its bound delays the ones after it.
func (w *World) onClose(ci int, f func()) {
	w.mu.Lock()
	w.closers = append(w.closers, closer{ci, f})
	w.mu.Unlock()
}

// closer is one onClose registration.
type closer struct {
	ci int
	f  func()
}

// action is one step of the fault driver.
type action struct {
	at   time.Duration
	what string
	do   func()
}

// actions turns the schedule into timed steps: a window's start and end,
// a snapshot some time before a restart from it.
func (w *World) actions() []action {
	var as []action
	r := rand.New(rand.NewPCG(w.seed, 0xac7))
	for _, f := range w.faults {
		f := f
		if fa := w.clusterFailoverActions(f); fa != nil {
			as = append(as, fa...)
			continue
		}
		if fa := w.reshardActions(f); fa != nil {
			as = append(as, fa...)
			continue
		}
		if fa := w.failoverActions(f); fa != nil {
			as = append(as, fa...)
			continue
		}
		switch f.Kind {
		case FaultCut:
			as = append(as, action{f.At, f.String(), func() { w.cutFault(f.Node, f.Client) }})
		case FaultSubCut:
			as = append(as, action{f.At, f.String(), func() { w.cutSubscribers(f.Node) }})
		case FaultPause:
			n := w.nodes[f.Node]
			as = append(as, action{f.At, f.String(), n.pause}, action{f.At + f.For, fmt.Sprintf("resume node=%d", f.Node), n.resume})
		case FaultRestart:
			n := w.nodes[f.Node]
			if f.Mode == "snapshot" {
				back := min(f.At, ms(r, 5, 200))
				as = append(as, action{f.At - back, fmt.Sprintf("snapshot node=%d", f.Node), n.takeSnapshot})
			}
			as = append(as, action{f.At, f.String(), n.crash},
				action{f.At + f.For, fmt.Sprintf("up node=%d (%s)", f.Node, f.Mode), func() {
					if n.restart(f.Mode == "durable", f.Mode == "snapshot") {
						n.rejoin()
					}
				}})
		case FaultBlink:
			n := w.nodes[f.Node]
			as = append(as, action{f.At, f.String(), n.crash},
				action{f.At + f.For, fmt.Sprintf("up node=%d (blink)", f.Node), func() { n.restart(true, false) }})
		case FaultBadKey:
			as = append(as, action{f.At, f.String(), func() {
				for _, i := range f.Nodes {
					tok, exp := w.nodes[i].overwrite(f.Key, f.For)
					w.mu.Lock()
					to := f.At + f.For
					if tok != "" {
						to = exp.Sub(w.start) + f.For
					}
					w.hashes = append(w.hashes, hashWin{node: i, key: f.Key, from: f.At, to: to})
					if tok == "" {
						w.mu.Unlock()
						continue
					}
					w.badHits = append(w.badHits, badHit{at: f.At, node: i, key: f.Key, token: tok, exp: exp.Sub(w.start)})
					w.mu.Unlock()
					w.hist.logf("fault badkey node=%d %s replaced a token (it would have expired at %.3fms)", i, f.Key, msf(exp.Sub(w.start)))
				}
			}})
		case FaultDrift:
			// Rates need no action (drift.go); this one logs the start,
			// has every lock checked (drive) from the moment it runs and,
			// for a rate beyond the drift factor, records the node's keys
			// for its scope (scope.go).
			as = append(as, action{f.At, f.String(), func() {
				if !f.Outside || f.Client >= 0 {
					return
				}
				ids := f.Nodes
				if f.Node >= 0 {
					ids = []int{f.Node}
				}
				for _, i := range ids {
					w.nodes[i].noteDrift()
				}
			}})
		case FaultClockJump:
			n := w.nodes[f.Node]
			as = append(as, action{f.At, f.String(), func() { n.jump(f.Amount) }})
		case FaultClockSkew:
			as = append(as, action{f.At, f.String(), func() {
				for _, i := range f.Nodes {
					w.nodes[i].jump(f.Amount)
				}
			}})
		}
	}
	slices.SortStableFunc(as, func(a, b action) int { return int(a.at - b.at) })
	return as
}

// scriptCall answers an EVAL or EVALSHA with the fast error of an
// errnode fault active on n now, and records it (renewals per lock, calls
// per node and virtual second). It reports whether it answered. Called
// with n.mu held.
func (w *World) scriptCall(n *Node, c *conn, args []string, sent time.Time) bool {
	if len(args) < 3 || !w.sc.Faults {
		return false
	}
	cmd := strings.ToUpper(args[0])
	if cmd != "EVAL" && cmd != "EVALSHA" {
		return false
	}
	at := time.Since(w.start)
	msg := ""
	for _, f := range w.faults {
		if f.Kind == FaultErrNode && f.Node == n.id && at >= f.At && at < f.At+f.For {
			msg = errReplies[f.Mode]
			break
		}
	}
	if msg == "" {
		return false
	}
	keys, toks := renewalItems(args)
	w.mu.Lock()
	if w.errCalls == nil {
		w.errCalls = map[[2]int]int{}
	}
	w.errCalls[[2]int{n.id, int(at / time.Second)}]++
	for i, k := range keys {
		w.renews = append(w.renews, renewCall{node: n.id, key: k, token: toks[i], at: at, sent: sent.Sub(w.start)})
	}
	w.mu.Unlock()
	c.peer.WriteError(msg)
	_ = c.pw.Flush()
	reply := append([]byte(nil), c.pbuf.Bytes()...)
	c.pbuf.Reset()
	if w.opts.Log {
		w.hist.logf("%s errnode %s -> %s (sent %.3fms)", c.name, describe(args), msg[:strings.IndexByte(msg, ' ')], msf(sent.Sub(w.start)))
	}
	d, lost, dropped := c.sendReply(reply)
	w.noteRenewReply(c, args, sent, d, lost, dropped)
	return true
}

// cut cuts the connections of node (all nodes if -1) from client (all
// clients if -1), at once.
func (w *World) cut(node, client int) { w.cutWith(node, client, (*conn).cut) }

// cutFault is cut for a fault: each connection is cut its settle later
// (cutSoon).
func (w *World) cutFault(node, client int) { w.cutWith(node, client, (*conn).cutSoon) }

func (w *World) cutWith(node, client int, cut func(*conn)) {
	for _, n := range w.nodes {
		if node >= 0 && n.id != node {
			continue
		}
		n.mu.Lock()
		var cs []*conn
		for c := range n.conns {
			if client < 0 && w.sheltered(c.client) {
				continue // its links meet no fault (clusterrepl.go)
			}
			if client < 0 || c.client == client {
				cs = append(cs, c)
			}
		}
		n.mu.Unlock()
		for _, c := range cs {
			cut(c)
		}
	}
}

// drive applies the schedule's actions until they run out or stop closes.
// It returns the actions applied, for the log.
func (w *World) drive(stop <-chan struct{}) {
	as := w.actions()
	for _, a := range as {
		d := time.Until(w.start.Add(a.at))
		if d > 0 {
			t := time.NewTimer(d)
			select {
			case <-stop:
				t.Stop()
				return
			case <-t.C:
			}
		}
		a.do()
		w.hist.event(a.what)
		w.checkAllState()
	}
}

// heal ends every fault: paused nodes serve, crashed nodes come back with
// their data. Called when the workload is done, so that closing the
// clients does not wait on a fault.
func (w *World) heal() {
	for _, n := range w.nodes {
		n.resume()
		n.mu.Lock()
		down := n.down
		n.mu.Unlock()
		if down {
			n.restart(true, false)
		}
	}
}
