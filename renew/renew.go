package renew

import (
	"container/heap"
	"context"
	"errors"
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
	// DefaultWorkers is how many batches may be in flight at once.
	DefaultWorkers = 2
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

// WithWorkers sets how many batches may be in flight at once (each batch is
// one round trip per node). Default DefaultWorkers (2). Must be at least 1.
func WithWorkers(n int) Option {
	return optionFunc(func(w *Watchdog) error {
		if n < 1 {
			return redlease.Invalid("renew workers %d: must be at least 1", n)
		}
		w.workers = n
		return nil
	})
}

// Watchdog keeps any number of locks alive with a fixed number of
// goroutines: one scheduler and a few workers. It is safe for concurrent
// use; share one per process. Stop it when done.
type Watchdog struct {
	fraction float64
	workers  int

	mu      sync.Mutex
	due     dueHeap // locks waiting for their next extension, earliest first
	entries map[*redlease.Lock]*entry
	wake    chan struct{} // a lock was added earlier than the scheduler's wait
	batches chan []*entry
	stop    chan struct{}
	stopped bool
	wg      sync.WaitGroup
}

var _ redlease.Keeper = (*Watchdog)(nil)

type entry struct {
	lk       *redlease.Lock
	interval time.Duration
	due      time.Time
	index    int  // in the heap; -1 while in a batch
	dropped  bool // stop was called: do not reschedule
}

// New starts a Watchdog. Invalid options are reported, never defaulted.
func New(opts ...Option) (*Watchdog, error) {
	w := &Watchdog{
		fraction: DefaultFraction,
		workers:  DefaultWorkers,
		entries:  map[*redlease.Lock]*entry{},
		wake:     make(chan struct{}, 1),
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
	w.batches = make(chan []*entry)
	w.wg.Go(w.schedule)
	for range w.workers {
		w.wg.Go(w.work)
	}
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
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return noop
	}
	if _, ok := w.entries[lk]; ok {
		return noop
	}
	// The first extension is due interval after the grant: Until is
	// start+ttl−drift, so the grant happened about ttl before Until.
	e := &entry{lk: lk, interval: interval, due: lk.Until().Add(-lk.TTL()).Add(interval)}
	w.entries[lk] = e
	heap.Push(&w.due, e)
	if e.index == 0 {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	var once sync.Once
	return func() { once.Do(func() { w.drop(e) }) }
}

// Len returns how many locks the Watchdog keeps.
func (w *Watchdog) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.entries)
}

// Stop stops every goroutine of the Watchdog and waits for them, including a
// batch in flight. Kept locks are no longer extended; they stay held until
// they expire or are released.
func (w *Watchdog) Stop() {
	w.mu.Lock()
	if !w.stopped {
		w.stopped = true
		close(w.stop)
	}
	w.mu.Unlock()
	w.wg.Wait()
}

func (w *Watchdog) drop(e *entry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e.dropped = true
	delete(w.entries, e.lk)
	if e.index >= 0 {
		heap.Remove(&w.due, e.index)
	}
}

// schedule waits for the earliest due lock and hands a batch to the workers:
// every lock due within a quarter of its interval from now. Renewing a few
// early costs nothing, and since a batch's locks are all extended at once
// they stay due together: after a round or two, locks taken at scattered
// moments fall into a few batches per interval.
func (w *Watchdog) schedule() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		w.mu.Lock()
		var batch []*entry
		wait := time.Hour
		now := time.Now()
		for w.due.Len() > 0 {
			e := w.due[0]
			if e.due.After(now.Add(e.interval / 4)) {
				if batch == nil {
					wait = e.due.Sub(now)
				}
				break
			}
			heap.Pop(&w.due)
			batch = append(batch, e)
		}
		w.mu.Unlock()

		if batch != nil {
			select {
			case w.batches <- batch:
			case <-w.stop:
				return
			}
			continue
		}
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-w.wake:
		case <-w.stop:
			return
		}
	}
}

// work extends batches: one redlease.ExtendAll call each, which costs one
// round trip per node for strategies that batch.
func (w *Watchdog) work() {
	for {
		select {
		case batch := <-w.batches:
			w.extend(batch)
		case <-w.stop:
			return
		}
	}
}

func (w *Watchdog) extend(batch []*entry) {
	locks := make([]*redlease.Lock, len(batch))
	// Wait for answers only while the first of these locks is still valid:
	// past that it is lost anyway, and later answers come too late for it.
	deadline := time.Now().Add(time.Hour)
	for i, e := range batch {
		locks[i] = e.lk
		if d := e.lk.Until(); d.Before(deadline) {
			deadline = d
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	start := time.Now()
	errs := redlease.ExtendAll(ctx, locks)
	cancel()

	w.mu.Lock()
	defer w.mu.Unlock()
	for i, e := range batch {
		err := errs[i]
		switch {
		case e.dropped:
			continue
		case errors.Is(err, redlease.ErrNotHeld) || !e.lk.Valid():
			// Released, lost, or found not held (ExtendAll marked it lost).
			delete(w.entries, e.lk)
			continue
		case err == nil:
			e.due = start.Add(e.interval)
		default:
			// Undecided (a node down, a timeout): try again soon, while the
			// lock is valid; its own deadline settles it otherwise.
			e.due = time.Now().Add(min(e.interval/4, 250*time.Millisecond))
		}
		heap.Push(&w.due, e)
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// dueHeap orders entries by due time.
type dueHeap []*entry

// Len, Less, Swap, Push and Pop implement container/heap.
func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
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
