package redistest

import (
	"bytes"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Gate is a TCP proxy in front of one server that lets a test decide the
// order in which requests reach the server and replies reach the client:
// the order is the test's, not the outcome of sleeps racing each other.
//
// While a request match is set (HoldRequests), every chunk a client sends
// that contains the match is kept back, not forwarded; while a reply
// match is set (HoldReplies), the reply to such a request is kept back
// (the request goes through). Held chunks wait in one queue per gate, in arrival order, until
// the test releases them: Step forwards one (the oldest, or the oldest
// that contains a given string) and, for a request, waits until the server
// has answered it, so that the server applies released requests in exactly
// the order the test chose, whatever connection they came on. A held chunk
// blocks the rest of its connection in that direction, so the order within
// a connection is kept. Open stops holding and forwards everything held, in
// order.
//
// Handshakes and other traffic that does not contain the match pass
// through, so clients connect normally.
//
// The gate also injects plain network faults, whatever the traffic: Cut
// (a crashed node), BlackHole (a silent partition), Delay (a slow link),
// and Heal to end them. It keeps its listener, and so its port, through
// all of them.
type Gate struct {
	Addr string // where clients connect: 127.0.0.1:port

	tb       TB
	probeMu  sync.Mutex
	probe    *StallProbe // derives the windows of WaitHeld and Step; started by their first call
	upstream string
	ln       net.Listener
	done     chan struct{} // closed by Close: ends every Delay wait

	mu        sync.Mutex
	reqMatch  []byte // nil: hold no requests
	replMatch []byte // nil: hold no replies
	dropMatch []byte // nil: drop nothing the server sends
	dropped   int    // chunks dropped for dropMatch
	epoch     uint64 // bumped by Open: a reply hold decided before it is void
	queue     []*held
	changed   chan struct{} // closed and replaced whenever queue changes
	conns     map[net.Conn]struct{}
	closed    bool
	cut       bool          // Cut until Heal
	paused    bool          // the listener is paused (refusing) for the Cut
	healed    chan struct{} // while cut: closed by Heal or Close
	dark      chan struct{} // BlackHole until Heal, Cut or Close (which close it); nil: light
	delay     time.Duration // Delay: how long every reply chunk waits
	wg        sync.WaitGroup
}

// held is one chunk kept back.
type held struct {
	data    []byte
	reply   bool          // a reply on its way to the client, not a request
	release chan struct{} // closed by the test to forward it
	sent    chan struct{} // closed once forwarded (and, for a request, answered)
}

// NewGate starts a gate in front of upstream; tb.Cleanup closes it.
func NewGate(tb TB, upstream string) *Gate {
	tb.Helper()
	ln, err := listenOwnPort()
	if err != nil {
		tb.Fatalf("redistest: gate listen: %v", err)
	}
	g := &Gate{Addr: ln.Addr().String(), tb: tb, upstream: upstream, ln: ln, done: make(chan struct{}),
		changed: make(chan struct{}), conns: map[net.Conn]struct{}{}, epoch: 1}
	g.wg.Go(g.accept)
	tb.Cleanup(g.Close)
	return g
}

// stallProbe returns the gate's StallProbe, started on first use: a wait
// only needs what the probe measured since the wait began, and a gate that
// never waits (the chaos proxies' fronts, ten in a scenario) costs no
// probe waking every millisecond.
func (g *Gate) stallProbe() *StallProbe {
	g.probeMu.Lock()
	defer g.probeMu.Unlock()
	if g.probe == nil {
		g.probe = StartStallProbe(g.tb)
	}
	return g.probe
}

// Client returns a client that connects through the gate, closed on
// cleanup, with ContextTimeoutEnabled.
func (g *Gate) Client() *redis.Client { return newClient(g.tb, g.Addr) }

// Cut closes every connection through the gate and, until Heal, refuses
// new ones, as for a crashed node. Held chunks are let go with their
// connections. The gate keeps its port all the while, so no other process
// can take it before Heal: the listening socket stays bound and only stops
// listening (on Linux; where that fails, it keeps listening and resets each
// new connection as soon as it is accepted instead).
func (g *Gate) Cut() {
	g.mu.Lock()
	if g.closed || g.cut {
		g.mu.Unlock()
		return
	}
	g.cut = true
	g.healed = make(chan struct{})
	g.paused = pauseListener(g.ln) == nil
	for c := range g.conns {
		_ = c.Close()
	}
	q := g.queue
	g.queue = nil
	g.changedLocked()
	g.lightLocked() // after the connections closed: what waited there goes nowhere
	g.mu.Unlock()
	for _, h := range q {
		close(h.release)
	}
}

// BlackHole passes nothing more in either direction, on open connections
// and new ones alike, and keeps them all open: a link that silently stops,
// or a node that accepts connections and never answers. What arrives
// meanwhile waits in the gate and the socket buffers, and flows on, in
// order, after Heal, as TCP delivers it once a partition heals.
func (g *Gate) BlackHole() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dark == nil && !g.closed {
		g.dark = make(chan struct{})
	}
}

// Delay holds every chunk the server sends back for d (from when it
// arrived) before it goes on to the client: a slow link, or a server a
// distance away. Zero ends it.
func (g *Gate) Delay(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.delay = d
}

// Heal ends Cut, BlackHole and Delay. Chunks held by HoldRequests or
// HoldReplies stay held.
func (g *Gate) Heal() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.paused && !g.closed {
		if err := resumeListener(g.ln); err != nil {
			g.tb.Fatalf("redistest: gate %s: listen again after Cut: %v", g.Addr, err)
		}
	}
	g.paused = false
	if g.cut {
		g.cut = false
		close(g.healed)
	}
	g.delay = 0
	g.lightLocked()
}

// lightLocked ends a BlackHole: whatever waits for it goes on.
func (g *Gate) lightLocked() {
	if g.dark != nil {
		close(g.dark)
		g.dark = nil
	}
}

// pass waits until nothing stops a chunk that arrived at arrived: no
// BlackHole and, for a reply, its Delay served. It returns at once once the
// gate is closed.
func (g *Gate) pass(arrived time.Time, reply bool) {
	served := !reply
	for {
		g.mu.Lock()
		dark, delay := g.dark, g.delay
		g.mu.Unlock()
		if dark != nil {
			select {
			case <-dark: // Heal, Cut or Close: look again
				continue
			case <-g.done:
				return
			}
		}
		if served {
			return
		}
		served = true
		wait := time.Until(arrived.Add(delay))
		if wait <= 0 {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C: // then look again: a BlackHole may have come meanwhile
		case <-g.done:
			t.Stop()
			return
		}
	}
}

// HoldRequests keeps back, from now on, every request chunk that contains
// match. An empty match holds nothing new (chunks already held stay held).
func (g *Gate) HoldRequests(match string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reqMatch = nil
	if match != "" {
		g.reqMatch = []byte(match)
	}
}

// HoldReplies keeps back, from now on, the reply to every request chunk
// that contains match (for a held request: decided when it is released).
func (g *Gate) HoldReplies(match string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.replMatch = nil
	if match != "" {
		g.replMatch = []byte(match)
	}
}

// DropReplies drops, from now on, every chunk the server sends that
// contains match, whatever request it answers (a pub/sub message answers
// none): the connection stays open and the client never sees it, as if
// the server had not sent it. An empty match drops nothing. A chunk is
// what one read returned: use a match that only whole messages sent on
// their own contain (a "message" push on a subscription connection,
// say), or other replies in the same chunk are dropped with it.
func (g *Gate) DropReplies(match string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dropMatch = nil
	if match != "" {
		g.dropMatch = []byte(match)
	}
}

// Dropped returns how many chunks DropReplies has dropped.
func (g *Gate) Dropped() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.dropped
}

// Held returns how many chunks are held now.
func (g *Gate) Held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.queue)
}

// HeldContaining returns how many held chunks contain s.
func (g *Gate) HeldContaining(s string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, h := range g.queue {
		if bytes.Contains(h.data, []byte(s)) {
			n++
		}
	}
	return n
}

// gateStallMultiple is the multiple of the measured stall that WaitHeld
// and Step add to their bound d.
const gateStallMultiple = 3

// WaitHeld waits until at least n chunks that contain s ("" for any) are
// held, or fails once d plus gateStallMultiple × what the gate's probe
// measured this process stalled meanwhile has passed (the error says how
// the window was derived).
func (g *Gate) WaitHeld(n int, s string, d time.Duration) error {
	probe := g.stallProbe() // before from: the window counts every stall since
	from := time.Now()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	over := false // the window has passed: one last look, then the error
	for range waitMaxPolls {
		g.mu.Lock()
		k := 0
		for _, h := range g.queue {
			if s == "" || bytes.Contains(h.data, []byte(s)) {
				k++
			}
		}
		ch := g.changed
		g.mu.Unlock()
		if k >= n {
			return nil
		}
		if over {
			return fmt.Errorf("gate %s: %d chunk(s) containing %q held after %v, want %d: %s", g.Addr, k, s,
				time.Since(from).Round(time.Millisecond), n, probe.explainWait(d, gateStallMultiple, from, time.Now()))
		}
		select {
		case <-ch:
		case <-deadline.C:
			if left := probe.left(from, d, gateStallMultiple); left > 0 {
				deadline.Reset(left)
			} else {
				over = true
			}
		}
	}
	return fmt.Errorf("gate %s: chunk(s) containing %q not held after %d changes, want %d", g.Addr, s, waitMaxPolls, n)
}

// Step forwards the oldest held chunk that contains s ("" for the oldest
// of all) and waits until it was forwarded and, for a request, until the
// server's reply to it started to arrive (the reply itself may then be
// held, if a reply match says so). It fails if no such chunk is held, or
// once d plus gateStallMultiple × what the gate's probe measured this
// process stalled meanwhile has passed.
func (g *Gate) Step(s string, d time.Duration) error {
	g.mu.Lock()
	var h *held
	for i, c := range g.queue {
		if s == "" || bytes.Contains(c.data, []byte(s)) {
			h = c
			g.queue = append(g.queue[:i:i], g.queue[i+1:]...)
			g.changedLocked()
			break
		}
	}
	g.mu.Unlock()
	if h == nil {
		return fmt.Errorf("gate %s: no held chunk contains %q", g.Addr, s)
	}
	probe := g.stallProbe() // before from: the window counts every stall since
	close(h.release)
	from := time.Now()
	t := time.NewTimer(d)
	defer t.Stop()
	for range waitMaxPolls {
		select {
		case <-h.sent:
			return nil
		case <-t.C:
		}
		if left := probe.left(from, d, gateStallMultiple); left > 0 {
			t.Reset(left)
			continue
		}
		select { // one last look: the forwarding may have been starved too
		case <-h.sent:
			return nil
		default:
		}
		return fmt.Errorf("gate %s: released chunk not answered within %v: %s", g.Addr,
			time.Since(from).Round(time.Millisecond), probe.explainWait(d, gateStallMultiple, from, time.Now()))
	}
	return fmt.Errorf("gate %s: released chunk not answered after %d waits", g.Addr, waitMaxPolls)
}

// Open stops holding and forwards everything held, oldest first. A reply
// still on its way (its request went through while a reply match held it,
// the server has not answered yet) is not held either when it comes.
func (g *Gate) Open() {
	g.mu.Lock()
	g.reqMatch, g.replMatch = nil, nil
	g.epoch++
	q := g.queue
	g.queue = nil
	g.changedLocked()
	g.mu.Unlock()
	for _, h := range q {
		close(h.release)
	}
}

// Close stops the gate and closes every connection through it.
func (g *Gate) Close() {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return
	}
	g.closed = true
	q := g.queue
	g.queue = nil
	for c := range g.conns {
		_ = c.Close()
	}
	close(g.done)
	if g.cut {
		g.cut = false
		close(g.healed)
	}
	g.mu.Unlock()
	for _, h := range q {
		close(h.release)
	}
	_ = g.ln.Close()
	g.wg.Wait()
}

// replyHoldLocked returns the epoch under which the reply to a request
// chunk data is to be held, or 0 if it is not.
func (g *Gate) replyHoldLocked(data []byte) uint64 {
	if g.replMatch != nil && bytes.Contains(data, g.replMatch) {
		return g.epoch
	}
	return 0
}

func (g *Gate) changedLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// track adds c to the connections that Cut and Close close, or closes it
// at once (with a reset) if the gate is cut or closed.
func (g *Gate) track(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || g.cut {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset: the client learns at once
		}
		_ = c.Close()
		return false
	}
	g.conns[c] = struct{}{}
	return true
}

func (g *Gate) accept() {
	for {
		client, err := g.ln.Accept()
		if err != nil {
			// Closed, or paused by a Cut (accept fails at once on a socket
			// that stopped listening): wait for Heal, then accept again.
			g.mu.Lock()
			closed, cut, healed := g.closed, g.cut, g.healed
			g.mu.Unlock()
			switch {
			case closed:
				return
			case cut:
				<-healed
			default:
				time.Sleep(5 * time.Millisecond) // a passing error (too many open files): try again
			}
			continue
		}
		if g.track(client) {
			g.wg.Go(func() { g.serve(client) })
		}
	}
}

// pipe is one client connection and its upstream connection.
type pipe struct {
	mu sync.Mutex
	// answered is closed when the server sends anything (or the connection
	// ends) after a held request was forwarded; nil when nobody waits.
	answered chan struct{}
	ended    bool // the reply side has stopped: answered is closed at once
	// holdReply: the next reply chunk is to be held, if the gate's epoch
	// is still this one when it comes (0: hold nothing).
	holdReply uint64
}

func (g *Gate) serve(client net.Conn) {
	defer func() { _ = client.Close() }()
	server, err := net.DialTimeout("tcp", g.upstream, 2*time.Second)
	if err != nil {
		return // the node is down: the client sees its connection closed
	}
	if !g.track(server) {
		return
	}
	p := &pipe{}
	var wg sync.WaitGroup
	wg.Go(func() {
		g.copyRequests(p, client, server)
		_ = server.Close()
	})
	g.copyReplies(p, server, client)
	_ = server.Close()
	_ = client.Close()
	wg.Wait()
	g.mu.Lock()
	delete(g.conns, client)
	delete(g.conns, server)
	g.mu.Unlock()
}

// copyRequests forwards client → server, holding matching chunks.
func (g *Gate) copyRequests(p *pipe, client, server net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			arrived := time.Now()
			data := append([]byte(nil), buf[:n]...)
			g.mu.Lock()
			hold := !g.closed && g.reqMatch != nil && bytes.Contains(data, g.reqMatch)
			holdReply := g.replyHoldLocked(data)
			var h *held
			if hold {
				h = &held{data: data, release: make(chan struct{}), sent: make(chan struct{})}
				g.queue = append(g.queue, h)
				g.changedLocked()
			}
			g.mu.Unlock()
			var answered chan struct{}
			if h != nil {
				<-h.release
				answered = make(chan struct{})
				// Whether its reply is held is decided when it is forwarded.
				g.mu.Lock()
				holdReply = g.replyHoldLocked(data)
				g.mu.Unlock()
			}
			p.mu.Lock()
			if holdReply != 0 {
				p.holdReply = holdReply
			}
			if answered != nil {
				if p.ended {
					close(answered)
				} else {
					p.answered = answered
				}
			}
			p.mu.Unlock()
			g.pass(arrived, false)
			_, werr := server.Write(data)
			if h != nil {
				if werr == nil {
					<-answered // the reply side closes it on data, EOF or error
				}
				close(h.sent)
			}
			if werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// copyReplies forwards server → client, holding the reply to a request
// that matched the reply match. A client that went away (it timed out)
// does not stop it: the server's reply is still read, so a Step waiting
// for it is told.
func (g *Gate) copyReplies(p *pipe, server, client net.Conn) {
	defer func() {
		p.mu.Lock()
		p.ended = true
		if p.answered != nil {
			close(p.answered)
			p.answered = nil
		}
		p.mu.Unlock()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := server.Read(buf)
		arrived := time.Now()
		p.mu.Lock()
		if p.answered != nil {
			close(p.answered)
			p.answered = nil
		}
		holdEpoch := p.holdReply
		if n > 0 {
			p.holdReply = 0
		}
		p.mu.Unlock()
		if n > 0 {
			data := append([]byte(nil), buf[:n]...)
			g.mu.Lock()
			drop := g.dropMatch != nil && bytes.Contains(data, g.dropMatch)
			if drop {
				g.dropped++
			}
			g.mu.Unlock()
			if drop {
				if err != nil {
					return
				}
				continue
			}
			if holdEpoch != 0 {
				h := &held{data: data, reply: true, release: make(chan struct{}), sent: make(chan struct{})}
				g.mu.Lock()
				if g.closed || g.epoch != holdEpoch { // closed, or opened since its request went through
					close(h.release)
				} else {
					g.queue = append(g.queue, h)
					g.changedLocked()
				}
				g.mu.Unlock()
				<-h.release
				close(h.sent)
			}
			g.pass(arrived, true)
			_, _ = client.Write(data) // a client that went away is not our concern
		}
		if err != nil {
			return
		}
	}
}
