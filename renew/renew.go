package renew

import (
	"container/heap"
	"context"
	"errors"
	"reflect"
	"sync"
	"time"

	"github.com/redlease/redlease"
)

// Defaults, in one place.
const (
	// DefaultFraction: a lock is extended when this share of its TTL has
	// passed since its last extension (ttl/3), leaving two more chances
	// before it would expire.
	DefaultFraction = 1.0 / 3
	// DefaultTimeout is the renewal timeout: how long the Watchdog waits
	// for one strategy's renewal call before it retries, and the longest
	// Stop waits for calls in flight.
	DefaultTimeout = time.Second
	// DefaultMaxCalls is how many renewal calls may be in flight per
	// strategy, counting calls the Watchdog stopped waiting for that have
	// not returned yet.
	DefaultMaxCalls = 2
	// MaxRetryDelay bounds the wait before a renewal that failed without a
	// verdict (a node down, a timeout, an error reply) is tried again: the
	// delay is a quarter of the lock's renewal interval, at most this.
	MaxRetryDelay = 250 * time.Millisecond

	// DefaultWorkers is the former name of DefaultMaxCalls.
	//
	// Deprecated: use DefaultMaxCalls.
	DefaultWorkers = DefaultMaxCalls
)

// Option configures a Watchdog.
type Option interface {
	apply(*Watchdog) error
}

type optionFunc func(*Watchdog) error

func (f optionFunc) apply(w *Watchdog) error { return f(w) }

// WithFraction sets when a lock is extended: once fraction of its TTL has
// passed since the last extension. Default DefaultFraction (1/3). Must be in
// (0, 1); above 1/2 a single failed round leaves no time for a retry.
func WithFraction(fraction float64) Option {
	return optionFunc(func(w *Watchdog) error {
		if !(fraction > 0 && fraction < 1) {
			return redlease.Invalid("renew fraction %v: must be in (0, 1)", fraction)
		}
		w.fraction = fraction
		return nil
	})
}

// WithTimeout sets the renewal timeout: the longest the Watchdog waits for
// one strategy's renewal call (never past the earliest Deadline of the
// call's locks) before it counts the call as failed and schedules a retry,
// and the longest Stop waits for calls in flight. Default DefaultTimeout
// (1 s). Must be at least a millisecond. Keep it above the strategy's own
// bound on a call (quorum's node timeout, failover's WAIT timeout) and
// below the renewal interval, so that a timed-out renewal leaves time for
// retries.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(w *Watchdog) error {
		if d < time.Millisecond {
			return redlease.Invalid("renew timeout %v: must be at least 1ms", d)
		}
		w.timeout = d
		return nil
	})
}

// WithMaxCalls sets how many renewal calls may be in flight for one
// strategy at a time, counting calls the Watchdog stopped waiting for
// (past their deadline) that the strategy has not returned yet: a client
// that ignores its context keeps such a call, and a goroutine, until its
// own timeouts end it. Locks of a strategy at its limit wait for a call to
// return; other strategies are not affected. Default DefaultMaxCalls (2).
// Must be at least 1.
func WithMaxCalls(n int) Option {
	return optionFunc(func(w *Watchdog) error {
		if n < 1 {
			return redlease.Invalid("renew max calls %d: must be at least 1", n)
		}
		w.maxCalls = n
		return nil
	})
}

// WithWorkers is the former name of WithMaxCalls. It used to bound the
// batches in flight for all strategies together; the bound is now per
// strategy.
//
// Deprecated: use WithMaxCalls.
func WithWorkers(n int) Option { return WithMaxCalls(n) }

// Watchdog keeps any number of locks alive with one scheduling goroutine
// and, per strategy, at most a few renewal calls in flight (one goroutine
// each). It is safe for concurrent use; share one per process. Stop it when
// done.
type Watchdog struct {
	fraction float64
	timeout  time.Duration
	maxCalls int

	ctx    context.Context // parent of every call; cancelled by Stop
	cancel context.CancelFunc

	mu       sync.Mutex
	due      dueHeap // locks waiting for their next extension, earliest first
	entries  map[*redlease.Lock]*entry
	lanes    map[any]*lane
	waiting  []*call       // calls in flight whose deadline has not passed
	running  int           // call goroutines not yet returned
	drained  chan struct{} // made by Stop; closed when running reaches 0
	wake     chan struct{} // the scheduler should look again
	finished chan *call    // calls that returned, to the scheduler
	stop     chan struct{}
	stopped  bool
	loop     sync.WaitGroup // the scheduler
}

var _ redlease.Keeper = (*Watchdog)(nil)

// entry is one kept lock.
type entry struct {
	lk       *redlease.Lock
	lane     *lane
	interval time.Duration
	due      time.Time
	retry    bool  // due is a retry's not-before time: never taken early
	index    int   // in the heap; -1 while pending in its lane or in a call
	call     *call // the call it is in, while the Watchdog waits for it
	dropped  bool  // stop was called: do not reschedule
}

// lane is the renewal state of one strategy.
type lane struct {
	key     any
	kept    int      // entries of this strategy
	calls   int      // its calls not yet returned, waited for or not
	pending []*entry // due, waiting for a call slot
	queued  bool     // in the scheduler's list of lanes with pending entries
}

// call is one redlease.ExtendAll over one lane's due locks.
type call struct {
	lane      *lane
	batch     []*entry
	start     time.Time
	deadline  time.Time
	errs      []error // written by the call's goroutine before it reports
	abandoned bool    // its deadline passed first: its entries were rescheduled
}

// New starts a Watchdog. Invalid options are reported, never defaulted.
func New(opts ...Option) (*Watchdog, error) {
	w := &Watchdog{
		fraction: DefaultFraction,
		timeout:  DefaultTimeout,
		maxCalls: DefaultMaxCalls,
		entries:  map[*redlease.Lock]*entry{},
		lanes:    map[any]*lane{},
		wake:     make(chan struct{}, 1),
		finished: make(chan *call),
		stop:     make(chan struct{}),
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(w); err != nil {
			return nil, err
		}
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	w.loop.Go(w.schedule)
	return w, nil
}

// Keep extends lk every fraction of its TTL until stop is called, lk is
// released, or lk is lost (a renewal that finds it no longer held marks it
// lost; one that cannot get an answer in time leaves it to expire, and its
// Lost closes a loss margin before its Until). Keeping a lock that is
// already kept, or keeping after Stop, does nothing.
func (w *Watchdog) Keep(lk *redlease.Lock) (stop func()) {
	noop := func() {}
	if lk == nil || !lk.Valid() {
		return noop
	}
	interval := time.Duration(float64(lk.TTL()) * w.fraction)
	key := laneKey(lk)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return noop
	}
	if _, ok := w.entries[lk]; ok {
		return noop
	}
	ln := w.lanes[key]
	if ln == nil {
		ln = &lane{key: key}
		w.lanes[key] = ln
	}
	ln.kept++
	// The first extension is due interval after the grant: Until is
	// start+ttl−drift, so the grant happened about ttl before Until.
	e := &entry{lk: lk, lane: ln, interval: interval, due: lk.Until().Add(-lk.TTL()).Add(interval)}
	w.entries[lk] = e
	heap.Push(&w.due, e)
	if e.index == 0 {
		w.poke()
	}
	var once sync.Once
	return func() { once.Do(func() { w.drop(e) }) }
}

// laneKey is what groups locks into lanes: their strategy, or the lock
// itself for a strategy that cannot be a map key.
func laneKey(lk *redlease.Lock) any {
	s := lk.Strategy()
	if s == nil || reflect.TypeOf(s).Kind() == reflect.Pointer || reflect.ValueOf(s).Comparable() {
		return s
	}
	return lk
}

// Len returns how many locks the Watchdog keeps. A lock that expired while
// its strategy had no call slot free still counts until the Watchdog gets
// to it.
func (w *Watchdog) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.entries)
}

// Stop stops the Watchdog: no lock is extended any more, and the calls in
// flight are cancelled. It waits for the scheduler and for those calls,
// but for the calls no longer than the renewal timeout (WithTimeout): a
// call whose client ignores its context (go-redis without
// ContextTimeoutEnabled, on a hung node) is left to end on its own, at the
// client's own timeout or when the client is closed, and at most
// WithMaxCalls of them per strategy exist. Kept locks stay held until they
// expire or are released. Calling Stop again waits the same way.
func (w *Watchdog) Stop() {
	w.mu.Lock()
	if !w.stopped {
		w.stopped = true
		close(w.stop)
		w.cancel()
	}
	w.mu.Unlock()
	w.loop.Wait()

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

func (w *Watchdog) drop(e *entry) {
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
}

// forgetLocked removes e from the kept locks (its lane goes once it has
// neither locks nor calls). e must not be put back in the heap.
func (w *Watchdog) forgetLocked(e *entry) {
	if w.entries[e.lk] == e {
		delete(w.entries, e.lk)
		e.lane.kept--
		w.pruneLaneLocked(e.lane)
	}
}

func (w *Watchdog) pruneLaneLocked(ln *lane) {
	if ln.kept == 0 && ln.calls == 0 && w.lanes[ln.key] == ln {
		delete(w.lanes, ln.key)
	}
}

// poke wakes the scheduler.
func (w *Watchdog) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// retryDelay is how long a renewal that failed without a verdict waits.
func retryDelay(interval time.Duration) time.Duration {
	return min(interval/4, MaxRetryDelay)
}

// schedule is the Watchdog's one long-lived goroutine. It moves locks that
// fall due to their strategy's lane, starts a call for each lane with due
// locks and a free call slot, gives up waiting on calls whose deadline
// passed, and records the outcome of calls that return.
//
// A lock is due once its interval has passed since its last extension and
// is taken a quarter of its interval before that; every lock due within a
// quarter of its interval after the first goes along, so that locks taken
// at scattered moments fall into a few batches per interval. A retry is
// never sent before its time.
func (w *Watchdog) schedule() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var ready []*lane // lanes with pending entries
	for {
		w.mu.Lock()
		now := time.Now()
		// Once one lock may be taken, every lock that may be taken within
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
		// Start a call on every lane that has due locks and a free slot.
		kept := ready[:0]
		for _, ln := range ready {
			if ln.calls >= w.maxCalls {
				kept = append(kept, ln)
				continue
			}
			ln.queued = false
			if c := w.startLocked(ln, now); c != nil {
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
		case <-w.wake:
		case c := <-w.finished:
			w.mu.Lock()
			w.finishLocked(c)
			w.mu.Unlock()
		case <-w.stop:
			return
		}
	}
}

// eligible reports whether e may go into a batch now.
func (e *entry) eligible(now time.Time) bool { return !now.Before(e.takeAt()) }

// takeAt is the earliest moment e goes into a batch: a quarter of its
// interval before it is due, so that it can join others, but a retry not
// before its time.
func (e *entry) takeAt() time.Time {
	if e.retry {
		return e.due
	}
	return e.due.Add(-e.interval / 4)
}

// startLocked starts one call with ln's pending locks, under a deadline of
// the renewal timeout, narrowed to the earliest Deadline of its locks. It
// returns nil if none of them is still worth extending.
func (w *Watchdog) startLocked(ln *lane, now time.Time) *call {
	batch := ln.pending
	ln.pending = nil
	c := &call{lane: ln, start: now, deadline: now.Add(w.timeout)}
	locks := make([]*redlease.Lock, 0, len(batch))
	for _, e := range batch {
		if e.dropped {
			continue
		}
		d := e.lk.Deadline()
		if !e.lk.Valid() {
			w.forgetLocked(e) // released or lost meanwhile
			continue
		}
		if d.Before(c.deadline) {
			c.deadline = d
		}
		e.call = c
		c.batch = append(c.batch, e)
		locks = append(locks, e.lk)
	}
	if len(locks) == 0 {
		return nil
	}
	ln.calls++
	w.running++
	ctx, cancel := context.WithDeadline(w.ctx, c.deadline)
	go func() {
		defer cancel()
		c.errs = redlease.ExtendAll(ctx, locks) // records every outcome on its lock
		select {
		case w.finished <- c:
		case <-w.stop:
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.running--
		if w.running == 0 && w.drained != nil {
			close(w.drained)
			w.drained = nil
		}
	}()
	return c
}

// abandonLocked stops waiting for c, whose deadline passed: its locks are
// retried after the retry delay. The call keeps its lane's slot until it
// returns.
func (w *Watchdog) abandonLocked(c *call, now time.Time) {
	c.abandoned = true
	for _, e := range c.batch {
		if e.call != c {
			continue
		}
		e.call = nil
		w.rescheduleLocked(e, errTimedOut, c, now)
	}
}

// errTimedOut stands for the outcome of a call the Watchdog stopped
// waiting for.
var errTimedOut = errors.New("renewal call timed out")

// finishLocked records the outcome of a call that returned.
func (w *Watchdog) finishLocked(c *call) {
	ln := c.lane
	ln.calls--
	now := time.Now()
	for i, e := range c.batch {
		err := c.errs[i]
		switch {
		case e.call == c: // still waited for
			e.call = nil
			w.rescheduleLocked(e, err, c, now)
		case c.abandoned && e.index >= 0 && e.retry && !e.dropped:
			// A late answer for a lock that waits for its retry: the
			// outcome is already recorded on the lock; a success makes the
			// retry unnecessary, a verdict makes it pointless.
			if err == nil || errors.Is(err, redlease.ErrNotHeld) || !e.lk.Valid() {
				heap.Remove(&w.due, e.index)
				w.rescheduleLocked(e, err, c, now)
			}
		}
	}
	// A lane whose locks waited for this slot is still in the scheduler's
	// list: its next pass starts their call.
	w.pruneLaneLocked(ln)
}

// rescheduleLocked puts e back in the heap after call c ended with err for
// it, or forgets it if its lock is gone.
func (w *Watchdog) rescheduleLocked(e *entry, err error, c *call, now time.Time) {
	switch {
	case e.dropped:
		return
	case errors.Is(err, redlease.ErrNotHeld) || !e.lk.Valid():
		// Released, lost, or found not held (ExtendAll marked it lost).
		w.forgetLocked(e)
		return
	case err == nil:
		e.due, e.retry = c.start.Add(e.interval), false
	default:
		// Undecided (a node down, a timeout, an error reply): try again,
		// not before the retry delay, while the lock is valid; its own
		// deadline settles it otherwise.
		e.due, e.retry = now.Add(retryDelay(e.interval)), true
	}
	heap.Push(&w.due, e)
}

// dueHeap orders entries by the moment they may be taken.
type dueHeap []*entry

// Len, Less, Swap, Push and Pop implement container/heap.
func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].takeAt().Before(h[j].takeAt()) }
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}

func (h *dueHeap) Push(x any) {
	e := x.(*entry)
	e.index = len(*h)
	*h = append(*h, e)
}

func (h *dueHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.index = -1
	return e
}
