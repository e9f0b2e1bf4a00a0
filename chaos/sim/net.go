package sim

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2/server"
)

// errClosed is what a cut or closed simulated connection returns.
var errClosed = errors.New("sim: connection closed")

// simAddr is the net.Addr of a simulated endpoint.
type simAddr string

func (a simAddr) Network() string { return "sim" }
func (a simAddr) String() string  { return string(a) }

// message is one request or reply in flight on a link.
type message struct {
	at    time.Time // delivery time (virtual)
	sent  time.Time // when the client sent it (a request)
	args  []string  // a request
	id    uint64    // a request's identity (World.requestID)
	reply []byte    // a reply
	push  bool      // a reply that is a message pushed to a subscriber
}

// segment is one delivered reply's bytes still in conn.rbuf.
type segment struct {
	n    int  // its bytes not yet read
	push bool // a pushed message (see conn.Read)
	read bool // Read returned part of it already
}

// conn is the client's end of one simulated TCP connection to a node. Its
// Write parses the RESP commands go-redis sends and hands each to the
// World, which decides its fate (delay, loss) and delivers it to the node;
// the node's replies come back the same way and are read by Read. Both
// directions keep FIFO order, like TCP: a message is never delivered before
// one sent earlier on the same connection.
type conn struct {
	w      *World
	node   *Node
	client int    // index of the workload client (for partitions), -1: the simulator itself
	key    uint64 // the connection's identity (client, node, dial number)
	name   string

	mu sync.Mutex
	// settle is how late a blocked Read notices its deadline, and a
	// fault's cut reaches the connection (cutSoon): a few nanoseconds
	// drawn from the last request sent on it (from key before the
	// first), so that reads that one instant ends (one ctx deadline, one
	// node crash) return one after the other in an order of the seed,
	// not in the Go scheduler's.
	settle time.Duration
	// replyTo is the identity of the last request delivered to the node
	// (see World.requestID), and sinceReq the replies and pushes sent
	// since: a reply's fate is drawn from both (see World.fate).
	replyTo, sinceReq uint64
	closed            bool
	// asking (a Cluster node's connection): the last command was ASKING,
	// which lets the next one reach a slot the node imports (reshard.go).
	// Guarded by the node's mu.
	asking bool
	// closing: the client closed its end while requests were in flight;
	// they still reach the node (TCP delivers data before the FIN, and
	// Redis runs what it read before it sees the close), their replies
	// are dropped, and the node forgets the connection after the last.
	closing   bool
	done      chan struct{} // closed on cut/close
	wbuf      []byte        // bytes written, not yet a full command
	reqs      []message     // requests in flight to the node
	reps      []message     // replies in flight to the client
	rbuf      []byte        // replies delivered, not yet read
	segs      []segment     // rbuf's replies, in order (see Read)
	lastRead  time.Time     // when Read last returned a reply's last byte
	notify    chan struct{} // cap 1: rbuf grew
	rtimer    *time.Timer   // Read's deadline timer (used by the one reader)
	deadline  time.Time     // read deadline
	nreq      uint64        // requests sent
	nrep      uint64        // replies sent
	lastReqAt time.Time
	lastRepAt time.Time
	// helloOnly: the connection's only request so far is its handshake
	// (see Write).
	helloOnly bool

	// deliverReqs and deliverReps are c.deliverRequests and
	// c.deliverReplies, made once (a method value passed to World.after
	// is an allocation per message).
	deliverReqs, deliverReps func()

	deliverMu sync.Mutex // serialises delivery of requests to the node (FIFO)
	peer      *server.Peer
	pbuf      bytes.Buffer
	pw        *bufio.Writer
}

func newConn(w *World, n *Node, client int, key uint64, name string) *conn {
	c := &conn{w: w, node: n, client: client, key: key, name: name, done: make(chan struct{}), notify: make(chan struct{}, 1),
		settle: settleOf(key), replyTo: key}
	// The node's replies pass through pw into pbuf: a small buffer (a
	// reply larger than it is written through), not bufio's 4 KiB per
	// connection.
	c.pw = bufio.NewWriterSize(&c.pbuf, 256)
	c.peer = server.NewPeer(c.pw)
	c.deliverReqs, c.deliverReps = c.deliverRequests, c.deliverReplies
	return c
}

// maxSettle bounds conn.settle (4 µs).
const maxSettle = 4096

// settleOf is conn.settle drawn from id.
func settleOf(id uint64) time.Duration { return time.Duration(1 + mix(id, 0x5e771e)%maxSettle) }

// Read returns delivered reply bytes, waiting for them until the read
// deadline (noticed settle late, see conn) or a cut. One Read returns
// bytes of one reply at most, and a pushed message that a Read would start
// at the instant it returned the last byte of the reply before it is read
// settle later: a reader that catches up with replies delivered while it
// was not reading (the wake hub's pause after a broken connection) hands
// each on after everything the one before it woke has run, in every run,
// rather than as the Go scheduler lets the reader and those woken meet
// (fair-single 13: a waiter woken by the resubscription made one more
// attempt or not as the release's notice came before or after its
// attempt's check for one).
func (c *conn) Read(b []byte) (int, error) {
	for {
		c.mu.Lock()
		if len(c.rbuf) > 0 {
			seg := &c.segs[0]
			if seg.push && !seg.read && c.lastRead.Equal(time.Now()) {
				settle := c.settle
				c.mu.Unlock()
				time.Sleep(settle)
				continue
			}
			n := copy(b, c.rbuf[:seg.n])
			if n == len(c.rbuf) {
				c.rbuf = c.rbuf[:0] // read out: the next replies reuse it
			} else {
				c.rbuf = c.rbuf[n:]
			}
			if seg.n -= n; seg.n == 0 {
				c.segs = append(c.segs[:0], c.segs[1:]...) // keeps its array
				c.lastRead = time.Now()
			} else {
				seg.read = true
			}
			c.mu.Unlock()
			return n, nil
		}
		if c.closed {
			c.mu.Unlock()
			return 0, io.EOF
		}
		dl, settle := c.deadline, c.settle
		c.mu.Unlock()
		var timeout <-chan time.Time
		if !dl.IsZero() {
			d := time.Until(dl)
			if d <= 0 {
				return 0, os.ErrDeadlineExceeded
			}
			// One timer per connection, reset for each wait (a new one
			// per Read cost a timer's allocations every reply).
			if c.rtimer == nil {
				c.rtimer = time.NewTimer(d + settle)
			} else {
				c.rtimer.Reset(d + settle)
			}
			timeout = c.rtimer.C
		}
		select {
		case <-c.notify:
		case <-c.done:
		case <-timeout:
			return 0, os.ErrDeadlineExceeded
		}
		if timeout != nil {
			c.rtimer.Stop()
		}
	}
}

// Write sends every complete command in b (and what earlier writes left)
// on its way to the node. It never blocks: the simulated network buffers.
func (c *conn) Write(b []byte) (int, error) {
	c.mu.Lock()
	if c.helloOnly {
		// The first write after the handshake passes the run's
		// turnstile, in the order of its content: connections dialled
		// together (go-redis's dial retries at one instant) end their
		// handshakes together, and the commands each was dialled for
		// would otherwise be written, and alike ones (WAIT) counted
		// (World.requestID), in the scheduler's order
		// (cluster-failover 37). A subscriber's first write does not
		// pass: go-redis's PubSub writes it holding a mutex that
		// another goroutine may wait on, and the turnstile waits for
		// every goroutine to block durably.
		c.helloOnly = false
		if !pubsubWrite(b) {
			c.mu.Unlock()
			c.w.net.turn.pass(1<<62|uint64(c.client+2)<<20|uint64(c.node.id), contentHash([]string{string(b)}))
			c.mu.Lock()
		}
	}
	defer c.mu.Unlock()
	if c.closed {
		return 0, errClosed
	}
	// Parse b in place when nothing is left over from an earlier write
	// (go-redis writes whole commands); keep only an incomplete tail.
	buf := b
	if len(c.wbuf) > 0 {
		c.wbuf = append(c.wbuf, b...)
		buf = c.wbuf
	}
	for {
		args, n, ok := parseCommand(buf)
		if !ok {
			break
		}
		buf = buf[n:]
		c.sendRequestLocked(args)
	}
	c.wbuf = append(c.wbuf[:0], buf...)
	if len(c.wbuf) == 0 {
		c.wbuf = nil
	}
	return len(b), nil
}

// sendRequestLocked decides a request's fate and schedules its delivery.
func (c *conn) sendRequestLocked(args []string) {
	i := c.nreq
	c.nreq++
	c.helloOnly = i == 0 && isHello(args)
	now := time.Now()
	id := c.w.requestID(c, args, now)
	c.settle = settleOf(id)
	delay, lost := c.w.fate(c, true, i, id, now)
	if !lost && c.w.sc.Fair && c.w.sc.Wake {
		delay += c.w.lateJoinDelay(c, args, now.Sub(c.w.start), mix(c.w.seed, id))
	}
	c.w.noteMessage(c, now, delay, lost)
	if c.w.sc.Watchdog {
		c.w.noteRenewRequest(c, args, now, delay, lost)
	}
	if lost {
		if c.w.opts.Log {
			c.w.hist.logf("%s lost request %s", c.name, describe(args))
		}
		return
	}
	at := now.Add(delay)
	if !at.After(c.lastReqAt) {
		at = c.lastReqAt.Add(time.Nanosecond)
	}
	c.lastReqAt = at
	c.reqs = append(c.reqs, message{at: at, sent: now, args: args, id: id})
	c.w.after(at.Sub(now), c.deliverReqs)
}

// deliverRequests hands every request that is due to the node, in order.
func (c *conn) deliverRequests() {
	c.deliverMu.Lock()
	defer c.deliverMu.Unlock()
	now := time.Now()
	c.mu.Lock()
	var buf [2]message // usually one is due: no slice to allocate
	due := buf[:0]
	for len(c.reqs) > 0 && !c.reqs[0].at.After(now) {
		due = append(due, c.reqs[0])
		c.reqs = c.reqs[1:]
	}
	closed, closing, last := c.closed, c.closing, len(c.reqs) == 0
	c.mu.Unlock()
	if closed && !closing {
		return
	}
	for _, m := range due {
		c.mu.Lock()
		c.replyTo, c.sinceReq = m.id, 0
		c.mu.Unlock()
		c.node.receive(c, m.args, m.sent)
	}
	if closing && last {
		c.node.forget(c)
	}
}

// sendReply decides a reply's fate and schedules its delivery. The node
// calls it after applying a request.
//
// It returns the reply's fate: its delay, lost (by the network), or
// dropped (the client had closed the connection).
func (c *conn) sendReply(reply []byte) (delay time.Duration, lost, dropped bool) {
	return c.send(reply, false)
}

// sendPush sends a message the node pushes to a subscriber (pubsub.go):
// a reply as any other, with the pub/sub faults of the schedule on top.
func (c *conn) sendPush(msg []byte) (delay time.Duration, lost, dropped bool) {
	return c.send(msg, true)
}

func (c *conn) send(reply []byte, push bool) (delay time.Duration, lost, dropped bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, false, true
	}
	i := c.nrep
	c.nrep++
	id := mix(c.replyTo, c.sinceReq)
	c.sinceReq++
	now := time.Now()
	delay, lost = c.w.fate(c, false, i, id, now)
	if push && !lost {
		extra, plost := c.w.pushFate(c, id, now)
		delay, lost = delay+extra, plost
	}
	c.w.noteMessage(c, now, delay, lost)
	if lost {
		return delay, true, false
	}
	at := now.Add(delay)
	if !at.After(c.lastRepAt) {
		at = c.lastRepAt.Add(time.Nanosecond)
	}
	c.lastRepAt = at
	c.reps = append(c.reps, message{at: at, reply: reply, push: push})
	c.w.after(at.Sub(now), c.deliverReps)
	return at.Sub(now), false, false
}

func (c *conn) deliverReplies() {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	grew := false
	for len(c.reps) > 0 && !c.reps[0].at.After(now) {
		if !c.closed {
			c.rbuf = append(c.rbuf, c.reps[0].reply...)
			c.segs = append(c.segs, segment{n: len(c.reps[0].reply), push: c.reps[0].push})
			grew = true
		}
		c.reps = c.reps[1:]
	}
	if grew {
		select {
		case c.notify <- struct{}{}:
		default:
		}
	}
}

// Close closes the connection from the client's side: replies in flight
// are lost, requests in flight still reach the node.
func (c *conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.reps, c.rbuf, c.segs = nil, nil, nil
	close(c.done)
	pending := len(c.reqs) > 0
	c.closing = pending
	c.mu.Unlock()
	if !pending {
		c.node.forget(c)
	}
	return nil
}

// cutSoon cuts the connection settle from now (a fault's cut: see conn).
func (c *conn) cutSoon() {
	c.mu.Lock()
	settle := c.settle
	c.mu.Unlock()
	c.w.after(settle, c.cut)
}

// cut closes the connection: whatever is in flight either way is lost.
// At once: a closer that cuts connections before it takes a mutex their
// reader holds (failoverClient's) needs their reads to return with no
// virtual time passing.
func (c *conn) cut() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed, c.closing = true, false
	c.reqs, c.reps, c.rbuf, c.segs = nil, nil, nil, nil
	close(c.done)
	c.mu.Unlock()
	c.node.forget(c)
}

func (c *conn) LocalAddr() net.Addr  { return simAddr("client") }
func (c *conn) RemoteAddr() net.Addr { return simAddr(c.node.name) }

func (c *conn) SetDeadline(t time.Time) error { return c.SetReadDeadline(t) }

func (c *conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return nil
}

// SetWriteDeadline is accepted and ignored: writes never block.
func (c *conn) SetWriteDeadline(time.Time) error { return nil }

// parseCommand parses one RESP array of bulk strings (what go-redis sends)
// from the front of b. ok is false until a whole command is there. The
// arguments share one string, the command's bytes (one allocation per
// command, not per argument).
func parseCommand(b []byte) (args []string, n int, ok bool) {
	line, rest, ok := cutLine(b)
	if !ok || len(line) < 2 || line[0] != '*' {
		return nil, 0, false
	}
	count, err := strconv.Atoi(string(line[1:]))
	if err != nil || count < 0 {
		return nil, 0, false
	}
	pos := len(b) - len(rest)
	// Where each argument starts and ends in b, until the command is whole.
	var spans [16][2]int
	at := spans[:0]
	for range count {
		line, rest2, ok := cutLine(b[pos:])
		if !ok || len(line) < 2 || line[0] != '$' {
			return nil, 0, false
		}
		size, err := strconv.Atoi(string(line[1:]))
		if err != nil || size < 0 {
			return nil, 0, false
		}
		start := len(b) - len(rest2)
		if len(b) < start+size+2 {
			return nil, 0, false
		}
		at = append(at, [2]int{start, start + size})
		pos = start + size + 2
	}
	whole := string(b[:pos])
	args = make([]string, len(at))
	for i, sp := range at {
		args[i] = whole[sp[0]:sp[1]]
	}
	return args, pos, true
}

func cutLine(b []byte) (line, rest []byte, ok bool) {
	i := bytes.Index(b, []byte("\r\n"))
	if i < 0 {
		return nil, nil, false
	}
	return b[:i], b[i+2:], true
}

// isHello reports whether args is a HELLO, a connection's handshake.
func isHello(args []string) bool { return len(args) > 0 && strings.EqualFold(args[0], "hello") }

// pubsubWrite reports whether b starts with a pub/sub command (a
// subscriber's).
func pubsubWrite(b []byte) bool {
	args, _, ok := parseCommand(b)
	if !ok || len(args) == 0 {
		return false
	}
	switch strings.ToUpper(args[0]) {
	case "SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE", "UNSUBSCRIBE", "PUNSUBSCRIBE", "SUNSUBSCRIBE":
		return true
	}
	return false
}
