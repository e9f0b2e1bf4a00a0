package sim

import (
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2/server"
)

// masterName is the Sentinel master name of the failover scenario.
const masterName = "mymaster"

// switchChannel is the channel Sentinel announces failovers on.
const switchChannel = "+switch-master"

// sentinelState is what an emulated Sentinel knows: the primary's address
// and the config epoch of the configuration that names it, and which of
// its connections subscribed to which channels. A Sentinel is a Node (so
// it has links, faults, pauses and crashes like any node) whose commands
// are answered here instead of by miniredis: SENTINEL
// get-master-addr-by-name, master, sentinels, replicas/slaves; SUBSCRIBE,
// UNSUBSCRIBE and PING in subscribed mode; anything else (HELLO, PING,
// CLIENT) goes to miniredis. Its +switch-master messages go to each
// subscriber over that subscriber's own link (with its delays and
// losses); a paused (hung) Sentinel publishes nothing.
type sentinelState struct {
	addr    string // the primary, host:port
	replica string // the replica, host:port ("" if none)
	epoch   int64
	subs    map[*conn]map[string]bool
	// pending: a switch this Sentinel missed while down, applied when it
	// comes back (it hears the others' hello messages).
	pending *sentinelSwitch
}

type sentinelSwitch struct {
	from, to, replica string
	epoch             int64
}

// sentinelHook answers a command sent to a Sentinel. Called with n.mu held.
func (n *Node) sentinelHook(p *server.Peer, cmd string, args []string) bool {
	s := n.sent
	c := n.cur
	subscribed := c != nil && len(s.subs[c]) > 0
	switch cmd {
	case "SENTINEL":
		if len(args) == 0 {
			p.WriteError("ERR wrong number of arguments for 'sentinel' command")
			return true
		}
		sub := strings.ToLower(args[0])
		if sub == "sentinels" || sub == "replicas" || sub == "slaves" {
			if len(args) != 2 || args[1] != masterName {
				p.WriteError("ERR No such master with that name")
				return true
			}
			if sub == "sentinels" || s.replica == "" {
				p.WriteLen(0)
				return true
			}
			h, pt, _ := net.SplitHostPort(s.replica)
			p.WriteLen(1)
			writePairs(p, "name", s.replica, "ip", h, "port", pt, "flags", "slave")
			return true
		}
		if len(args) != 2 || (sub != "get-master-addr-by-name" && sub != "master") {
			p.WriteError("ERR unknown sentinel subcommand '" + args[0] + "'")
			return true
		}
		if args[1] != masterName {
			if sub == "master" {
				p.WriteError("ERR No such master with that name")
			} else {
				p.WriteNull()
			}
			return true
		}
		h, pt, _ := net.SplitHostPort(s.addr)
		if sub == "get-master-addr-by-name" {
			p.WriteLen(2)
			p.WriteBulk(h)
			p.WriteBulk(pt)
			return true
		}
		writePairs(p, "name", masterName, "ip", h, "port", pt, "flags", "master",
			"config-epoch", strconv.FormatInt(s.epoch, 10), "num-slaves", "1", "quorum", "2")
		return true
	case "SUBSCRIBE":
		if c == nil || len(args) == 0 {
			p.WriteError("ERR wrong number of arguments for 'subscribe' command")
			return true
		}
		if s.subs[c] == nil {
			s.subs[c] = map[string]bool{}
		}
		subscribeChannels(p, s.subs[c], args)
		return true
	case "UNSUBSCRIBE":
		unsubscribeChannels(p, s.subs[c], args)
		return true
	case "PING":
		if subscribed {
			writePong(p)
			return true
		}
	}
	return false
}

func writePairs(p *server.Peer, kv ...string) {
	p.WriteLen(len(kv))
	for _, s := range kv {
		p.WriteBulk(s)
	}
}

// newSentinel makes Sentinel node id named name, naming primary (with
// replica) at config epoch 1.
func newSentinel(w *World, id int, name, primary, replica string) *Node {
	n := newNode(w, id, name)
	n.sent = &sentinelState{addr: primary, replica: replica, epoch: 1, subs: map[*conn]map[string]bool{}}
	return n
}

// switchMaster makes the Sentinel adopt the configuration that names to as
// the primary, and announce it to its subscribers (over their links). A
// Sentinel that is down adopts it when it comes back; one that hangs
// adopts it and announces nothing; under a sentinel-mute fault the
// announcement is lost on the way to every subscriber. A configuration
// no newer than the one it has (a failover's reaching it after the
// failback's) is ignored.
func (n *Node) switchMaster(sw sentinelSwitch) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.sent
	if sw.epoch <= s.epoch {
		return
	}
	if n.down {
		if s.pending == nil || sw.epoch > s.pending.epoch {
			s.pending = &sw // a failback's switch may reach it before the failover's
		}
		return
	}
	s.addr, s.replica, s.epoch = sw.to, sw.replica, sw.epoch
	if n.w.opts.Log {
		n.w.hist.logf("%s switched to %s (epoch %d)%s", n.name, sw.to, sw.epoch, map[bool]string{true: ", hung: no announcement"}[n.paused])
	}
	if n.paused {
		return
	}
	if n.w.muted() {
		if n.w.opts.Log {
			n.w.hist.logf("%s: its +switch-master to %s lost on the way to every subscriber (sentinel-mute)", n.name, sw.to)
		}
		return
	}
	oh, op, _ := net.SplitHostPort(sw.from)
	nh, np, _ := net.SplitHostPort(sw.to)
	payload := strings.Join([]string{masterName, oh, op, nh, np}, " ")
	for c, chs := range s.subs {
		if !chs[switchChannel] {
			continue
		}
		if _, ok := n.conns[c]; !ok {
			delete(s.subs, c)
			continue
		}
		c.peer.WriteLen(3)
		c.peer.WriteBulk("message")
		c.peer.WriteBulk(switchChannel)
		c.peer.WriteBulk(payload)
		_ = c.pw.Flush()
		msg := append([]byte(nil), c.pbuf.Bytes()...)
		c.pbuf.Reset()
		c.sendReply(msg)
	}
}

// sentinelUp brings a crashed Sentinel back with its configuration (it
// lives in its config file) and whatever switch it missed.
func (n *Node) sentinelUp() {
	n.restart(true, false)
	n.mu.Lock()
	s := n.sent
	s.subs = map[*conn]map[string]bool{}
	sw := s.pending
	s.pending = nil
	n.mu.Unlock()
	if sw != nil {
		n.switchMaster(*sw)
	}
}

// sentinelLag is how long after the promotion Sentinel i adopts the new
// configuration: the leader at once, the others after their hello
// messages (NOTES.md: others named the old primary for ~100 ms).
func sentinelLag(seed uint64, i int) time.Duration {
	if i == 0 {
		return 0
	}
	return time.Duration(unit(mix(seed, 0x5e27+uint64(i))) * float64(maxSentinelLag))
}

// maxSentinelLag bounds how long after a promotion every Sentinel has
// adopted its configuration.
const maxSentinelLag = 150 * time.Millisecond
