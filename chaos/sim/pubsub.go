package sim

import (
	"math/rand/v2"
	"time"

	"github.com/alicebob/miniredis/v2/server"
)

// Pub/sub faults of the Wake scenarios.
const (
	// FaultLostPub: messages a node pushes to its subscribers are lost
	// (each with probability Prob) for For; the connections stay up and
	// the subscriptions stay confirmed. The publish is lost, nothing else.
	FaultLostPub = "lostpub"
	// FaultSubCut: a node's subscription connections are cut (CLIENT KILL
	// TYPE pubsub); go-redis reconnects and resubscribes.
	FaultSubCut = "subcut"
	// FaultSubSlow: messages a node pushes to its subscribers are delayed
	// by up to Amount more for For.
	FaultSubSlow = "subslow"
)

// subscribeChannels adds chs to a connection's channels and confirms each,
// as Redis does (RESP2), with the count of channels after it.
func subscribeChannels(p *server.Peer, set map[string]bool, chs []string) {
	for _, ch := range chs {
		set[ch] = true
		p.WriteLen(3)
		p.WriteBulk("subscribe")
		p.WriteBulk(ch)
		p.WriteInt(len(set))
	}
}

// unsubscribeChannels removes chs (every channel of the connection when
// none is named) and confirms each, as Redis does; with no channel at all
// it answers one confirmation with a null channel.
func unsubscribeChannels(p *server.Peer, set map[string]bool, chs []string) {
	if len(chs) == 0 {
		for ch := range set {
			chs = append(chs, ch)
		}
	}
	if len(chs) == 0 {
		p.WriteLen(3)
		p.WriteBulk("unsubscribe")
		p.WriteNull()
		p.WriteInt(0)
		return
	}
	for _, ch := range chs {
		delete(set, ch)
		p.WriteLen(3)
		p.WriteBulk("unsubscribe")
		p.WriteBulk(ch)
		p.WriteInt(len(set))
	}
}

// writePong is PING's answer on a subscribed connection.
func writePong(p *server.Peer) {
	p.WriteLen(2)
	p.WriteBulk("pong")
	p.WriteBulk("")
}

// pubsubHook answers SUBSCRIBE, UNSUBSCRIBE, PING on a subscribed
// connection and PUBLISH (also from a script: the release script
// publishes) on a node of a Wake scenario, instead of miniredis, whose
// subscribers get their messages from a goroutine of their own that writes
// to the peer at any time; here a message is a reply like any other, sent
// over the subscriber's link with its delays, its faults and FIFO order.
// RESP2 shapes (go-redis runs HELLO 2 here). Called with n.mu held.
func (n *Node) pubsubHook(p *server.Peer, cmd string, args []string) bool {
	c := n.cur
	switch cmd {
	case "SUBSCRIBE":
		if c == nil || p != c.peer || len(args) == 0 {
			return false // from a script, or malformed: miniredis answers
		}
		if n.psubs == nil {
			n.psubs = map[*conn]map[string]bool{}
		}
		if n.psubs[c] == nil {
			n.psubs[c] = map[string]bool{}
		}
		subscribeChannels(p, n.psubs[c], args)
		return true
	case "UNSUBSCRIBE":
		if c == nil || p != c.peer {
			return false
		}
		unsubscribeChannels(p, n.psubs[c], args)
		if len(n.psubs[c]) == 0 {
			delete(n.psubs, c)
		}
		return true
	case "PING":
		if c != nil && p == c.peer && len(n.psubs[c]) > 0 {
			writePong(p)
			return true
		}
	case "PUBLISH":
		if len(args) != 2 {
			return false
		}
		got := 0
		for sc, chs := range n.psubs {
			if !chs[args[0]] || sc == c {
				continue
			}
			if _, ok := n.conns[sc]; !ok {
				continue
			}
			got++
			sc.peer.WriteLen(3)
			sc.peer.WriteBulk("message")
			sc.peer.WriteBulk(args[0])
			sc.peer.WriteBulk(args[1])
			_ = sc.pw.Flush()
			msg := append([]byte(nil), sc.pbuf.Bytes()...)
			sc.pbuf.Reset()
			_, lost, _ := sc.sendPush(msg)
			if n.w.opts.Log {
				n.w.hist.logf("%s pushed %s%s", sc.name, args[0], map[bool]string{true: " (lost)"}[lost])
			}
		}
		p.WriteInt(got)
		return true
	}
	return false
}

// pushFate is the pub/sub faults' share of the fate of the message id
// pushed to subscriber c (see conn.send): extra delay, or lost. Its draws use their own slots of
// the message's hash, so the delays fate drew stay as they were.
func (w *World) pushFate(c *conn, id uint64, now time.Time) (time.Duration, bool) {
	if !w.sc.Faults {
		return 0, false
	}
	h := mix(mix(w.seed, id), 1)
	u := func(k uint64) float64 { return unit(mix(h, k)) }
	at := now.Sub(w.start)
	var extra time.Duration
	for _, f := range w.faults {
		if f.Node != c.node.id || at < f.At || at >= f.At+f.For {
			continue
		}
		switch f.Kind {
		case FaultLostPub:
			if u(16) < f.Prob {
				return 0, true
			}
		case FaultSubSlow:
			extra += time.Duration(u(17) * float64(f.Amount))
		}
	}
	return extra, false
}

// cutSubscribers cuts node's subscription connections (FaultSubCut).
func (w *World) cutSubscribers(node int) {
	n := w.nodes[node]
	n.mu.Lock()
	var cs []*conn
	for c := range n.psubs {
		cs = append(cs, c)
	}
	n.mu.Unlock()
	for _, c := range cs {
		c.cutSoon()
	}
}

// wakeSchedule draws a Wake scenario's faults: none to three pub/sub
// faults (lost publishes, cut subscription connections, slow pushes) on
// random nodes within the horizon, and in fair-quorum3 a late join
// (heads.go); nothing else, so that every grant a waiter misses is the
// pub/sub path's doing, or a leftover entry's. A quarter of the seeds have
// none, so that wake-slow has handoffs to judge. Like makeSchedule, it
// depends only on the seed and the scenario.
func wakeSchedule(r *rand.Rand, sc *Scenario, horizon time.Duration) []Fault {
	var fs []Fault
	for range r.IntN(4) {
		f := Fault{At: time.Duration(r.Int64N(int64(horizon * 3 / 4))), Node: r.IntN(max(sc.Nodes, 1)), Client: -1}
		switch k := r.IntN(3); k {
		case 0:
			f.Kind, f.For, f.Prob = FaultLostPub, ms(r, 20, 400), 0.5+0.5*r.Float64()
		case 1:
			f.Kind = FaultSubCut
		default:
			f.Kind, f.For, f.Amount = FaultSubSlow, ms(r, 20, 400), ms(r, 5, 150)
		}
		fs = append(fs, f)
	}
	return append(fs, lateJoinFaults(r, sc, horizon)...)
}
