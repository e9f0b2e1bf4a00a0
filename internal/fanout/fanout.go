// Package fanout sends one script call to every node of a quorum at once and
// lets the caller decide from the first replies, without ever waiting on a
// node that does not answer.
//
// Each node has a few long-lived workers (started on first use, stopped by
// Close), each with its own connection where the client allows it. So:
//
//   - a round costs no goroutine and no pool health-check syscall per node,
//     which is most of what a naive goroutine-per-request fan-out spends;
//   - a node that hangs cannot make requests pile up: at most Workers
//     requests per node are in flight, and a request that waited in the
//     node's queue past its round's deadline is answered with a timeout
//     without being sent;
//   - the caller never blocks on a node: it selects on Results and Expired.
//
// go-redis applies a context deadline to socket reads only when the client
// has ContextTimeoutEnabled; without it a hung node holds a worker until the
// client's ReadTimeout, though never the caller.
package fanout

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease/internal/script"
)

// Result is one node's reply.
type Result struct {
	Node int
	Val  int64
	Err  error
}

// Call is one script invocation, the same command line for every node.
type Call struct {
	Script *script.Script
	Line   []any
}

// ErrOverloaded is the cause recorded for a node whose queue was full: more
// requests were waiting for it than its workers could take.
var ErrOverloaded = errors.New("node overloaded: request queue full")

// ErrClosed is returned by rounds started after Close.
var ErrClosed = errors.New("fanout closed")

// Nodes owns the workers of every node.
type Nodes struct {
	nodes   []*node
	timeout time.Duration
	stop    chan struct{}
	closed  atomic.Bool
	workers sync.WaitGroup

	// Granted rounds that still have requests in flight, so that a release
	// can make a late write undo itself (see Keep and UndoLate).
	mu       sync.Mutex
	inflight map[holder]*Round
}

// holder identifies one acquisition.
type holder struct{ key, token string }

type node struct {
	client  redis.UniversalClient
	queue   chan job
	max     int32
	total   atomic.Int32 // workers started
	idle    atomic.Int32 // workers waiting for a job
	spawnMu sync.Mutex
	// warm is set once the client itself (its pool) got a reply from the
	// node. Only then do workers take dedicated connections: go-redis
	// settles its maintenance-notification mode on the first connection it
	// initialises, writing to the *Options that the client and its Conns
	// share under different locks, so a Conn initialised concurrently with
	// the client's first connection would race with it.
	warm atomic.Bool
}

// job is what travels through a node's queue: by value, so sending it does
// not allocate.
type job struct {
	round *Round
	node  int
	undo  bool
}

// New prepares workers for clients: at most workersPerNode each, started as
// load requires. Every round is bounded by timeout.
func New(clients []redis.UniversalClient, workersPerNode int, timeout time.Duration) *Nodes {
	ns := &Nodes{
		nodes:    make([]*node, len(clients)),
		timeout:  timeout,
		stop:     make(chan struct{}),
		inflight: map[holder]*Round{},
	}
	for i, c := range clients {
		ns.nodes[i] = &node{client: c, queue: make(chan job, 4*workersPerNode), max: int32(workersPerNode)}
	}
	return ns
}

// Close stops every worker after its current request and waits for them.
// Rounds started afterwards fail on every node with ErrClosed.
func (ns *Nodes) Close() {
	if ns.closed.CompareAndSwap(false, true) {
		close(ns.stop)
	}
	ns.workers.Wait()
}

// Round is one call sent to every node.
type Round struct {
	ns      *Nodes
	call    Call
	undo    Call // undo.Script nil: nothing to undo
	parent  context.Context
	ctx     context.Context    // the round's deadline, shared by its requests
	cancel  context.CancelFunc // run by the last request to finish
	pending atomic.Int32
	results chan Result

	decision atomic.Int32    // 0 undecided, 1 keep, 2 undo
	slots    []atomic.Uint32 // per node: doneBit, then undoBit once claimed
	undone   chan int        // one entry per finished undo
	tracked  *holder         // set (under ns.mu) while in ns.inflight
}

const (
	keep = 1
	undo = 2

	doneBit = 1 << 0
	undoBit = 1 << 1
)

// Start sends c to every node under one deadline (the timeout given to New)
// and returns at once. With an undo call (undoCall.Script not nil), the
// caller must later Decide; after
// Decide(true), undo is sent to every node once that node's own request has
// finished (never before, so it cannot overtake a late write), under a fresh
// deadline that ignores the cancellation of ctx.
func (ns *Nodes) Start(ctx context.Context, c Call, undoCall Call) *Round {
	n := len(ns.nodes)
	r := &Round{ns: ns, call: c, undo: undoCall, parent: ctx, results: make(chan Result, n)}
	r.ctx, r.cancel = context.WithTimeout(ctx, ns.timeout)
	r.pending.Store(int32(n))
	if undoCall.Script != nil {
		r.slots = make([]atomic.Uint32, n)
		r.undone = make(chan int, n)
	}
	for i, nd := range ns.nodes {
		if ns.closed.Load() {
			r.deliver(i, Result{Node: i, Err: ErrClosed}, false)
			continue
		}
		nd.ensureWorker(ns)
		select {
		case nd.queue <- job{round: r, node: i}:
		default:
			r.deliver(i, Result{Node: i, Err: ErrOverloaded}, false)
		}
	}
	return r
}

// Results delivers each node's reply once, in the order they arrive.
func (r *Round) Results() <-chan Result { return r.results }

// Expired is closed when the round's deadline passes or ctx is done (and,
// once every node has answered, anyway: drain Results when it fires).
func (r *Round) Expired() <-chan struct{} { return r.ctx.Done() }

// Decide tells the round whether to undo. Only the first call counts; it does
// nothing for a round without an undo call.
func (r *Round) Decide(undoIt bool) {
	if r.undo.Script == nil {
		return
	}
	d := int32(keep)
	if undoIt {
		d = undo
	}
	if !r.decision.CompareAndSwap(0, d) || !undoIt {
		return
	}
	// Nodes whose request already finished get their undo now; the others
	// run it themselves when they finish (see deliver).
	for i := range r.slots {
		if r.slots[i].Load()&doneBit != 0 && r.claimUndo(i) {
			r.enqueueUndo(i)
		}
	}
}

// Keep decides that the round succeeded: nothing is undone. If requests are
// still in flight, the round is remembered under key and token until they
// finish, so that UndoLate can still reach them.
func (r *Round) Keep(key, token string) {
	if r.undo.Script == nil || !r.decision.CompareAndSwap(0, keep) {
		return
	}
	ns := r.ns
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if r.pending.Load() > 0 { // else the last request already finished: nothing can land late
		h := &holder{key, token}
		r.tracked = h
		ns.inflight[*h] = r
	}
}

// UndoLate is called when the holder of key and token lets go. A request of
// its acquisition that is still in flight (a slow node, a retry across a
// healed partition) would otherwise write the key after the release had
// deleted it, and block the next holder on that node until the TTL; this
// makes such a request undo its own write when it finishes. Requests that
// have finished are the release's business.
func (ns *Nodes) UndoLate(key, token string) {
	ns.mu.Lock()
	r := ns.inflight[holder{key, token}]
	ns.mu.Unlock()
	if r != nil {
		r.decision.CompareAndSwap(keep, undo)
	}
}

// WaitUndone waits until the undo of every node for which wait returns true
// has finished, or until d passes. The other nodes, and nodes whose request
// has not finished yet, are undone in the background.
func (r *Round) WaitUndone(wait func(node int) bool, d time.Duration) {
	if r.undone == nil {
		return
	}
	k := 0
	for i := range r.slots {
		if wait(i) {
			k++
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for k > 0 {
		select {
		case i := <-r.undone:
			if wait(i) {
				k--
			}
		case <-t.C:
			return
		}
	}
}

// deliver records node i's reply. It returns true if the round was already
// decided as failed and the caller (the node's worker) must undo node i now.
// A request that was never sent (sent false) has nothing to undo.
func (r *Round) deliver(i int, res Result, sent bool) (undoNow bool) {
	r.results <- res // buffered for every node: never blocks
	if r.undo.Script != nil {
		if !sent {
			r.slots[i].Or(doneBit | undoBit) // claimed: nobody undoes a request never sent
			r.undone <- i
		} else {
			r.slots[i].Or(doneBit)
			undoNow = r.decision.Load() == undo && r.claimUndo(i)
		}
	}
	if r.pending.Add(-1) == 0 {
		r.cancel()
		r.ns.mu.Lock()
		if r.tracked != nil {
			delete(r.ns.inflight, *r.tracked)
			r.tracked = nil
		}
		r.ns.mu.Unlock()
	}
	return undoNow
}

// claimUndo makes sure exactly one of Decide and deliver undoes node i.
func (r *Round) claimUndo(i int) bool {
	for {
		old := r.slots[i].Load()
		if old&undoBit != 0 {
			return false
		}
		if r.slots[i].CompareAndSwap(old, old|undoBit) {
			return true
		}
	}
}

// enqueueUndo hands node i's undo to its workers, waiting at most the round
// timeout for room in the queue. A node too busy to take it keeps our key
// until its TTL, the same as a node that was unreachable.
func (r *Round) enqueueUndo(i int) {
	nd := r.ns.nodes[i]
	if r.ns.closed.Load() {
		r.undone <- i
		return
	}
	nd.ensureWorker(r.ns)
	select {
	case nd.queue <- job{round: r, node: i, undo: true}:
		return
	default:
	}
	t := time.NewTimer(r.ns.timeout)
	defer t.Stop()
	select {
	case nd.queue <- job{round: r, node: i, undo: true}:
	case <-t.C:
		r.undone <- i
	case <-r.ns.stop:
		r.undone <- i
	}
}

// ensureWorker starts a worker if none is idle and the node is below its
// limit.
func (nd *node) ensureWorker(ns *Nodes) {
	if nd.idle.Load() > 0 || nd.total.Load() >= nd.max {
		return
	}
	nd.spawnMu.Lock()
	defer nd.spawnMu.Unlock()
	if nd.idle.Load() > 0 || nd.total.Load() >= nd.max || ns.closed.Load() {
		return
	}
	nd.total.Add(1)
	nd.idle.Add(1)
	ns.workers.Add(1)
	go nd.work(ns)
}

// work takes jobs until Close. It keeps one dedicated connection when the
// client is a plain *redis.Client (a go-redis pool checks a connection's
// health with a syscall on every checkout; a held connection needs no
// checkout), and uses the client's pool otherwise, and until the node is warm.
func (nd *node) work(ns *Nodes) {
	defer ns.workers.Done()
	var conn *redis.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close()
		}
	}()
	for {
		select {
		case <-ns.stop:
			return
		case j := <-nd.queue:
			nd.idle.Add(-1)
			conn = nd.run(conn, j)
			nd.idle.Add(1)
		}
	}
}

// run executes one job and returns the connection to keep using (nil after
// a network error, so the next job gets a fresh one).
func (nd *node) run(conn *redis.Conn, j job) *redis.Conn {
	r := j.round
	if !j.undo {
		if err := r.ctx.Err(); err != nil {
			// Waited in the queue past the round's deadline: not sent at all.
			r.deliver(j.node, Result{Node: j.node, Err: fmt.Errorf("not sent: %w", err)}, false)
			return conn
		}
		var (
			v   int64
			err error
		)
		conn, v, err = nd.exec(r.ctx, conn, r.call)
		if !r.deliver(j.node, Result{Node: j.node, Val: v, Err: err}, true) {
			return conn
		}
		// The round failed while this request was in flight: undo it now
		// that it has finished.
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.parent), r.ns.timeout)
	defer cancel()
	conn, _, _ = nd.exec(ctx, conn, r.undo)
	r.undone <- j.node
	return conn
}

// exec runs c on the worker's connection (made on first use, for a plain
// *redis.Client whose node is warm) or on the client's pool, and drops the
// connection after an error that leaves it in an unknown state (a timeout,
// a reset).
func (nd *node) exec(ctx context.Context, conn *redis.Conn, c Call) (*redis.Conn, int64, error) {
	client, plain := nd.client.(*redis.Client)
	var doer script.Doer = nd.client
	if plain && nd.warm.Load() {
		if conn == nil {
			conn = client.Conn()
		}
		doer = conn
	}
	v, err := c.Script.Run(ctx, doer, c.Line)
	var replyErr redis.Error
	answered := err == nil || errors.As(err, &replyErr)
	switch {
	case plain && !answered && conn != nil:
		_ = conn.Close() // a timeout or a reset leaves the connection in an unknown state
		conn = nil
	case plain && answered && conn == nil:
		nd.warm.Store(true)
	}
	return conn, v, err
}
