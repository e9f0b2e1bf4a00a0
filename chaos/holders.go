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
		actx, cancel := context.WithTimeout(ctx, attempt)
		lk, err := locker.Lock(actx, w.Key, w.LockOpts...)
		cancel()
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
	stop := make(chan struct{})
	var (
		mu     sync.Mutex
		grants = map[string]int{}
		wg     sync.WaitGroup
	)
	for name, l := range lockers {
		wg.Go(func() {
			n := w.Run(ctx, name, l, stop)
			mu.Lock()
			grants[name] = n
			mu.Unlock()
		})
	}
	sleep(ctx, d)
	close(stop)
	wg.Wait()
	return grants
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
