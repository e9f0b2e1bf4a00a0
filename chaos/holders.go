package chaos

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redlease/redlease"
)

// Workload is what every holder of a scenario does: take key, write once to
// the fenced register with the grant's fence (the register accepts one write
// per fence), work for Hold or until the lock is lost, release. Every grant becomes a Hold on the
// recorder, every write a register operation.
type Workload struct {
	Rec      *Recorder
	Reg      *Register
	Key      string
	Hold     time.Duration // time spent in the critical section
	Attempt  time.Duration // bound on one Lock call (default 300 ms)
	Pause    time.Duration // wait after a failed attempt (default 5 ms)
	LockOpts []redlease.LockOption

	value atomic.Int64

	mu     sync.Mutex
	phase  string
	gen    int                         // bumped by every Phase call
	counts map[string]map[string]Count // phase → holder → its Lock calls there
	ended  chan struct{}               // cap 1: a Lock call ended (WaitFor)
}

// Count is what one holder's Lock calls came to within one phase
// (Workload.Phase): Attempts ended, Grants among them. A Lock call counts
// toward a phase only if it started and returned within it; one that
// spanned a change of phase counts toward none.
type Count struct{ Attempts, Grants int }

// Phase names the phase that Lock calls starting from now on belong to
// (see Count). The workload starts in phase "".
func (w *Workload) Phase(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.phase = name
	w.gen++
}

// Counts sums holders' Counts in phase.
func (w *Workload) Counts(phase string, holders ...string) Count {
	w.mu.Lock()
	defer w.mu.Unlock()
	var c Count
	for _, h := range holders {
		c.Attempts += w.counts[phase][h].Attempts
		c.Grants += w.counts[phase][h].Grants
	}
	return c
}

// begin returns the generation of the phase a Lock call starts in.
func (w *Workload) begin() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gen
}

// count records a Lock call that started in generation gen, if the phase
// has not changed since, and tells WaitFor.
func (w *Workload) count(holder string, gen int, granted bool) {
	w.mu.Lock()
	if gen == w.gen {
		if w.counts == nil {
			w.counts = map[string]map[string]Count{}
		}
		if w.counts[w.phase] == nil {
			w.counts[w.phase] = map[string]Count{}
		}
		c := w.counts[w.phase][holder]
		c.Attempts++
		if granted {
			c.Grants++
		}
		w.counts[w.phase][holder] = c
	}
	ended := w.endedLocked()
	w.mu.Unlock()
	select {
	case ended <- struct{}{}:
	default:
	}
}

func (w *Workload) endedLocked() chan struct{} {
	if w.ended == nil {
		w.ended = make(chan struct{}, 1)
	}
	return w.ended
}

// WaitFor waits until cond holds, checking it whenever a Lock call ends
// and every 10 ms, or until ctx ends, and returns cond's last answer. cond
// bounds the wait (it should give up on a guard of its own).
func (w *Workload) WaitFor(ctx context.Context, cond func() bool) bool {
	w.mu.Lock()
	ended := w.endedLocked()
	w.mu.Unlock()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ended:
		case <-tick.C:
		case <-ctx.Done():
			return cond()
		}
	}
	return true
}

// Run makes holder take turns on w.Key through locker until stop closes or
// ctx ends (both bound the loop), and returns how many grants it had.
func (w *Workload) Run(ctx context.Context, holder string, locker *redlease.Locker, stop <-chan struct{}) int {
	attempt := w.Attempt
	if attempt == 0 {
		attempt = 300 * time.Millisecond
	}
	pause := w.Pause
	if pause == 0 {
		pause = 5 * time.Millisecond
	}
	grants := 0
	for {
		select {
		case <-stop:
			return grants
		case <-ctx.Done():
			return grants
		default:
		}
		gen := w.begin()
		actx, cancel := context.WithTimeout(ctx, attempt)
		lk, err := locker.Lock(actx, w.Key, w.LockOpts...)
		cancel()
		w.count(holder, gen, err == nil)
		if err != nil {
			w.Rec.Failure(holder, err)
			sleep(ctx, pause)
			continue
		}
		grants++
		w.hold(ctx, holder, lk)
	}
}

// hold is one turn in the critical section.
func (w *Workload) hold(ctx context.Context, holder string, lk *redlease.Lock) {
	from := w.Rec.Now()
	lostAt := time.Duration(-1)
	_, _ = w.Reg.Write(ctx, holder, lk.Fence(), w.value.Add(1))
	t := time.NewTimer(w.Hold)
	select {
	case <-lk.Lost():
		lostAt = w.Rec.Now()
	case <-t.C:
	case <-ctx.Done():
	}
	t.Stop()
	if lostAt < 0 {
		select {
		case <-lk.Lost(): // lost just as the hold ended
			lostAt = w.Rec.Now()
		default:
		}
	}
	// The hold ends when the release is sent (Lost closes then too, which
	// is not a loss).
	releasedAt := w.Rec.Now()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	_ = lk.Release(rctx)
	cancel()
	until := w.Rec.At(lk.Until())
	to := min(until, releasedAt)
	if lostAt >= 0 {
		to = min(to, lostAt)
	}
	w.Rec.AddHold(Hold{Holder: holder, Fence: lk.Fence(), From: from, To: to, Until: until, LostAt: lostAt})
}

// RunAll runs one goroutine per holder (holder names as keys, lockers as
// values) for d, and returns the grants per holder.
func (w *Workload) RunAll(ctx context.Context, lockers map[string]*redlease.Locker, d time.Duration) map[string]int {
	stop := w.Start(ctx, lockers)
	sleep(ctx, d)
	return stop()
}

// Start runs one goroutine per holder (holder names as keys, lockers as
// values) until the returned stop is called (or ctx ends); stop waits for
// them and returns the grants per holder.
func (w *Workload) Start(ctx context.Context, lockers map[string]*redlease.Locker) (stop func() map[string]int) {
	done := make(chan struct{})
	var (
		mu     sync.Mutex
		grants = map[string]int{}
		wg     sync.WaitGroup
	)
	for name, l := range lockers {
		wg.Go(func() {
			n := w.Run(ctx, name, l, done)
			mu.Lock()
			grants[name] = n
			mu.Unlock()
		})
	}
	return func() map[string]int {
		close(done)
		wg.Wait()
		return grants
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
