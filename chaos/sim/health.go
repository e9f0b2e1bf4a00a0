package sim

import (
	"time"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/drift"
	"github.com/redlease/redlease/internal/renewal"
)

// renewMsg is one renewal request (extend, extendmany) of one lock to one
// node and its reply, as the network treated them.
type renewMsg struct {
	node     int
	sent     time.Duration // the client sent the request
	reqLost  bool          // lost by the network before the node
	answered bool          // the node answered it
	repLost  bool          // the answer was lost by the network
	dropped  bool          // the client had closed the connection first
	repAt    time.Duration // the answer reached the client (answered, not lost or dropped)
}

// linkMsg is one message between a client and a node: when it was sent,
// its delay, or lost.
type linkMsg struct {
	at    time.Duration
	delay time.Duration
	lost  bool
}

// pendingRenewal finds a renewal request's record when its node answers.
type pendingRenewal struct {
	c     *conn
	sent  time.Time
	token string
}

// renewalItems returns the (key, token) pairs of a renewal script call,
// or nil for any other command. The layouts are internal/script's: Extend
// has KEYS[1] the lock key and ARGV[1] its token; ExtendMany has KEYS[i]
// and its token at ARGV[2i-1].
func renewalItems(args []string) (keys, tokens []string) {
	sha, ks, argv, ok := scriptLine(args)
	if !ok {
		return nil, nil
	}
	switch scriptName(sha) {
	case "extend":
		if len(ks) == 1 && len(argv) >= 1 {
			return ks, argv[:1]
		}
	case "extendmany":
		for i, k := range ks {
			if 2*i < len(argv) {
				keys, tokens = append(keys, k), append(tokens, argv[2*i])
			}
		}
		if len(ks) == 0 { // the local layout: key, token, ttl triples in ARGV
			for i := 0; i+1 < len(argv); i += 3 {
				keys, tokens = append(keys, argv[i]), append(tokens, argv[i+1])
			}
		}
	}
	return keys, tokens
}

// noteRenewRequest records a renewal request's fate. Called with c.mu held.
func (w *World) noteRenewRequest(c *conn, args []string, now time.Time, delay time.Duration, lost bool) {
	_, toks := renewalItems(args)
	if toks == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.renewals == nil {
		w.renewals, w.pending = map[string][]*renewMsg{}, map[pendingRenewal]*renewMsg{}
	}
	for _, t := range toks {
		m := &renewMsg{node: c.node.id, sent: now.Sub(w.start), reqLost: lost, repAt: -1}
		w.renewals[t] = append(w.renewals[t], m)
		if !lost {
			w.pending[pendingRenewal{c, now, t}] = m
		}
	}
}

// noteRenewReply records the fate of a renewal's answer. Called with the
// node's mutex held.
func (w *World) noteRenewReply(c *conn, args []string, sent time.Time, delay time.Duration, lost, dropped bool) {
	_, toks := renewalItems(args)
	if toks == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, t := range toks {
		k := pendingRenewal{c, sent, t}
		m := w.pending[k]
		if m == nil {
			continue
		}
		delete(w.pending, k)
		m.answered, m.repLost, m.dropped = true, lost, dropped
		if !lost && !dropped {
			m.repAt = time.Since(w.start) + delay
		}
	}
}

// The healthy-lost invariant. A hold is protected when the network and
// the schedule left its strategy both the nodes and the time to renew it:
//
//  1. nodes: it is healthy (no hash in its key; faults touched at most a
//     minority of its strategy's nodes, none of a single or Cluster
//     lock's one node, while fn ran), and a quorum of the nodes that held
//     its token at the grant were neither touched by a fault while fn ran
//     nor lost a message to or from its client from callLinger before the
//     grant until fn returned (one lost message, even a new connection's
//     HELLO, leaves the call waiting for its deadline; a go-redis client
//     without ContextTimeoutEnabled waits on a lost reply for its
//     ReadTimeout, 3 s, and retries it up to 3 times; the look-back
//     covers such a call whole, though the library's renewals return at
//     their ctx — see docs/simulator.md, Findings, on ExtendBatch; a
//     node that did not grant the lock cannot renew it: a quorum lock
//     granted on a bare majority needs every one of those nodes);
//  2. time: let D be the longest one-way delay the network drew for a
//     message between its client and those nodes while fn ran (at most
//     maxOneWay, 40.5 ms: base delay and a spike). A renewal takes at
//     most renewTrips round trips (a new connection's HELLO, the EVALSHA,
//     and the EVAL after a NOSCRIPT), so at most 2·renewTrips·D, and must
//     fit in nine tenths of its window (a Cluster master's share,
//     shardDeadline; quorum and single may use all of it). The window
//     runs from the moment the watchdog sends the renewal to the lock's
//     Deadline (Until less the loss margin). The watchdog sends it a
//     quarter interval before it is due (interval = TTL/3), so after a
//     renewal that started at s the next window is s + TTL − drift −
//     margin − (s + TTL/4) = 0.65·TTL − drift(TTL); the first one runs
//     from the grant to Until − margin, or is that long if the grant
//     left more. Both must be at least 2·renewTrips·D·10/9.
//
// A protected hold is never lost, on a correct library (the renewal
// issue's promise: a sick neighbour — another node, key, shard or
// strategy — may cost its own locks, never others'). A library that
// lets one strategy's renewals wait for another's (head of line) loses
// protected holds.
const renewTrips = 3

// callLinger is the longest a go-redis call without ContextTimeoutEnabled
// waits on a lost message: its ReadTimeout (3 s) for the first try and
// each of its MaxRetries (3) retries.
const callLinger = 4 * 3 * time.Second

// needWindow is the shortest renewal window that fits a renewal of
// renewTrips round trips whose messages take up to d each way, in nine
// tenths of the window.
func needWindow(d time.Duration) time.Duration { return 2 * renewTrips * d * 10 / 9 }

// renewWindows are the first and the steady renewal windows of hd.
func renewWindows(hd *Hold) (first, steady time.Duration) {
	ttl := hd.TTL
	margin := ttl / redlease.DefaultLossMarginDivisor
	early := time.Duration(float64(ttl) * renewal.DefaultFraction / 4)
	steady = ttl - drift.Allowance(ttl, drift.DefaultFactor) - margin - early
	first = min(hd.Until0-margin-hd.From, steady)
	return first, steady
}

// healthClass explains why a healthy hold was lost, or says it was
// protected. nodes and q are its strategy's nodes and quorum; faulted,
// the nodes faults touched while fn ran. d is the longest one-way delay
// of a message between its client and its usable nodes while fn ran.
func (w *World) healthClass(hd *Hold, nodes []int, q int, faulted map[int]bool) (class string, protected bool, d time.Duration) {
	usable, heldOK, lostBefore := 0, 0, false
	for _, i := range hd.HeldOn {
		if faulted[i] {
			continue
		}
		heldOK++
		lossy, before := false, false
		for _, m := range w.links[[2]int{hd.Client, i}] {
			if m.lost && m.at >= hd.From-callLinger && m.at < hd.End {
				lossy = true
				before = before || m.at < hd.From
			}
		}
		// A cut of the client's connections to the node, even before the
		// grant, leaves a dead connection in go-redis's pool: its next use
		// fails and go-redis retries after its retry backoff (10 ms to 1 s),
		// longer than a short renewal window (watchdog-mixed seed 133355:
		// a cut 59 ms before the grant, 6.6 ms of window). Counted like a
		// lost message.
		for _, f := range w.faults {
			if f.Kind == FaultCut && f.Node == i && (f.Client < 0 || f.Client == hd.Client) && f.At >= hd.From-callLinger && f.At < hd.End {
				lossy = true
				before = before || f.At < hd.From
			}
		}
		if lossy {
			lostBefore = lostBefore || before
			continue
		}
		usable++
		for _, m := range w.links[[2]int{hd.Client, i}] {
			if m.at >= hd.From && m.at < hd.End {
				d = max(d, m.delay)
			}
		}
	}
	first, steady := renewWindows(hd)
	switch {
	case len(faulted) > len(nodes)-q:
		return "faulted", false, d // not healthy: the caller filters these out
	case heldOK < q:
		return "granted on too few nodes", false, d
	case usable < q && lostBefore:
		return "message lost before the grant", false, d
	case usable < q:
		return "message lost", false, d
	case first < needWindow(d):
		return "validity at grant short", false, d
	case steady < needWindow(d):
		return "ttl short", false, d
	}
	return "protected", true, d
}
