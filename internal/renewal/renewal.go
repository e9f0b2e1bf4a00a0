// Package renewal is the renewal engine behind renew.Watchdog and the
// Locker's default keeper: one scheduling goroutine and, per strategy
// ("lane"), at most a few renewal calls in flight, each on its own
// goroutine and under its own deadline.
//
// It lives below the root package so that the root can keep Do's locks
// alive without importing renew (which imports the root). It knows nothing
// of redlease: the kept items are anything with a validity, a TTL, an Until
// and a Deadline, and the renewal call, the lane of an item and what counts
// as a "not held" verdict are passed in a Config.
package renewal

import (
	"container/heap"
	"context"
	"errors"
	"reflect"
	"slices"
	"sync"
	"time"
)

// Defaults, in one place; renew exports them under the same names.
const (
	DefaultFraction = 1.0 / 3
	DefaultTimeout  = time.Second
	DefaultMaxCalls = 2
	MaxRetryDelay   = 250 * time.Millisecond
)

// Item is what the engine keeps: a *redlease.Lock.
type Item interface {
	comparable
	// Valid reports whether the item is still worth extending.
	Valid() bool
	// TTL is the item's time to live, which the engine reads again every
	// time it schedules the item: it is extended every Fraction of it
	// (see Engine.Keep).
	TTL() time.Duration
	// Until is the end of the current validity.
	Until() time.Time
	// Deadline is when the item counts as lost unless extended first: no
	// call waits beyond it.
	Deadline() time.Time
}

// Config is what an Engine runs with. Extend, NotHeld and Lane are
// required; zero numbers take the defaults.
type Config[T Item] struct {
	// Fraction of the TTL after which an item is extended (0: DefaultFraction).
	Fraction float64
	// Timeout is the renewal timeout (0: DefaultTimeout).
	Timeout time.Duration
	// MaxCalls bounds the calls in flight per lane (0: DefaultMaxCalls).
	MaxCalls int
	// Extend extends items and records each outcome on its item; its
	// result matches items one to one (redlease.ExtendAll).
	Extend func(ctx context.Context, items []T) []error
	// NotHeld reports whether err is a verdict that the item is not
	// held (errors.Is(err, redlease.ErrNotHeld)).
	NotHeld func(err error) bool
	// Lane returns what groups items into lanes: their strategy (LaneKey).
	Lane func(T) any
	// Now is the engine's clock, the one its items' Until and Deadline are
	// read on (nil: time.Now). Timers run in real time, armed from its
	// readings and re-armed while it says "not yet".
	Now func() time.Time
	// IdleStop makes the engine start its scheduler on the first Keep and
	// end it, and with it every goroutine of the engine, whenever it keeps
	// nothing and has no call in flight; the next Keep starts it again.
	// Without it, New starts the scheduler, which runs until Close.
	IdleStop bool
}

// CallBounder is a lane key (a strategy) whose calls may take up to a bound
// of their own: the quorum strategy's node timeout, for each round of a
// batch (the rounds run at once). It has the shape of redlease.CallBounder,
// which the strategies implement. The engine waits for such a lane's call
// at least twice that bound, whatever its renewal timeout: giving up on a
// call the strategy is still entitled to finish keeps its call slot busy
// and sends a retry behind it (with a 2 s node timeout and the 1 s default,
// under load, whole lanes ran out of validity).
type CallBounder interface {
	CallBound() time.Duration
}

// laneTimeout is the renewal timeout for calls of lane key: the engine's,
// or twice the key's own CallBound when that is longer.
func (w *Engine[T]) laneTimeout(key any) time.Duration {
	if b, ok := key.(CallBounder); ok {
		if d := 2 * b.CallBound(); d > w.timeout {
			return d
		}
	}
	return w.timeout
}

// LaneKey is the lane of an item of strategy s: s itself (with the item's
// shard, for a Sharded item that names one), or the item for a strategy
// that cannot be a map key (== on an incomparable dynamic value panics).
func LaneKey(s, item any) any {
	if s == nil || reflect.TypeOf(s).Kind() == reflect.Pointer || reflect.ValueOf(s).Comparable() {
		if sh, ok := item.(Sharded); ok {
			if id := sh.Shard(); id != "" {
				return shardLane{s: s, shard: id}
			}
		}
		return s
	}
	return item
}

// Sharded is an item whose strategy keeps keys on several independent
// servers (redlease.Sharder): Shard names the item's ("" if none). Items of
// one strategy on different shards go in lanes, and so calls, of their
// own: a slow server holds back only its own items' verdicts.
type Sharded interface {
	Shard() string
}

// shardLane is the lane of a strategy's items on one shard.
type shardLane struct {
	s     any
	shard string
}

// CallBound is the strategy's (see CallBounder), or 0.
func (l shardLane) CallBound() time.Duration {
	if b, ok := l.s.(CallBounder); ok {
		return b.CallBound()
	}
	return 0
}

// Engine keeps any number of items alive. See renew.Watchdog for the
// behaviour; every method is safe for concurrent use.
type Engine[T Item] struct {
	fraction float64
	timeout  time.Duration
	maxCalls int
	extend   func(ctx context.Context, items []T) []error
	notHeld  func(error) bool
	lane     func(T) any
	now      func() time.Time // nil: time.Now
	idleStop bool

	mu      sync.Mutex
	due     dueHeap[T] // items waiting for their next extension, earliest first
	entries map[T]*entry[T]
	lanes   map[any]*lane[T]
	waiting []*call[T]     // calls in flight whose deadline has not passed
	running int            // call goroutines not yet returned
	drained chan struct{}  // made by Close; closed when running reaches 0
	gen     *generation[T] // the scheduler's run; nil before the first (IdleStop)
	stopped bool
}

// generation is one run of the scheduler, from its start to Close (or, with
// IdleStop, to the moment the engine went idle). Its channels and context
// are made when it starts, so that nothing made by one run is touched by
// the next.
type generation[T Item] struct {
	ctx      context.Context // parent of every call; cancelled by Close or idleness
	cancel   context.CancelFunc
	wake     chan struct{} // the scheduler should look again
	finished chan *call[T] // calls that returned, to the scheduler
	stop     chan struct{} // closed by Close
	done     chan struct{} // closed when the scheduler returned
	active   bool          // the scheduler has not decided to return
}

// entry is one kept item.
type entry[T Item] struct {
	it       T
	lane     *lane[T]
	interval time.Duration
	due      time.Time
	retry    bool     // due is a retry's not-before time: never taken early
	index    int      // in the heap; -1 while pending in its lane or in a call
	call     *call[T] // the call it is in, while the engine waits for it
	dropped  bool     // stop was called: do not reschedule
	untouch  func()   // ends its registration for Touch
}

// lane is the renewal state of one strategy.
type lane[T Item] struct {
	key     any
	kept    int         // entries of this strategy
	calls   int         // its calls not yet returned, waited for or not
	pending []*entry[T] // due, waiting for a call slot
	queued  bool        // in the scheduler's list of lanes with pending entries
}

// call is one Extend over one lane's due items.
type call[T Item] struct {
	lane      *lane[T]
	batch     []*entry[T]
	start     time.Time
	deadline  time.Time
	errs      []error // written by the call's goroutine before it reports
	abandoned bool    // its deadline passed first: its entries were rescheduled
}

// New makes an Engine; without IdleStop it starts its scheduler at once.
func New[T Item](c Config[T]) *Engine[T] {
	w := &Engine[T]{
		fraction: c.Fraction,
		timeout:  c.Timeout,
		maxCalls: c.MaxCalls,
		extend:   c.Extend,
		notHeld:  c.NotHeld,
		lane:     c.Lane,
		now:      c.Now,
		idleStop: c.IdleStop,
		entries:  map[T]*entry[T]{},
		lanes:    map[any]*lane[T]{},
	}
	if w.fraction == 0 {
		w.fraction = DefaultFraction
	}
	if w.timeout == 0 {
		w.timeout = DefaultTimeout
	}
	if w.maxCalls == 0 {
		w.maxCalls = DefaultMaxCalls
	}
	if !w.idleStop {
		w.mu.Lock()
		w.startLocked()
		w.mu.Unlock()
	}
	return w
}

// clock reads the engine's clock.
func (w *Engine[T]) clock() time.Time {
	if w.now == nil {
		return time.Now()
	}
	return w.now()
}

// startLocked starts a run of the scheduler.
func (w *Engine[T]) startLocked() {
	g := &generation[T]{
		wake:     make(chan struct{}, 1),
		finished: make(chan *call[T]),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		active:   true,
	}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	w.gen = g
	go w.schedule(g)
}

// Keep extends it every fraction of its TTL until stop is called, it is
// not Valid, or a renewal finds it not held. Keeping an item that is
// already kept, or keeping after Close, does nothing.
//
// The renewal interval is computed again after every renewal, from the
// item's TTL at that moment (an extension may have changed it; its holder
// says so with Touch), and the next renewal is due no later than halfway
// from the last one's start to the item's Deadline (but no sooner than
// half an interval after it): an item whose deadline is nearer than its
// TTL suggests (a loss margin that takes much of a shortened TTL, a
// renewal that another extension capped) is still renewed before it is
// lost.
func (w *Engine[T]) Keep(it T) (stop func()) {
	noop := func() {}
	var zero T
	if it == zero || !it.Valid() {
		return noop
	}
	now := w.clock()
	interval := w.interval(it)
	due := w.firstDue(it, now, interval)
	key := w.lane(it)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return noop
	}
	if _, ok := w.entries[it]; ok {
		return noop
	}
	if w.gen == nil || !w.gen.active {
		w.startLocked() // IdleStop: the first Keep since the engine went idle
	}
	ln := w.lanes[key]
	if ln == nil {
		ln = &lane[T]{key: key}
		w.lanes[key] = ln
	}
	ln.kept++
	e := &entry[T]{it: it, lane: ln, interval: interval, due: due}
	e.untouch = sync.OnceFunc(touches.add(it, func() { w.touch(e) }))
	w.entries[it] = e
	heap.Push(&w.due, e)
	if e.index == 0 {
		w.pokeLocked()
	}
	var once sync.Once
	return func() { once.Do(func() { w.drop(e) }) }
}

// firstDue is when a renewal of it is due, seen from now, with no renewal
// of the engine's to go by: interval after the grant (Until is
// start+ttl−drift, so the grant happened about ttl before Until), but no
// later than nextDue from now.
func (w *Engine[T]) firstDue(it T, now time.Time, interval time.Duration) time.Time {
	return minTime(it.Until().Add(-it.TTL()).Add(interval), w.nextDue(it, now, interval))
}

// touch schedules e again, from now, if that makes it due sooner: its
// TTL or Deadline changed (Touch). An entry in a call, or waiting for a
// call slot, is scheduled again when its call ends.
func (w *Engine[T]) touch(e *entry[T]) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e.dropped || e.index < 0 || !e.it.Valid() {
		return
	}
	now := w.clock()
	interval := w.interval(e.it)
	if due := w.firstDue(e.it, now, interval); due.Before(e.due) {
		e.interval, e.due = interval, due
		heap.Fix(&w.due, e.index)
		if e.index == 0 {
			w.pokeLocked()
		}
	}
}

// Touch tells every engine that keeps it that its TTL or Deadline
// changed other than by the engine's own renewal (an Extend to a shorter
// TTL, by its holder): each schedules its next renewal again from now, if
// that makes it sooner. Call it without holding anything it takes.
func Touch(it any) {
	for _, f := range touches.of(it) {
		f()
	}
}

// touches is, for every kept item, what Touch calls: one function per
// engine that keeps it.
var touches = registry{m: map[any][]*func(){}}

type registry struct {
	mu sync.Mutex
	m  map[any][]*func()
}

// add registers f for it and returns what unregisters it.
func (r *registry) add(it any, f func()) (remove func()) {
	p := &f
	r.mu.Lock()
	r.m[it] = append(r.m[it], p)
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		fs := slices.DeleteFunc(r.m[it], func(q *func()) bool { return q == p })
		if len(fs) == 0 {
			delete(r.m, it)
		} else {
			r.m[it] = fs
		}
	}
}

// of returns the functions registered for it.
func (r *registry) of(it any) []func() {
	r.mu.Lock()
	defer r.mu.Unlock()
	fs := make([]func(), len(r.m[it]))
	for i, p := range r.m[it] {
		fs[i] = *p
	}
	return fs
}

// interval is the renewal interval of it: Fraction of its TTL as it is
// now (an extension may have changed it), at least a millisecond.
func (w *Engine[T]) interval(it T) time.Duration {
	return max(time.Duration(float64(it.TTL())*w.fraction), time.Millisecond)
}

// nextDue is when the renewal of it that follows one started at from is
// due: interval later, or sooner if its Deadline leaves less room than
// that: halfway from from to the Deadline, but no sooner than half the
// interval after from. An item is taken a quarter of its interval early,
// so none is renewed more often than every quarter interval, whatever
// its Deadline says (one read on another clock than the engine's too).
func (w *Engine[T]) nextDue(it T, from time.Time, interval time.Duration) time.Time {
	return from.Add(min(interval, max(it.Deadline().Sub(from)/2, interval/2)))
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// Len returns how many items the engine keeps.
func (w *Engine[T]) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.entries)
}

// Running reports whether the scheduler runs (with IdleStop: whether the
// engine is not idle).
func (w *Engine[T]) Running() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gen != nil && w.gen.active
}

// Close stops the engine: no item is extended any more, and the calls in
// flight are cancelled. It waits for the scheduler, and for those calls no
// longer than the renewal timeout. Calling Close again waits the same way.
func (w *Engine[T]) Close() {
	w.mu.Lock()
	g := w.gen
	if !w.stopped {
		w.stopped = true
		for _, e := range w.entries {
			e.untouch() // nothing is renewed any more
		}
		if g != nil && g.active {
			g.active = false
			close(g.stop)
			g.cancel()
		}
	}
	w.mu.Unlock()
	if g != nil {
		<-g.done
	}

	w.mu.Lock()
	if w.running == 0 {
		w.mu.Unlock()
		return
	}
	if w.drained == nil {
		w.drained = make(chan struct{})
	}
	drained := w.drained
	w.mu.Unlock()
	t := time.NewTimer(w.timeout)
	defer t.Stop()
	select {
	case <-drained:
	case <-t.C:
	}
}

func (w *Engine[T]) drop(e *entry[T]) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e.dropped {
		return
	}
	e.dropped = true
	w.forgetLocked(e)
	if e.index >= 0 {
		heap.Remove(&w.due, e.index)
	}
	if w.idleStop && len(w.entries) == 0 {
		w.pokeLocked() // the scheduler may be idle now
	}
}

// forgetLocked removes e from the kept items (its lane goes once it has
// neither items nor calls). e must not be put back in the heap.
func (w *Engine[T]) forgetLocked(e *entry[T]) {
	if w.entries[e.it] == e {
		e.untouch()
		delete(w.entries, e.it)
		e.lane.kept--
		w.pruneLaneLocked(e.lane)
	}
}

func (w *Engine[T]) pruneLaneLocked(ln *lane[T]) {
	if ln.kept == 0 && ln.calls == 0 && w.lanes[ln.key] == ln {
		delete(w.lanes, ln.key)
	}
}

// pokeLocked wakes the scheduler, if one runs.
func (w *Engine[T]) pokeLocked() {
	if w.gen == nil || !w.gen.active {
		return
	}
	select {
	case w.gen.wake <- struct{}{}:
	default:
	}
}

// idleLocked reports whether an IdleStop engine has nothing left to do:
// no item kept and no call goroutine running (so every lane is gone, the
// heap is empty, and no call will report to the scheduler).
func (w *Engine[T]) idleLocked() bool {
	return w.idleStop && len(w.entries) == 0 && w.running == 0
}

// RetryDelay is how long a renewal that failed without a verdict waits.
func RetryDelay(interval time.Duration) time.Duration {
	return min(interval/4, MaxRetryDelay)
}

// schedule is the engine's one long-lived goroutine (per run). It moves
// items that fall due to their lane, starts a call for each lane with due
// items and a free call slot, gives up waiting on calls whose deadline
// passed, and records the outcome of calls that return.
//
// An item is due once its interval has passed since its last extension and
// is taken a quarter of its interval before that; every item due within a
// quarter of its interval after the first goes along, so that items taken
// at scattered moments fall into a few batches per interval. A retry is
// never sent before its time.
func (w *Engine[T]) schedule(g *generation[T]) {
	defer close(g.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var ready []*lane[T] // lanes with pending entries
	for {
		w.mu.Lock()
		if w.idleLocked() && !w.stopped {
			// Nothing kept, nothing in flight: this run ends, the next
			// Keep starts another. The calls it waited for have all
			// returned.
			g.active = false
			g.cancel()
			clear(w.waiting)
			w.waiting = w.waiting[:0]
			w.mu.Unlock()
			return
		}
		now := w.clock()
		// Once one item may be taken, every item that may be taken within
		// a quarter of its interval goes along (a retry never early).
		gather := w.due.Len() > 0 && w.due[0].eligible(now)
		for gather && w.due.Len() > 0 {
			e := w.due[0]
			if !e.eligible(now) && (e.retry || now.Before(e.takeAt().Add(-e.interval/4))) {
				break
			}
			heap.Pop(&w.due)
			ln := e.lane
			ln.pending = append(ln.pending, e)
			if !ln.queued {
				ln.queued = true
				ready = append(ready, ln)
			}
		}
		// Start a call on every lane that has due items and a free slot.
		kept := ready[:0]
		for _, ln := range ready {
			if ln.calls >= w.maxCalls {
				kept = append(kept, ln)
				continue
			}
			ln.queued = false
			if c := w.callLocked(g, ln, now); c != nil {
				w.waiting = append(w.waiting, c)
			}
		}
		clear(ready[len(kept):])
		ready = kept
		// Stop waiting for calls past their deadline.
		next := now.Add(time.Hour)
		waiting := w.waiting[:0]
		for _, c := range w.waiting {
			if !now.Before(c.deadline) {
				w.abandonLocked(c, now)
				continue
			}
			waiting = append(waiting, c)
			if c.deadline.Before(next) {
				next = c.deadline
			}
		}
		clear(w.waiting[len(waiting):])
		w.waiting = waiting
		if w.due.Len() > 0 {
			if at := w.due[0].takeAt(); at.Before(next) {
				next = at
			}
		}
		w.mu.Unlock()

		timer.Reset(max(next.Sub(now), 0))
		select {
		case <-timer.C:
		case <-g.wake:
		case c := <-g.finished:
			w.mu.Lock()
			w.finishLocked(c)
			w.mu.Unlock()
		case <-g.stop:
			return
		}
	}
}

// eligible reports whether e may go into a batch now.
func (e *entry[T]) eligible(now time.Time) bool { return !now.Before(e.takeAt()) }

// takeAt is the earliest moment e goes into a batch: a quarter of its
// interval before it is due, so that it can join others, but a retry not
// before its time.
func (e *entry[T]) takeAt() time.Time {
	if e.retry {
		return e.due
	}
	return e.due.Add(-e.interval / 4)
}

// callLocked starts one call with ln's pending items, under a deadline of
// the lane's renewal timeout (laneTimeout), narrowed to the latest
// Deadline of its items: no item needs an answer after its own deadline
// (the item is lost then, and a late success does not revive it), but one
// item near its deadline must not cut short the call for the others. It
// returns nil if none of them is still worth extending.
func (w *Engine[T]) callLocked(g *generation[T], ln *lane[T], now time.Time) *call[T] {
	batch := ln.pending
	ln.pending = nil
	limit := now.Add(w.laneTimeout(ln.key))
	c := &call[T]{lane: ln, start: now}
	items := make([]T, 0, len(batch))
	for _, e := range batch {
		if e.dropped {
			continue
		}
		d := e.it.Deadline()
		if !e.it.Valid() {
			w.forgetLocked(e) // released or lost meanwhile
			continue
		}
		if d.After(c.deadline) {
			c.deadline = d
		}
		e.call = c
		c.batch = append(c.batch, e)
		items = append(items, e.it)
	}
	if len(items) == 0 {
		return nil
	}
	if limit.Before(c.deadline) {
		c.deadline = limit
	}
	ln.calls++
	w.running++
	var ctx context.Context
	var cancel context.CancelFunc
	if w.now == nil {
		ctx, cancel = context.WithDeadline(g.ctx, c.deadline)
	} else { // a deadline on the engine's clock, in real time from now
		ctx, cancel = context.WithTimeout(g.ctx, c.deadline.Sub(now))
	}
	go func() {
		defer cancel()
		c.errs = w.extend(ctx, items) // records every outcome on its item
		select {
		case g.finished <- c:
		case <-g.stop:
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.running--
		if w.running == 0 && w.drained != nil {
			close(w.drained)
			w.drained = nil
		}
		if w.idleLocked() {
			w.pokeLocked() // the scheduler may be idle now
		}
	}()
	return c
}

// abandonLocked stops waiting for c, whose deadline passed: its items are
// retried after the retry delay. The call keeps its lane's slot until it
// returns.
func (w *Engine[T]) abandonLocked(c *call[T], now time.Time) {
	c.abandoned = true
	for _, e := range c.batch {
		if e.call != c {
			continue
		}
		e.call = nil
		w.rescheduleLocked(e, errTimedOut, c, now)
	}
}

// errTimedOut stands for the outcome of a call the engine stopped waiting
// for.
var errTimedOut = errors.New("renewal call timed out")

// finishLocked records the outcome of a call that returned.
func (w *Engine[T]) finishLocked(c *call[T]) {
	ln := c.lane
	ln.calls--
	now := w.clock()
	for i, e := range c.batch {
		err := c.errs[i]
		switch {
		case e.call == c: // still waited for
			e.call = nil
			w.rescheduleLocked(e, err, c, now)
		case c.abandoned && e.index >= 0 && e.retry && !e.dropped:
			// A late answer for an item that waits for its retry: the
			// outcome is already recorded on the item; a success makes the
			// retry unnecessary, a verdict makes it pointless.
			if err == nil || w.notHeld(err) || !e.it.Valid() {
				heap.Remove(&w.due, e.index)
				w.rescheduleLocked(e, err, c, now)
			}
		}
	}
	// A lane whose items waited for this slot is still in the scheduler's
	// list: its next pass starts their call.
	w.pruneLaneLocked(ln)
}

// rescheduleLocked puts e back in the heap after call c ended with err for
// it, or forgets it if its item is gone.
func (w *Engine[T]) rescheduleLocked(e *entry[T], err error, c *call[T], now time.Time) {
	switch {
	case e.dropped:
		return
	case w.notHeld(err) || !e.it.Valid():
		// Released, lost, or found not held (Extend marked it lost).
		w.forgetLocked(e)
		return
	case err == nil:
		e.interval = w.interval(e.it)
		e.due, e.retry = w.nextDue(e.it, c.start, e.interval), false
	default:
		// Undecided (a node down, a timeout, an error reply): try again,
		// not before the retry delay, while the item is valid; its own
		// deadline settles it otherwise.
		e.interval = w.interval(e.it)
		e.due, e.retry = now.Add(RetryDelay(e.interval)), true
	}
	heap.Push(&w.due, e)
}

// dueHeap orders entries by the moment they may be taken.
type dueHeap[T Item] []*entry[T]

// Len, Less, Swap, Push and Pop implement container/heap.
func (h dueHeap[T]) Len() int           { return len(h) }
func (h dueHeap[T]) Less(i, j int) bool { return h[i].takeAt().Before(h[j].takeAt()) }
func (h dueHeap[T]) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}

func (h *dueHeap[T]) Push(x any) {
	e := x.(*entry[T])
	e.index = len(*h)
	*h = append(*h, e)
}

func (h *dueHeap[T]) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.index = -1
	return e
}
