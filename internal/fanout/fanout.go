// Package fanout sends one script call to every node of a quorum at once and
// lets the caller decide from the first replies, without ever waiting on a
// node that does not answer.
//
// Each node has a few long-lived workers, started as load needs them and
// stopped by Close. So:
//
//   - a round starts no goroutine per node;
//   - a request for a node with a free worker, or below its limit of
//     workers, is sent at once, never behind another request: whether it
//     gets a worker is decided as it is queued (see node.idle);
//   - a node that hangs cannot make requests pile up: at most Workers
//     requests per node are in flight, and a request that waited in the
//     node's queue past its round's deadline is answered with a timeout
//     without being sent;
//   - the caller never blocks on a node: it selects on Arrived and Expired.
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
	Val  int64
	Vals []int64 // the reply of a Multi call
	Err  error
}

// Call is one script invocation, the same command line for every node.
type Call struct {
	Script *script.Script
	Line   []any
	// Build, if set (on an undo call), makes Line from Key and Token the
	// first time the call is sent: most rounds never undo anything, and a
	// command line costs allocations. It must not keep Key or Token past
	// its return in anything but the line.
	Build func(key string, token any) []any
	Key   string
	Token any
	Multi bool // the script replies with an array of integers (Result.Vals)
	// Skip, on an undo call, names replies that wrote nothing to undo (the
	// key was someone else's), so no undo is sent for them.
	Skip func(Result) bool
}

// ErrOverloaded is the cause recorded for a node whose queue was full: more
// requests were waiting for it than its workers could take.
var ErrOverloaded = errors.New("node overloaded: request queue full")

// ErrClosed is returned by rounds started after Close.
var ErrClosed = errors.New("fanout closed")

// errDecided is the cause recorded for a request that was still queued when
// its round was decided as failed or its holder let go.
var errDecided = errors.New("not sent: round already decided")

// Nodes owns the workers of every node.
type Nodes struct {
	nodes   []*node
	freeMu  sync.Mutex
	free    []*Round // finished rounds, for reuse, the latest last (see Round.Done)
	timeout time.Duration
	stop    chan struct{}
	closed  atomic.Bool
	workers sync.WaitGroup
	// beforeTake, if set (by tests, before the first round), runs in a
	// worker that a job woke, before it takes the job from the queue.
	beforeTake func()

	// OnFailure, if set, is told of every request that failed on a node, in
	// the worker, even after its round was decided (the caller may be gone
	// by then: that is how a slow node's failure still gets counted).
	OnFailure func(ctx context.Context, node int, err error)

	mu sync.Mutex
	// Granted rounds that still have requests in flight, so that a release
	// is sent after a late write, never racing it (see Keep and
	// StartAfter).
	inflight map[holder]*Round
	// The deadline context that rounds starting now share (see deadline).
	bucket     time.Time
	bucketCtx  context.Context
	bucketStop context.CancelFunc
}

// holder identifies one acquisition.
type holder struct{ key, token string }

type node struct {
	client redis.UniversalClient
	// The node's queue: jobs wait in q, in order, up to queueLen of them.
	// room holds a token for each job queued or being queued (a sender
	// takes one before it appends, so a full queue refuses or blocks as a
	// channel of queueLen would), ready one for each job in q that no
	// worker has taken. Both are channels of empty structs, which have no
	// buffer: a queue costs memory only while jobs wait in it (a channel
	// of queueLen jobs cost 96 KiB per node, 480 KiB per quorum of five,
	// allocated by New).
	room  chan struct{}
	ready chan struct{}
	qmu   sync.Mutex
	q     []job
	head  int // q[head:] are waiting
	max   int32
	total atomic.Int32 // workers started
	// idle is the workers free for a new job less the jobs queued for
	// them: a push claims one (decrements it), a worker that finishes a
	// job gives one back (increments it) before it publishes the job's
	// outcome, and popping a job changes nothing. Negative, it is how many
	// queued jobs no worker is free for yet. So whether a push gets a
	// worker at once is decided in the pushing goroutine, by the pushes and
	// the published outcomes before it, never by how far a woken worker
	// has got.
	idle    atomic.Int32
	spawnMu sync.Mutex
}

// job is what travels through a node's queue: by value, in an array the
// queue reuses, so queueing one does not allocate once the queue has grown
// to its load.
type job struct {
	round *Round
	node  int
	undo  bool
	after bool // chained after another round's request (StartAfter): always sent
}

// queueLen is how many requests may wait for one node's workers. A burst
// beyond that fails on that node at once (ErrOverloaded); requests that wait
// past their round's deadline are dropped unsent, so a long queue costs
// memory (24 bytes a request waiting, see node), never stale writes.
const queueLen = 4096

// New prepares workers for clients: at most workersPerNode each, started as
// load requires. Every round is bounded by timeout (plus at most a 32nd
// of it, or 1 ms, see deadline).
func New(clients []redis.UniversalClient, workersPerNode int, timeout time.Duration) *Nodes {
	ns := &Nodes{
		nodes:    make([]*node, len(clients)),
		timeout:  timeout,
		stop:     make(chan struct{}),
		inflight: map[holder]*Round{},
		free:     make([]*Round, 0, freeRounds),
	}
	for i, c := range clients {
		ns.nodes[i] = &node{client: c, room: make(chan struct{}, queueLen), ready: make(chan struct{}, queueLen), max: int32(workersPerNode)}
	}
	return ns
}

// Closed reports whether Close was called.
func (ns *Nodes) Closed() bool { return ns.closed.Load() }

// Close stops every worker after its current request and waits for them,
// at most two node timeouts. Rounds started afterwards fail on every node
// with ErrClosed.
func (ns *Nodes) Close() {
	if ns.closed.CompareAndSwap(false, true) {
		close(ns.stop)
	}
	// Workers stop between requests. One blocked in a call to a hung node
	// through a client that ignores contexts (go-redis without
	// ContextTimeoutEnabled: its read timeout, then retries) would hold
	// Close for seconds: wait at most two node timeouts, then leave such
	// workers to end when their call returns (the client's own timeouts,
	// or its Close).
	done := make(chan struct{})
	go func() {
		ns.workers.Wait()
		close(done)
	}()
	t := time.NewTimer(2 * ns.timeout)
	select {
	case <-done:
	case <-t.C:
	}
	t.Stop()
	ns.mu.Lock()
	if ns.bucketStop != nil {
		ns.bucketStop()
	}
	ns.mu.Unlock()
}

// deadline returns a context that is done at least one timeout from now and
// at most that plus DeadlineSlack. Rounds that start within that slack share
// one: a deadline context costs a timer and four allocations, and a round
// takes about a millisecond or less, so sharing only within one millisecond
// still paid them about once per acquire+release.
func (ns *Nodes) deadline() context.Context {
	earliest := time.Now().Add(ns.timeout)
	slack := DeadlineSlack(ns.timeout)
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if ns.bucketCtx == nil || ns.bucket.Before(earliest) || ns.bucket.After(earliest.Add(slack)) {
		// The previous bucket's context is left to its timer: rounds may
		// still use it, and it ends on its own within one timeout.
		ns.bucket = earliest.Add(slack)
		ns.bucketCtx, ns.bucketStop = context.WithDeadline(context.Background(), ns.bucket)
	}
	return ns.bucketCtx
}

// DeadlineSlack is how much later than one timeout a shared round deadline
// may end: a 32nd of the timeout (about 3 ms for the 100 ms default), at
// least 1 ms.
func DeadlineSlack(timeout time.Duration) time.Duration {
	return max(timeout/32, time.Millisecond)
}

// detached carries the caller's values (trace spans, loggers) to the
// requests, but the round's shared deadline, not the caller's
// cancellation: a request is bounded by the node timeout whatever the
// caller does, and the caller stops waiting on its own ctx.
type detached struct {
	context.Context                 // the shared deadline
	values          context.Context // the caller's
}

// Value looks key up in the caller's context.
func (d detached) Value(key any) any { return d.values.Value(key) }

// freeRounds bounds how many finished rounds wait for reuse.
const freeRounds = 256

// maxInline is the node count up to which a round keeps its per-node state
// inside the Round itself: one allocation for the round and its nodes.
const maxInline = 16

// Round is one call sent to every node.
type Round struct {
	ns      *Nodes
	call    Call
	undo    Call // undo.Script nil: nothing to undo
	parent  context.Context
	ctx     *detached // the requests' context (points at dctx): caller's values, shared deadline
	pending atomic.Int32
	// refs counts who may still touch the round: the caller until Done,
	// each node until its request (and any undo of it) has finished. The
	// last one to let go puts the round up for reuse, so no late reply or
	// undo can ever write into a round that a later call is using.
	refs    atomic.Int32
	arrived chan int // node indexes in the order their replies arrive

	decision atomic.Int32    // 0 undecided, then keep or undo
	slots    []atomic.Uint32 // per node: doneBit, then undoBit once claimed; chainBit: next follows
	next     *Round          // the round StartAfter chained to this one's requests in flight (set under ns.mu)
	results  []Result        // per node, written before its index is sent on arrived
	undone   chan int        // made by Decide(true): one entry per finished undo
	tracked  holder          // the key under which it is in ns.inflight
	tracking bool            // in ns.inflight (under ns.mu)
	undoOnce sync.Once       // builds undo.Line (Call.Build), once

	dctx          detached // ctx, inside the Round: one allocation less
	inlineSlots   [maxInline]atomic.Uint32
	inlineResults [maxInline]Result
}

const (
	keep = 1 // Keep: the acquisition succeeded
	undo = 2 // Decide(true): the acquisition failed; undo every node

	doneBit  = 1 << 0
	undoBit  = 1 << 1
	chainBit = 1 << 2 // next's request to this node is sent when this one's finishes
)

// Start sends c to every node under one deadline (about the timeout given to
// New) and returns at once. With an undo call (undoCall.Script not nil), the
// caller must later Decide or Keep; after Decide(true), undo is sent to
// every node once that node's own request has finished (never before, so it
// cannot overtake a late write), under a fresh deadline that ignores the
// cancellation of ctx.
func (ns *Nodes) Start(ctx context.Context, c Call, undoCall Call) *Round {
	r := ns.newRound(ctx, c, undoCall)
	for i := range ns.nodes {
		r.send(i)
	}
	return r
}

// StartAfter is Start for a call without undo that must not overtake the
// requests of the acquisition of key and token (a round given to Keep
// under them): on every node where that acquisition's request is still in
// flight, c is sent only once it has finished, by the same worker, even if
// this round's deadline has passed by then (under a fresh one). A release
// sent so lands after a late write of its own acquisition and deletes it,
// in one command per node. On the other nodes c is sent at once, as
// Start does.
func (ns *Nodes) StartAfter(ctx context.Context, c Call, key, token string) *Round {
	r := ns.newRound(ctx, c, Call{})
	ns.mu.Lock()
	prev := ns.inflight[holder{key, token}]
	if prev != nil && prev.next == nil {
		prev.next = r
		// In ns.inflight, prev has a request in flight, which holds a
		// reference: prev cannot be recycled under us until we let go.
		prev.refs.Add(1)
	} else {
		prev = nil // none, or already followed by an earlier call: that one deletes late writes
	}
	ns.mu.Unlock()
	for i := range ns.nodes {
		if prev != nil && prev.follow(i) {
			continue // prev's worker sends it (see deliver)
		}
		r.send(i)
	}
	if prev != nil {
		prev.unref()
	}
	return r
}

func (ns *Nodes) newRound(ctx context.Context, c Call, undoCall Call) *Round {
	n := len(ns.nodes)
	var r *Round
	ns.freeMu.Lock()
	if k := len(ns.free); k > 0 {
		r = ns.free[k-1] // reset by unref
		ns.free[k-1] = nil
		ns.free = ns.free[:k-1]
	}
	ns.freeMu.Unlock()
	if r == nil {
		r = &Round{ns: ns, arrived: make(chan int, n)}
	}
	r.call, r.undo, r.parent = c, undoCall, ctx
	r.dctx = detached{Context: ns.deadline(), values: ctx}
	r.ctx = &r.dctx
	if n <= maxInline {
		r.slots, r.results = r.inlineSlots[:n], r.inlineResults[:n]
	} else {
		r.slots, r.results = make([]atomic.Uint32, n), make([]Result, n)
	}
	r.pending.Store(int32(n))
	r.refs.Store(int32(n) + 1)
	return r
}

// Done tells the round that its caller is finished with it: no more
// Arrived, Result, Decide, Keep or WaitUndone. The round is reused once its
// requests (and undos) have finished too. Calling it is optional (a round
// never Done is left to the garbage collector); calling it twice, or using
// the round afterwards, is a bug.
func (r *Round) Done() { r.unref() }

// unref drops one reference; the last one recycles the round.
func (r *Round) unref() {
	if r.refs.Add(-1) != 0 {
		return
	}
	if len(r.slots) > maxInline {
		return // per-node state outside the Round: not worth keeping
	}
	ns, ch := r.ns, r.arrived
	for len(ch) > 0 { // every node delivered: nothing is sent on it any more
		<-ch
	}
	*r = Round{ns: ns, arrived: ch}
	ns.freeMu.Lock()
	if len(ns.free) < cap(ns.free) {
		ns.free = append(ns.free, r)
	}
	ns.freeMu.Unlock()
}

// send queues node i's request.
func (r *Round) send(i int) {
	ns, nd := r.ns, r.ns.nodes[i]
	if ns.closed.Load() {
		r.deliver(i, Result{Err: ErrClosed}, false, nil)
		r.unref() // not sent: nothing to undo
		return
	}
	select {
	case nd.room <- struct{}{}:
		nd.claim(ns)
		nd.push(job{round: r, node: i})
	default:
		r.deliver(i, Result{Err: ErrOverloaded}, false, nil)
		r.unref()
	}
}

// follow marks node i so that r.next's request to it is sent when r's
// request to it finishes; false if it has finished already.
func (r *Round) follow(i int) bool {
	for {
		old := r.slots[i].Load()
		if old&doneBit != 0 {
			return false
		}
		if r.slots[i].CompareAndSwap(old, old|chainBit) {
			return true
		}
	}
}

// Arrived delivers the index of each node as its reply arrives; read the
// reply with Result.
func (r *Round) Arrived() <-chan int { return r.arrived }

// Result returns node i's reply, once i has come out of Arrived.
func (r *Round) Result(i int) Result { return r.results[i] }

// Expired is closed when the round's deadline passes.
func (r *Round) Expired() <-chan struct{} { return r.ctx.Done() }

// Decide tells the round whether to undo. Only the first of Decide and Keep
// counts; it does nothing for a round without an undo call.
func (r *Round) Decide(undoIt bool) {
	if r.undo.Script == nil {
		return
	}
	if !undoIt {
		r.decision.CompareAndSwap(0, keep)
		return
	}
	r.undone = make(chan int, len(r.slots)) // before the decision: workers read it after seeing undo
	if !r.decision.CompareAndSwap(0, undo) {
		return
	}
	// Nodes whose request already finished get their undo now; the others
	// run it themselves when they finish (see deliver).
	for i := range r.slots {
		if r.slots[i].Load()&doneBit != 0 && r.claimUndo(i) {
			r.refs.Add(1) // node i's own reference may be gone: the undo takes one
			r.enqueueUndo(i)
		}
	}
}

// Keep decides that the round succeeded: nothing is undone. If requests are
// still in flight, the round is remembered under key and token until they
// finish, so that StartAfter can still follow them.
func (r *Round) Keep(key, token string) {
	if r.undo.Script == nil || !r.decision.CompareAndSwap(0, keep) {
		return
	}
	ns := r.ns
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if r.pending.Load() > 0 { // else the last request already finished: nothing can land late
		r.tracked, r.tracking = holder{key, token}, true
		ns.inflight[r.tracked] = r
	}
}

// WaitUndone waits until the undo of every node for which wait returns true
// has finished, or until d passes or ctx is done, whichever comes first.
// The other nodes, and nodes whose request has not finished yet, are
// undone in the background.
func (r *Round) WaitUndone(ctx context.Context, wait func(node int) bool, d time.Duration) {
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
		case <-ctx.Done():
			return
		}
	}
}

// deliver records node i's reply. It returns true if the caller (the node's
// worker) must undo node i now: the round was decided as failed before this
// request finished. A request that was never sent (sent false) has nothing
// to undo. It returns the round whose request to node i must follow this
// one (StartAfter), if any: the worker sends it next. A worker calling it
// passes its node (by, else nil): when it has nothing more to send for
// node i, it is given back (node.free) before the reply is published, so a
// job the reply leads its caller to push finds it free.
//
// The order matters. The reply is stored, then the node is marked done,
// then the decision is read, and only then is the reply published.
func (r *Round) deliver(i int, res Result, sent bool, by *node) (undoNow bool, next *Round) {
	if res.Err != nil && r.ns.OnFailure != nil && !errors.Is(res.Err, errDecided) && !errors.Is(res.Err, ErrClosed) {
		r.ns.OnFailure(r.parent, i, res.Err)
	}
	r.results[i] = res // before the done bit: Decide reads it once it sees the bit
	if r.undo.Script != nil {
		var old uint32
		if !sent || r.nothingToUndo(res) {
			old = r.slots[i].Or(doneBit | undoBit) // claimed: nothing to undo here
		} else {
			old = r.slots[i].Or(doneBit)
			if r.decision.Load() == undo {
				undoNow = r.claimUndo(i)
			}
		}
		if old&chainBit != 0 {
			next = r.next // written before the bit was set
		}
	}
	if by != nil && !undoNow && next == nil {
		by.free()
	}
	r.arrived <- i // buffered for every node: never blocks
	if r.pending.Add(-1) == 0 {
		r.ns.mu.Lock()
		if r.tracking {
			delete(r.ns.inflight, r.tracked)
			r.tracking = false
		}
		r.ns.mu.Unlock()
	}
	return undoNow, next
}

// nothingToUndo reports whether a reply wrote nothing the undo call would
// remove.
func (r *Round) nothingToUndo(res Result) bool {
	return res.Err == nil && r.undo.Skip != nil && r.undo.Skip(res)
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

// undoneSignal reports a finished undo to WaitUndone, if anyone waits.
func (r *Round) undoneSignal(i int) {
	if r.undone != nil {
		r.undone <- i // buffered for every node: never blocks
	}
}

// enqueueUndo hands node i's undo to its workers, waiting at most the round
// timeout for room in the queue. A node too busy to take it keeps our key
// until its TTL, the same as a node that was unreachable.
func (r *Round) enqueueUndo(i int) {
	nd := r.ns.nodes[i]
	if r.ns.closed.Load() {
		r.undoneSignal(i)
		r.unref()
		return
	}
	select {
	case nd.room <- struct{}{}:
		nd.claim(r.ns)
		nd.push(job{round: r, node: i, undo: true})
		return
	default:
	}
	t := time.NewTimer(r.ns.timeout)
	defer t.Stop()
	select {
	case nd.room <- struct{}{}:
		nd.claim(r.ns)
		nd.push(job{round: r, node: i, undo: true})
	case <-t.C:
		r.undoneSignal(i)
		r.unref()
	case <-r.ns.stop:
		r.undoneSignal(i)
		r.unref()
	}
}

// claim books a worker for a job about to be pushed: a free one if there
// is one, else a new one if the node is below its limit (and ns is not
// closed); else the job waits for the first worker to finish. Workers only
// stop at Close, so a claimed job always has a worker that comes for it
// until then.
func (nd *node) claim(ns *Nodes) {
	if nd.idle.Add(-1) >= 0 || nd.total.Load() >= nd.max {
		return
	}
	nd.spawnMu.Lock()
	defer nd.spawnMu.Unlock()
	// idle back at 0 or above: workers freed since, enough for every
	// queued job, this one included.
	if nd.idle.Load() >= 0 || nd.total.Load() >= nd.max || ns.closed.Load() {
		return
	}
	nd.total.Add(1)
	nd.idle.Add(1) // the new worker, booked by this claim
	ns.workers.Add(1)
	go nd.work(ns)
}

// free gives back the worker that called it: it has finished its job and
// will take the next one.
func (nd *node) free() { nd.idle.Add(1) }

// push appends j to the queue, for which the caller took a room token.
// Its ready token never blocks: ready holds at most one per job in q, and
// q at most as many jobs as room holds tokens.
func (nd *node) push(j job) {
	nd.qmu.Lock()
	if nd.head > 0 && len(nd.q) == cap(nd.q) {
		// Full array, taken jobs at its front: move the waiting ones
		// down, so that the array does not grow.
		n := copy(nd.q, nd.q[nd.head:])
		clear(nd.q[n:])
		nd.q, nd.head = nd.q[:n], 0
	}
	nd.q = append(nd.q, j)
	nd.qmu.Unlock()
	nd.ready <- struct{}{}
}

// pop takes the first job, for which the caller took a ready token, and
// gives its room token back.
func (nd *node) pop() job {
	nd.qmu.Lock()
	j := nd.q[nd.head]
	nd.q[nd.head] = job{}
	nd.head++
	if nd.head == len(nd.q) {
		nd.q, nd.head = nd.q[:0], 0
	}
	nd.qmu.Unlock()
	<-nd.room
	return j
}

// work takes jobs until Close. Once Close was called it takes no more,
// even when one is ready: a select between the two would draw one at
// random, and whether a closed node sends its queued requests would follow
// the draw. A job left in the queue is never sent; its round ends at its
// deadline.
func (nd *node) work(ns *Nodes) {
	defer ns.workers.Done()
	for {
		select {
		case <-ns.stop:
			return
		case <-nd.ready:
			if ns.closed.Load() {
				return // the select drew the job over the stop, or Close came with it: it stays queued, unsent
			}
			if ns.beforeTake != nil {
				ns.beforeTake()
			}
			j := nd.pop() // claimed at its push: idle already counts it
			for next := nd.run(j); next != nil; next = nd.run(j) {
				j = job{round: next, node: j.node, after: true}
			}
		}
	}
}

// run executes one job. It returns the round whose request to the same
// node must be sent next (StartAfter), if any.
func (nd *node) run(j job) (next *Round) {
	r := j.round
	if !j.undo {
		if err := r.ctx.Err(); err != nil && !j.after {
			// Waited in the queue past the round's deadline: not sent at all.
			_, next = r.deliver(j.node, Result{Err: fmt.Errorf("not sent: %w", err)}, false, nd)
			r.unref()
			return next
		}
		if r.decision.Load() == undo {
			// Failed while this request waited: sending it would only
			// write a key that then has to be undone.
			_, next = r.deliver(j.node, Result{Err: errDecided}, false, nd)
			r.unref()
			return next
		}
		// Granted while this request waited: it is still sent (within the
		// round's deadline, checked above; a request that follows another
		// round's, whatever the deadline). The grant did not need this
		// node, but the lock does: a key left on a bare majority survives
		// no node failure for its whole life, and renewals only extend the
		// copies that exist.
		// A request that waited in the queue for most of its round would be
		// cut off mid-reply by the round's deadline, and go-redis would drop
		// the connection and dial a new one for the next: a slow node would
		// spend its time reconnecting. Such a request gets a full timeout of
		// its own from now; the caller stops waiting at the round's deadline
		// regardless.
		var ctx context.Context = r.ctx
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < r.ns.timeout/2 {
			ctx = detached{Context: r.ns.deadline(), values: r.parent}
		}
		var res Result
		if r.call.Multi {
			res.Vals, res.Err = r.call.Script.RunInts(ctx, nd.client, r.call.Line)
		} else {
			res.Val, res.Err = r.call.Script.Run(ctx, nd.client, r.call.Line)
		}

		undoNow, next := r.deliver(j.node, res, true, nd)
		if !undoNow {
			r.unref()
			return next
		}
		// The round failed while this request was in flight: undo it now
		// that it has finished. (A failed round is never followed: only
		// rounds given to Keep are.)
	}
	// A fresh deadline: the round's may have passed, and the caller's
	// cancellation must not stop a cleanup.
	ctx := detached{Context: r.ns.deadline(), values: r.parent}
	_, _ = r.undo.Script.Run(ctx, nd.client, r.undoLine())
	nd.free() // before the signal: a push it causes finds this worker free
	r.undoneSignal(j.node)
	r.unref()
	return nil
}

// undoLine returns the undo call's command line, built on first use when
// the call has a Build function (several workers may undo at once).
func (r *Round) undoLine() []any {
	if r.undo.Build != nil {
		r.undoOnce.Do(func() { r.undo.Line = r.undo.Build(r.undo.Key, r.undo.Token) })
	}
	return r.undo.Line
}
